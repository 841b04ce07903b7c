"""A ZooKeeper ensemble member for the multi-host harness
(``tests/harness/hosts.py``): ``QuorumPeerMain`` from pyspark's jars with
``server.N=addr:2888:3888`` lines for every member and its ``myid``, its
client port bound to its own address, optionally inside a network
namespace (``ip netns exec NS``).  Members are started with ``launch()``
(all of them) and then ``wait_until_serving()``: a member serves only once
a quorum has elected a leader.  The standalone server it builds on is the
product's (``appliance.bench.zk_server``: ``bkctl bench metadata``).
"""

from __future__ import annotations

from pathlib import Path

from appliance.bench.zk_server import MAIN_CLASS, ZooKeeperServer

# An ensemble member: fixed ports are fine, each member has an address of its own.
CLIENT_PORT = 2181
PEER_PORT = 2888
ELECTION_PORT = 3888
QUORUM_MAIN_CLASS = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
INIT_LIMIT_TICKS = 20  # a follower's first sync with the leader
SYNC_LIMIT_TICKS = 5  # a follower this far behind (or silent) is dropped


class EnsembleMember(ZooKeeperServer):
    """Member ``myid`` (1-based) of the ensemble whose members listen on
    ``addresses`` (member i on ``addresses[i - 1]``), run in ``netns`` if given."""

    def __init__(self, data_dir: str | Path, myid: int, addresses: list[str], *,
                 netns: str | None = None, **kwargs):
        super().__init__(data_dir, **kwargs)
        if not 1 <= myid <= len(addresses):
            raise ValueError(f"myid must be in 1..{len(addresses)}, got {myid}")
        self.myid, self.addresses, self.netns = myid, list(addresses), netns
        self.address = self.addresses[myid - 1]
        self.port = CLIENT_PORT

    @property
    def hosts(self) -> str:
        return f"{self.address}:{self.port}"

    def _config_text(self) -> str:
        servers = "".join(f"server.{i}={addr}:{PEER_PORT}:{ELECTION_PORT}\n"
                          for i, addr in enumerate(self.addresses, start=1))
        return (f"tickTime={self.tick_time_ms}\ninitLimit={INIT_LIMIT_TICKS}\n"
                f"syncLimit={SYNC_LIMIT_TICKS}\ndataDir={self.data_dir / 'data'}\n"
                f"clientPort={self.port}\nclientPortAddress={self.address}\n"
                "admin.enableServer=false\nmaxClientCnxns=0\n" + servers)

    def _command(self, cfg: Path) -> list[str]:
        cmd = super()._command(cfg)
        cmd[cmd.index(MAIN_CLASS)] = QUORUM_MAIN_CLASS
        return ["ip", "netns", "exec", self.netns, *cmd] if self.netns else cmd

    def launch(self) -> EnsembleMember:
        """Start the JVM without waiting (the others must start too)."""
        (self.data_dir / "data").mkdir(parents=True, exist_ok=True)
        (self.data_dir / "data" / "myid").write_text(f"{self.myid}\n")
        self._spawn()
        return self

    def start(self, timeout_s: float = 60.0, *, port: int | None = None) -> EnsembleMember:
        """Launch and wait until serving (which needs a quorum of members up)."""
        self.launch()
        self.wait_until_serving(timeout_s)
        return self

    def wait_until_serving(self, timeout_s: float = 60.0) -> None:
        self._wait_until_serving(timeout_s)

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

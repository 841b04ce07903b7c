"""The rules between keys of a loaded config: distinct bookie ids,
endpoints and directories (also nested or symlinked ones), one rack per
host, quorums against the number of bookies, and every client limit within
the server limit it must fit (checked again by ``tests/test_limits.py`` for
the defaults).  Each broken rule is one ``Refusal``."""

from __future__ import annotations

import os
from pathlib import Path

from appliance.config.refusal import Refusal
from appliance.config.schema import ApplianceConfig, BookieConfig, tcp_port


def check_distinct(bookies: tuple[BookieConfig, ...]) -> None:
    seen_ids: dict[str, int] = {}
    seen_endpoints: dict[str, int] = {}
    racks: dict[str, tuple[str, int]] = {}  # one host sits in one rack (placement)
    dirs: list[tuple[str, Path]] = []
    for i, b in enumerate(bookies):
        rack, first = racks.setdefault(b.host, (b.rack, i))
        if rack != b.rack:
            raise Refusal(f"bookies[{i}].rack", f"host {b.host!r} is in rack {rack!r} at "
                           f"bookies[{first}]", "give every bookie of one host the same rack")
        if b.id in seen_ids:
            raise Refusal(f"bookies[{i}].id", f"{b.id!r} is also bookies[{seen_ids[b.id]}]",
                           "give every bookie its own id")
        seen_ids[b.id] = i
        if b.endpoint in seen_endpoints:
            raise Refusal(f"bookies[{i}].endpoint", f"{b.endpoint} is also used by "
                           f"bookies[{seen_endpoints[b.endpoint]}]",
                           "give every bookie its own endpoint")
        seen_endpoints[b.endpoint] = i
        for name in ("journal_dir", "ledger_dir"):
            key, real = f"bookies[{i}].{name}", Path(os.path.realpath(getattr(b, name)))
            for other_key, other in dirs:
                if real == other or real in other.parents or other in real.parents:
                    raise Refusal(key, f"{getattr(b, name)} overlaps {other_key} ({other})",
                                   "give every journal_dir and ledger_dir its own folder, "
                                   "neither inside the other")
            dirs.append((key, real))


def check_cross(c: ApplianceConfig) -> None:
    cl, n = c.client, len(c.bookies)
    # With zk:// metadata other hosts' bookies join the ensembles too: the
    # count is checked when a ledger is created (NotEnoughBookiesError).
    if cl.ensemble > n and not c.metadata.uri.startswith("zk://"):
        raise Refusal("client.ensemble", f"{cl.ensemble} is more than the {n} configured "
                       "bookies", "lower client.ensemble (and write_quorum, ack_quorum) or "
                       "add [[bookies]]")
    if cl.write_quorum > cl.ensemble:
        raise Refusal("client.write_quorum", f"{cl.write_quorum} is above ensemble "
                       f"({cl.ensemble})", "keep ensemble >= write_quorum >= ack_quorum")
    if cl.ack_quorum > cl.write_quorum:
        raise Refusal("client.ack_quorum", f"{cl.ack_quorum} is above write_quorum "
                       f"({cl.write_quorum})", "keep ensemble >= write_quorum >= ack_quorum")
    pairs = [
        ("client.add_batch_entries_max", cl.add_batch_entries_max,
         "server.batch_entries_max", c.server.batch_entries_max),
        ("client.read_batch_entries_max", cl.read_batch_entries_max,
         "server.batch_entries_max", c.server.batch_entries_max),
        ("client.add_batch_bytes_max", cl.add_batch_bytes_max,
         "server.batch_bytes_max", c.server.batch_bytes_max),
        ("storage.entry_bytes_max", c.storage.entry_bytes_max,
         "server.batch_bytes_max", c.server.batch_bytes_max),
        ("client.reconnect_ivl_ms", cl.reconnect_ivl_ms,
         "client.reconnect_ivl_max_ms", cl.reconnect_ivl_max_ms),
        ("server.disk_usage_resume", c.server.disk_usage_resume,
         "server.disk_usage_max", c.server.disk_usage_max),
        ("supervisor.restart_backoff_min_ms", c.supervisor.restart_backoff_min_ms,
         "supervisor.restart_backoff_max_ms", c.supervisor.restart_backoff_max_ms),
    ]
    for key, value, limit_key, limit in pairs:
        if value > limit:
            raise Refusal(key, f"{value} is above {limit_key} ({limit})",
                           f"lower {key} or raise {limit_key}")
    check_log_server_ports(c)
    if c.security.curve and not c.security.key_file:
        raise Refusal("security.key_file", "required when curve = true",
                       'run `bkctl keys generate NAME` and set key_file = "NAME.key_secret"')


def check_log_server_ports(c: ApplianceConfig) -> None:
    """With tcp bookies, the log servers' tcp ports (``[log] port_base``)
    must be real ports and none a bookie's."""
    ports = c.log_server_ports()
    if not ports:
        return
    if ports[-1] > 65535:
        raise Refusal("log.port_base", f"log server ports {ports[0]}..{ports[-1]} go past "
                       "65535", "set log.port_base to a free range of [log] servers ports")
    taken = {tcp_port(b.endpoint): b.id for b in c.bookies if b.endpoint.startswith("tcp://")}
    for port in ports:
        if port in taken:
            raise Refusal("log.port_base", f"log server port {port} is bookie {taken[port]}'s",
                           "set log.port_base to a range no bookie uses")

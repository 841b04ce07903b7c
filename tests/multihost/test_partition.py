"""One host partitioned (its veth down: nothing in or out) during writes.

* A writer on the client namespace whose ensemble names a host1 bookie
  keeps going: its ledger moves to a fragment without host1's bookies
  within the add timeout (plus the metadata write) and adds continue.
* A writer running ON host1 is fenced by a recovery from the client
  namespace: it gets no acknowledgement past the recovered end, and its
  adds fail.  When the cut split an add (one other bookie has it), that
  recovery refuses to guess while host1 is away, names the entry, and the
  recovery after healing decides it.
* Autorecovery marks the ledgers naming host1's bookies under-replicated
  while it is gone and re-replicates them; after healing, host1's bookies
  register again by themselves and no mark is left.
* Nothing acknowledged is lost: every acked entry of both ledgers reads
  back, with its payload.

``test_split_add_waits_for_the_partition_to_heal`` makes that split on
purpose: host3 cut first, so the writer's next adds are acknowledged by
host1's and host2's bookies alone; then host1 cut and host3 healed.  The
last acknowledged entry is then on host2 (reachable), not on host3
(reachable, an explicit no) and unknown on host1: the recovery must refuse
until host1 is back, then keep it.
"""

from __future__ import annotations

import json
import time

from appliance.bench.launcher import wait_for
from tests.harness.hosts import CLIENT
from tests.multihost.conftest import ADD_TIMEOUT_MS, LOST_BOOKIE_DELAY_MS, SESSION_TIMEOUT_MS

INTERVAL_MS = "10"
ACKED_BEFORE = 20
# The fragment without host1 is written once an add to a host1 bookie timed
# out (add_retries_max = 0: no resend first; the writer checks timeouts every
# quarter of the add timeout), plus the metadata write: a ZooKeeper client
# connected to host1's member notices within 2/3 of its session timeout and
# reconnects to another member.  Slack for a loaded 2-core machine on top.
SLACK_S = 3.0
MOVE_BOUND_S = 1.25 * ADD_TIMEOUT_MS / 1000 + SESSION_TIMEOUT_MS / 1000 + SLACK_S
# The writer on host1 fails once its adds time out and its metadata retries
# run out, or once healed, on the fenced replies.
WRITER_FAILS_S = 60.0


def _without_host1(store, ledger: int):
    """The ledger's fragments once the last one names no host1 bookie."""
    from appliance.meta.ledgers import LedgerManager

    md, _version = LedgerManager(store).read_ledger(ledger)
    last = md.ensembles[-1][1]
    return None if any(b.startswith("host1-") for b in last) else md.ensembles


# host1's bookies leave the registry (session timeout), are declared lost
# (lost_bookie_delay_ms), their ledgers are marked and copied elsewhere.
REREPLICATED_S = SESSION_TIMEOUT_MS / 1000 + LOST_BOOKIE_DELAY_MS / 1000 + 60


def _underreplicated(hosts) -> list[dict]:
    done = hosts.bkctl("host2", "bookie", "underreplicated", "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _fragments_now(store, ledger: int):
    from appliance.meta.ledgers import LedgerManager

    return LedgerManager(store).read_ledger(ledger)[0].ensembles


def _off_host1(store, ledger: int) -> bool:
    """No fragment of the ledger names a host1 bookie any more."""
    from appliance.meta.ledgers import LedgerManager

    md, _version = LedgerManager(store).read_ledger(ledger)
    return not any(b.startswith("host1-") for _first, ens in md.ensembles for b in ens)


def _recover(hosts, ledger: int) -> dict | None:
    """Open ``ledger`` with recovery from the client namespace: its ``read``
    event, or None when the recovery refused to guess an entry.

    An add of the writer on host1 that was on the wire when the cut came can
    reach one of the two other bookies and not the other.  With host1's
    bookie (which has it) unreachable, that entry has one positive and one
    explicit negative: neither the ack quorum (2) that keeps it nor the
    coverage (2) that ends the ledger before it, and it may have been
    acknowledged (host1's bookie and the one that has it make an ack quorum).
    Recovery must then fail rather than guess (REFERENCES.md, BP-46); its
    error names the entry and its replies."""
    worker = hosts.worker(CLIENT, "read", "--ledger", str(ledger), "--recovery")
    wait_for(lambda: worker.of("read") or worker.of("error"), 60, interval_s=0.05,
             what="the recovery's outcome")
    assert worker.wait(30) == 0
    if worker.of("read"):
        return worker.of("read")[0]
    error = worker.of("error")[0]
    assert " undecided after " in error["message"] and \
        " 1 had it, 1 did not, 1 unknown " in error["message"], error
    print(f"recovery during the partition refused to guess: {error['message']}")
    return None


def test_partitioned_host(healthy):
    hosts = healthy
    outside = hosts.worker(CLIENT, "write", "--interval-ms", INTERVAL_MS,
                           "--ensemble-with", "host1-")
    inside = hosts.worker("host1", "write", "--interval-ms", INTERVAL_MS,
                          "--ensemble-at-most", "host1-=1")
    out_ledger = outside.wait_event("created", timeout_s=60)["ledger"]
    in_ledger = inside.wait_event("created", timeout_s=60)["ledger"]
    for w in (outside, inside):
        w.wait_event("acked", lambda e: e["entry"] >= ACKED_BEFORE)

    with hosts.open_store(avoid=("host1",)) as store:
        cut = time.monotonic()
        hosts.partition("host1")
        try:
            # the client's ledger leaves host1 and its adds go on
            try:
                moved = wait_for(lambda: _without_host1(store, out_ledger), MOVE_BOUND_S + 30,
                                 interval_s=0.1, what="a fragment without host1")
            except TimeoutError:
                outside.stop()  # its last event names the transport's counters
                raise AssertionError(f"ledger {out_ledger} kept host1: "
                                     f"{_fragments_now(store, out_ledger)}; writer "
                                     f"{outside.events[-2:]}") from None
            moved_s = time.monotonic() - cut
            outside.wait_event("acked", lambda e: e["t"] > cut + moved_s, timeout_s=30)
            print(f"host1 partitioned: fragment without it after {moved_s:.1f} s: {moved}")
            assert moved_s <= MOVE_BOUND_S, (moved_s, moved)
            # the writer on host1 is fenced by a recovery from the client namespace
            read_in = _recover(hosts, in_ledger)
            # autorecovery (on the majority side) re-replicates what host1 held:
            # the client ledger's first fragment (sealed, it named host1) moves off
            wait_for(lambda: _off_host1(store, out_ledger), REREPLICATED_S, interval_s=0.2,
                     what="autorecovery to copy the client ledger off host1")
        finally:
            hosts.heal("host1")
    hosts.wait_registered(hosts.bookie_ids("host1"), SESSION_TIMEOUT_MS / 1000 + 60)
    if read_in is None:  # the split entry: host1's bookie answers again, so it is decided
        read_in = _recover(hosts, in_ledger)
        assert read_in is not None, "recovery undecided with every bookie back"
    wait_for(lambda: _underreplicated(hosts) == [], REREPLICATED_S, interval_s=1.0,
             what="no ledger left under-replicated or marked")
    error = inside.wait_event("error", timeout_s=WRITER_FAILS_S)
    # fenced replies, or (partitioned until its metadata retries ran out) the
    # store it could not reach
    assert error["error"] in ("LedgerFencedError", "MetadataUnavailableError"), error
    assert inside.wait(30) == 0
    inside_acked = inside.acked()
    assert inside_acked == list(range(len(inside_acked)))
    assert inside_acked[-1] <= read_in["last"], "an ack past the recovered end"
    assert read_in["count"] == read_in["last"] + 1 and read_in["bad"] == []
    assert read_in["state"] == "CLOSED"

    outside.stop()
    closed = outside.wait_event("closed", timeout_s=5)
    acked = outside.acked()
    assert acked == list(range(len(acked))) and closed["last"] == acked[-1]
    read_out = hosts.worker("host1", "read", "--ledger", str(out_ledger)) \
        .wait_event("read", timeout_s=60)
    assert (read_out["last"], read_out["count"], read_out["bad"]) == (acked[-1], len(acked), [])


def test_split_add_waits_for_the_partition_to_heal(healthy):
    hosts = healthy
    # one bookie on each host, so that cutting host3 leaves an ack quorum
    inside = hosts.worker("host1", "write", "--interval-ms", INTERVAL_MS,
                          *(arg for h in hosts.names for arg in ("--ensemble-at-most",
                                                                 f"{h}-=1")))
    try:
        created = inside.wait_event("created", timeout_s=60)
        ledger = created["ledger"]
        assert sorted(b.split("-")[0] for b in created["ensemble"]) == sorted(hosts.names)
        inside.wait_event("acked", lambda e: e["entry"] >= ACKED_BEFORE)
        hosts.partition("host3")
        try:
            at_cut = max(inside.acked())
            # acknowledged by host1's and host2's bookies only (sent after the cut)
            inside.wait_event("acked", lambda e: e["entry"] >= at_cut + 3, timeout_s=30)
            hosts.partition("host1")
        finally:
            hosts.heal("host3")
        try:
            # the metadata's quorum is host2's and host3's members now
            for member in hosts.zk[1:]:
                member.wait_until_serving(60)
            assert _recover(hosts, ledger) is None, \
                "recovery kept or dropped an entry only host2 was known to have"
        finally:
            hosts.heal("host1")
        hosts.wait_registered(hosts.bookie_ids("host1"), SESSION_TIMEOUT_MS / 1000 + 60)
        read = _recover(hosts, ledger)
        assert read is not None, "recovery undecided with every bookie back"
        error = inside.wait_event("error", timeout_s=WRITER_FAILS_S)
        assert error["error"] in ("LedgerFencedError", "MetadataUnavailableError"), error
        acked = inside.acked()
        assert acked == list(range(len(acked))) and acked[-1] >= at_cut + 3
        # the entry host2 alone was known to have was acknowledged: it is kept
        assert acked[-1] <= read["last"], "an ack past the recovered end"
        assert read["count"] == read["last"] + 1 and read["bad"] == []
        assert read["state"] == "CLOSED"
        wait_for(lambda: _underreplicated(hosts) == [], REREPLICATED_S, interval_s=1.0,
                 what="no ledger left under-replicated or marked")
    finally:
        inside.kill()

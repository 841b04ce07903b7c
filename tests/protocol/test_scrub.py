"""The scrub's decisions (``appliance.protocol.scrub``): what a look at a
ledger finds, and which ledgers a pass looks at."""

from __future__ import annotations

from appliance.protocol import scrub
from appliance.protocol.metadata import LedgerMetadata


def ledger(ensembles, last=None, e=3, w=3, a=2, ledger_id=7) -> LedgerMetadata:
    md = LedgerMetadata(ledger_id=ledger_id, ensemble_size=e, write_quorum=w, ack_quorum=a,
                        ensembles=tuple((f, tuple(b)) for f, b in ensembles))
    return md if last is None else md.to_closed(last)


def counter(held: set[int]):
    return lambda runs: sum(1 for f, l in runs for e in range(f, l + 1) if e in held)


def test_the_missing_count_is_over_the_share_only():
    md = ledger([(0, "abc"), (6, "adc")], last=11, w=2)
    share = {e for e in range(12) if "a" in md.write_set(e)}
    assert scrub.missing_count(md, "a", counter(share)) == (len(share), 0)
    others = set(range(12)) - share  # entries this bookie need not hold do not count
    assert scrub.missing_count(md, "a", counter(others)) == (len(share), len(share))
    assert scrub.missing_count(md, "b", counter(set())) == (4, 4)  # b only in 0..5


def test_verdicts():
    closed = ledger([(0, "abc")], last=9)
    everything = counter(set(range(10)))
    assert scrub.verdict(None, "a", False, everything) == scrub.GONE
    assert scrub.verdict(ledger([(0, "abc")]), "a", False, everything) == scrub.OPEN
    assert scrub.verdict(closed, "a", True, everything) == scrub.BUSY
    assert scrub.verdict(closed, "a", False, everything) == scrub.WHOLE
    assert scrub.verdict(closed, "a", False, counter(set(range(9)))) == scrub.SHORT
    assert scrub.verdict(closed, "z", False, counter(set())) == scrub.WHOLE  # not named
    empty = ledger([(0, "abc")], last=-1)
    assert scrub.verdict(empty, "a", False, counter(set())) == scrub.WHOLE


def test_the_first_listing_is_the_backlog_and_later_ledgers_go_first():
    q = scrub.ScrubQueue()
    q.listing(range(10))
    q.listing(range(13))  # 10..12 appeared since: hot
    assert q.take(4) == [9, 12, 11, 10]  # the backlog keeps a quarter, newest first
    assert q.take(100) == [8, 7, 6, 5, 4, 3, 2, 1, 0]
    assert q.take(100) == [] and q.pending() == 0


def test_a_ledger_not_done_is_looked_at_again_and_a_whole_one_never():
    q = scrub.ScrubQueue()
    q.listing([1, 2, 3, 4])
    for lid, found in zip(q.take(4), (scrub.OPEN, scrub.WHOLE, scrub.SHORT, None),
                          strict=True):
        q.outcome(lid, found)
    q.listing([1, 2, 3, 4])
    assert q.take(10) == [4, 2, 1]  # open, short (now busy in limbo), failed look
    assert 3 in q.done


def test_a_deleted_ledger_is_forgotten():
    q = scrub.ScrubQueue()
    q.listing([1, 2, 3])
    taken = q.take(1)
    q.listing([1, 2])  # 3 was deleted: never looked at, never put back
    q.outcome(taken[0], scrub.OPEN)
    assert sorted(q.take(10)) == [1, 2] and q.pending() == 0
    q.outcome(1, scrub.WHOLE)
    q.listing([2])
    assert 1 not in q.done


def test_many_open_ledgers_do_not_starve_the_backlog():
    q = scrub.ScrubQueue()
    q.listing(range(100))  # the backlog
    q.listing(range(1100))  # 1,000 open ledgers after it
    seen_cold = set()
    for _ in range(40):
        taken = q.take(100)
        seen_cold.update(lid for lid in taken if lid < 100)
        for lid in taken:
            q.outcome(lid, scrub.OPEN if lid >= 100 else scrub.WHOLE)
    assert seen_cold == set(range(100))


def test_what_the_boot_read_orders_the_backlog():
    q = scrub.ScrubQueue()
    # ledger -> (names this bookie, closed), as the bookie's boot read them
    q.boot({1: (False, True), 2: (True, True), 3: (False, False), 4: (True, False)})
    q.listing([1, 2, 3, 4, 5])  # 5 was created after the boot read
    assert 1 in q.done  # closed, names this bookie nowhere: never looked at
    assert list(q.hot) == [4, 3] and list(q.cold) == [2, 5]
    assert q.take(4) == [2, 5, 4, 3]  # the hot two, and the rest of the budget to the backlog

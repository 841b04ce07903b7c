"""LedgerReader batch mode (SendReadBatch, E == Qw): the same answers as
one-by-one reads, at the cost of a few messages; every failure falls back to
the one-by-one rules (a negative still needs every replica)."""

import dataclasses

from appliance.errors import OK, BKTimeoutError, NoSuchEntryError
from appliance.protocol import events as ev
from appliance.protocol.entry import pack_entry, verify_run
from appliance.protocol.read_batch import batch_rows, batch_window
from appliance.protocol.reader import LedgerReader, ReaderConfig
from tests.protocol.helpers import DIGEST, KEY, Loop, metadata, of, one


class BatchLoop(Loop):
    """``Loop`` that also answers SendReadBatch the way a bookie does (the
    bookies' rule, ``appliance.protocol.read_batch``): rows in entry order,
    stopping after the first non-OK row or ``rows_max`` rows."""

    rows_max = 10_000

    def _carry_out(self, a):
        if not isinstance(a, ev.SendReadBatch):
            return super()._carry_out(a)
        self.sent.append(a)
        if a.bookie_id in self.down or self.drop(a):
            return None
        bookie = self.bookies[a.bookie_id]

        def read_one(entry_id):
            r = bookie.read(a.ledger_id, entry_id, False, a.master_key)
            return r.code, r.data

        asked = a.last_entry_id - a.first_entry_id + 1
        window = batch_window(a.first_entry_id, a.last_entry_id, asked, 1 << 30,
                              self.rows_max, 1 << 30)
        ids, codes, datas = zip(*batch_rows(window, read_one), strict=True)
        return ev.ReadBatchResponse(a.request_id, a.bookie_id, a.ledger_id, OK, ids, codes,
                                    datas)


def fill(loop, entries, bookies=("b1", "b2", "b3")):
    for e in range(entries):
        record = pack_entry(1, e, e - 1, e + 1, b"e%d" % e, DIGEST)
        for b in bookies:
            loop.bookies[b].add(1, e, record, KEY)


def read_all(loop, md, first, last, **config):
    r = LedgerReader(md, DIGEST, master_key=KEY,
                     config=ReaderConfig(read_batch_entries=4, **config))
    r.last_add_confirmed = last
    loop.run(r, r.read(first, last, 0))
    return r


def payloads(loop):
    done = one(ev.ReadDone, loop.results)
    assert done.code == OK, done
    return [bytes(p) for p in done.payloads]


def test_batches_rotate_over_the_bookies_and_read_everything():
    loop = BatchLoop(metadata())
    fill(loop, 10)
    read_all(loop, loop.meta[1][0], 0, 9)
    assert payloads(loop) == [b"e%d" % e for e in range(10)]
    batches = of(ev.SendReadBatch, loop.sent)
    assert [(b.first_entry_id, b.last_entry_id) for b in batches] == [(0, 3), (4, 7), (8, 9)]
    assert len({b.bookie_id for b in batches}) == 3 and not of(ev.SendRead, loop.sent)


def test_a_bad_record_is_read_one_by_one_and_the_rest_from_another_bookie():
    loop = BatchLoop(metadata())
    fill(loop, 8)
    for b in ("b1", "b2", "b3"):  # entry 2 is corrupt wherever a batch would ask first
        if b != "b3":
            loop.bookies[b].storage._live[1].entries[2] = b"\0" * 40
    read_all(loop, loop.meta[1][0], 0, 7, read_batches_in_flight=1)
    assert payloads(loop) == [b"e%d" % e for e in range(8)]
    singles = of(ev.SendRead, loop.sent)
    assert singles and {s.entry_id for s in singles} == {2}  # only the bad one, one by one


def test_cut_replies_are_continued_as_batches():
    loop = BatchLoop(metadata())
    loop.rows_max = 3
    fill(loop, 10)
    read_all(loop, loop.meta[1][0], 0, 9)
    assert payloads(loop) == [b"e%d" % e for e in range(10)]
    assert not of(ev.SendRead, loop.sent)


def test_a_silent_bookie_times_out_and_its_run_goes_elsewhere():
    loop = BatchLoop(metadata())
    fill(loop, 8)
    loop.down.add("b2")
    r = read_all(loop, loop.meta[1][0], 0, 7, read_timeout_ms=100)
    loop.fire_timers(r, now_ms=1_000)
    assert payloads(loop) == [b"e%d" % e for e in range(8)]


def test_negative_only_when_every_replica_says_so():
    loop = BatchLoop(metadata())
    fill(loop, 4, bookies=("b2", "b3"))  # b1 lost everything: the others still serve
    read_all(loop, loop.meta[1][0], 0, 3)
    assert payloads(loop) == [b"e%d" % e for e in range(4)]
    loop = BatchLoop(metadata())
    fill(loop, 3)  # entry 3 exists nowhere
    read_all(loop, loop.meta[1][0], 0, 3)
    assert one(ev.ReadDone, loop.results).code == NoSuchEntryError.code


def test_every_bookie_failing_ends_in_the_one_by_one_error():
    loop = BatchLoop(metadata())
    fill(loop, 4)
    loop.down.update({"b1", "b2", "b3"})
    r = read_all(loop, loop.meta[1][0], 0, 3, read_timeout_ms=100, read_rounds_max=1)
    for now_ms in range(1_000, 10_000, 1_000):
        loop.fire_timers(r, now_ms=now_ms)
    assert one(ev.ReadDone, loop.results).code == BKTimeoutError.code


def test_striped_ledgers_and_fragment_edges():
    loop = BatchLoop(metadata(ensemble=("b1", "b2", "b3"), write_quorum=2))
    for e in range(6):
        record = pack_entry(1, e, e - 1, e + 1, b"e%d" % e, DIGEST)
        for b in loop.meta[1][0].write_set(e):
            loop.bookies[b].add(1, e, record, KEY)
    read_all(loop, loop.meta[1][0], 0, 5)  # E3/W2: no bookie has a run, so one by one
    assert payloads(loop) == [b"e%d" % e for e in range(6)]
    assert not of(ev.SendReadBatch, loop.sent)
    md = dataclasses.replace(metadata(), ensembles=((0, ("b1", "b2", "b3")),
                                                    (5, ("b1", "b2", "b4"))))
    loop = BatchLoop(md)
    fill(loop, 10, bookies=("b1", "b2", "b3", "b4"))
    read_all(loop, md, 0, 9)
    assert payloads(loop) == [b"e%d" % e for e in range(10)]
    runs = [(b.first_entry_id, b.last_entry_id) for b in of(ev.SendReadBatch, loop.sent)]
    assert runs == [(0, 3), (4, 4), (5, 8), (9, 9)]


def test_verify_run_keeps_the_verified_prefix():
    records = [pack_entry(1, e, e - 1, e + 1, b"p%d" % e, DIGEST) for e in range(5)]
    got, lac = verify_run(records, DIGEST, 1, 0)
    assert [bytes(p) for p in got] == [b"p%d" % e for e in range(5)] and lac == 3
    bad = records[:2] + [records[2][:-1] + b"?"] + records[3:]
    assert len(verify_run(bad, DIGEST, 1, 0)[0]) == 2
    assert verify_run(records, DIGEST, 1, 1)[0] == []  # entry 0 filed as 1: refused
    assert verify_run(records, DIGEST, 2, 0)[0] == []  # another ledger's records


def test_a_writer_told_lac_lets_reads_go_past_the_bookies_lac():
    """``learn_lac``: the ledger's writer (a log's owner) says entries up to
    N are acknowledged, so reads may go that far although no bookie's LAC
    says so yet (read your writes); it never lowers the LAC, and a claim past
    a CLOSED ledger's last entry is ignored."""
    md = metadata()
    loop = BatchLoop(md)
    fill(loop, 6)
    r = LedgerReader(md, DIGEST, master_key=KEY,
                     config=ReaderConfig(read_batch_entries=4))
    loop.run(r, r.read(0, 0, 0))
    assert one(ev.ReadDone, loop.results).code == NoSuchEntryError.code  # LAC -1: refused
    loop.results.clear()
    assert r.learn_lac(5) == 5 and r.learn_lac(3) == 5
    loop.run(r, r.read(0, 5, 0))
    assert payloads(loop) == [b"e%d" % e for e in range(6)]
    closed = LedgerReader(metadata(state="CLOSED", last_entry_id=2), DIGEST, master_key=KEY)
    assert closed.learn_lac(4) == 2

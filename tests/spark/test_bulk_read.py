"""``appliance.client.bulk_read`` against in-memory bookies on threads (real ZeroMQ,
real wire codec): order and exactly-once, failover on every kind of bad
answer, and clear errors when no replica serves an entry."""

from __future__ import annotations

import pytest

from appliance.checks.digest import make_digest
from appliance.client.bulk_read import BulkReadConfig, BulkReader, parse_reply, verify_records
from appliance.errors import (
    OK,
    BadRequestError,
    BKTimeoutError,
    BookieUnavailableError,
    DigestMismatchError,
    NoSuchEntryError,
)
from appliance.protocol.entry import pack_entries
from appliance.protocol.keys import master_key
from appliance.protocol.metadata import LedgerMetadata
from ipc.memserver import MemoryBookie
from ipc.packed import ReadPackedReply, ReadPackedRequest
from ipc.replies import ReadBatchReply, encode_reply
from ipc.requests import AddBatchRequest, AddItem, ReadBatchRequest
from ipc.server import FrameServer
from tests.ipc.support import ThreadServer

KEY = master_key(b"secret")
LEDGER = 42
# speculative reads off: these tests show the failover after a timeout
FAST = BulkReadConfig(read_timeout_ms=300, retry_backoff_ms=10, batch_entries_max=64,
                      speculative_read_timeout_ms=0)
FRAMES = BulkReadConfig(read_timeout_ms=300, retry_backoff_ms=10, batch_entries_max=64,
                        packed_replies=False,  # READ_BATCH: one frame per entry
                        speculative_read_timeout_ms=0)
BOTH = pytest.mark.parametrize("cfg", [FAST, FRAMES], ids=["read_packed", "read_batch"])


class FaultyBookie(MemoryBookie):
    """A memory bookie answering READ_BATCH and READ_PACKED, that can corrupt,
    misfile, drop or garble its replies."""

    def __init__(self, bookie_id: str):
        super().__init__(bookie_id)
        self.corrupt: set[int] = set()  # entries served with a flipped payload byte
        self.misfile: set[int] = set()  # entries served with the next entry's record
        self.silent = False  # never answer READ_BATCH
        self.garble = False  # answer with rows that are not consecutive
        self.old = False  # refuse READ_PACKED, as a bookie from before that op would
        self.reads = 0

    def handle(self, peer, req):
        packed = isinstance(req, ReadPackedRequest)
        if not packed and not isinstance(req, ReadBatchRequest):
            return super().handle(peer, req)
        self.reads += 1
        if self.silent:
            return None
        if packed and self.old:
            raise BadRequestError("unknown op 10")
        as_batch = ReadBatchRequest(req.ledger_id, req.first_entry_id, req.last_entry_id,
                                    req.max_entries, req.max_bytes, req.fence, req.master_key,
                                    req.request_id)
        rows = [self._spoil(r) for r in super().handle(peer, as_batch).rows]
        if self.garble and len(rows) > 1:
            rows[1] = (rows[1][0] + 5, rows[1][1], rows[1][2])
        if packed:
            return ReadPackedReply.from_rows(req.ledger_id, rows, req.request_id)
        return ReadBatchReply(req.ledger_id, rows, req.request_id)

    def _spoil(self, row):
        entry_id, status, data = row
        if status == OK and entry_id in self.corrupt:
            data = bytes(data[:-1]) + bytes([data[-1] ^ 0x01])
        if status == OK and entry_id in self.misfile:
            data = self.ledgers[LEDGER].entries.get(entry_id + 1, data)
        return entry_id, status, data


@pytest.fixture
def bookies(short_tmp):
    """Factory: ``bookies(n)`` -> ({id: FaultyBookie}, {id: endpoint}), all stopped after."""
    running: list[ThreadServer] = []

    def make(n: int):
        handlers, endpoints = {}, {}
        for i in range(n):
            bookie_id = f"b{len(running)}"
            handler = FaultyBookie(bookie_id)
            server = FrameServer(f"ipc://{short_tmp}/{bookie_id}.sock", handler)
            handler.attach(server)
            running.append(ThreadServer(server).start())
            handlers[bookie_id], endpoints[bookie_id] = handler, server.endpoint
            assert i < 16
        return handlers, endpoints

    yield make
    for ts in running:
        ts.stop()


def _payloads(n: int) -> list[bytes]:
    return [(b"entry-%d-" % i) * (1 + i % 7) for i in range(n)]


def _metadata(ensembles, e: int = 3, w: int = 3, digest: str = "crc32c", last: int = -1):
    return LedgerMetadata(LEDGER, e, w, min(w, 2), tuple(ensembles), state="CLOSED",
                          last_entry_id=last, digest_type=digest)


def _store(md: LedgerMetadata, handlers: dict, payloads: list[bytes]) -> None:
    """Put each record on every bookie (that exists) of its write set."""
    records, _ = pack_entries(LEDGER, 0, -1, 0, payloads, make_digest(md.digest_type, KEY))
    for entry_id, record in enumerate(records):
        for bookie_id in (b for b in md.write_set(entry_id) if b in handlers):
            handlers[bookie_id].handle(b"w", AddBatchRequest([AddItem(LEDGER, entry_id, KEY,
                                                                      record)]))


def _read_all(reader, md, first=0, last=None):
    last = md.last_entry_id if last is None else last
    out = []
    for chunk in reader.read(md, first, last, KEY):
        for i in range(chunk.count):
            out.append((chunk.first_entry_id + i,
                        chunk.payloads[chunk.offsets[i]:chunk.offsets[i + 1]]))
    return out


@BOTH
def test_reads_every_entry_once_in_order_spread_over_replicas(bookies, cfg):
    handlers, endpoints = bookies(3)
    payloads = _payloads(1000)
    md = _metadata([(0, tuple(handlers))], last=999)
    _store(md, handlers, payloads)
    with BulkReader(endpoints, cfg) as reader:
        got = _read_all(reader, md)
        assert got == list(enumerate(payloads))
        assert _read_all(reader, md, 10, 20) == list(enumerate(payloads))[10:21]
        assert reader.counters["failovers"] == 0
    assert all(h.reads > 0 for h in handlers.values())  # load spread over the replicas


@BOTH
def test_striped_ledger_and_several_fragments(bookies, cfg):
    handlers, endpoints = bookies(5)
    ids = tuple(handlers)
    md = _metadata([(0, ids[:3]), (200, ids[2:])], e=3, w=2, last=499)
    payloads = _payloads(500)
    _store(md, handlers, payloads)
    with BulkReader(endpoints, cfg) as reader:
        assert _read_all(reader, md) == list(enumerate(payloads))


def test_hmac_digest_ledger(bookies):
    handlers, endpoints = bookies(3)
    md = _metadata([(0, tuple(handlers))], digest="hmac-sha256", last=99)
    payloads = _payloads(100)
    _store(md, handlers, payloads)
    with BulkReader(endpoints, FAST) as reader:
        assert _read_all(reader, md) == list(enumerate(payloads))
        with pytest.raises(DigestMismatchError, match=f"ledger {LEDGER} entry 0"):
            list(reader.read(md, 0, 99, master_key(b"wrong")))


@BOTH
def test_corrupt_and_misfiled_records_fail_over_never_served(bookies, cfg):
    handlers, endpoints = bookies(3)
    md = _metadata([(0, tuple(handlers))], last=299)
    payloads = _payloads(300)
    _store(md, handlers, payloads)
    a, b, _ = handlers.values()
    a.corrupt.update({5, 150})
    b.misfile.update({7, 151})
    with BulkReader(endpoints, cfg) as reader:
        assert _read_all(reader, md) == list(enumerate(payloads))
        assert reader.counters["bad_records"] >= 1
        assert reader.counters["failovers"] >= 1


def test_every_replica_corrupt_is_a_digest_error_naming_the_entry(bookies):
    handlers, endpoints = bookies(3)
    md = _metadata([(0, tuple(handlers))], last=99)
    _store(md, handlers, _payloads(100))
    for h in handlers.values():
        h.corrupt.add(70)
    with BulkReader(endpoints, FAST) as reader:
        got = []
        with pytest.raises(DigestMismatchError, match=f"ledger {LEDGER} entry 70") as info:
            for chunk in reader.read(md, 0, 99, KEY):
                got.append(chunk)
        assert sum(c.count for c in got) == 70  # everything before the bad entry, in order
        assert all(b in str(info.value) for b in handlers)


@BOTH
def test_silent_and_garbling_bookies_are_skipped(bookies, cfg):
    handlers, endpoints = bookies(3)
    md = _metadata([(0, tuple(handlers))], last=399)
    payloads = _payloads(400)
    _store(md, handlers, payloads)
    a, b, _ = handlers.values()
    a.silent = True
    b.garble = True
    with BulkReader(endpoints, cfg) as reader:
        assert _read_all(reader, md) == list(enumerate(payloads))
        assert reader.counters["timeouts"] >= 1
        assert reader.counters["bad_replies"] >= 1


@pytest.mark.parametrize("packed", [True, False], ids=["read_packed", "read_batch"])
def test_a_silent_bookie_is_read_around_before_its_timeout(bookies, packed):
    """Speculative reads: a chunk the silent bookie holds is also asked of
    another replica after the speculative timeout, which answers first; the
    silent bookie becomes suspect and later chunks skip it, so the read never
    waits out a read timeout (20 s here: without speculation the silent
    bookie's first chunk would wait that long and count a timeout)."""
    handlers, endpoints = bookies(3)
    md = _metadata([(0, tuple(handlers))], last=399)
    payloads = _payloads(400)
    _store(md, handlers, payloads)
    next(iter(handlers.values())).silent = True
    cfg = BulkReadConfig(read_timeout_ms=20_000, batch_entries_max=64, packed_replies=packed,
                         speculative_read_timeout_ms=50)
    with BulkReader(endpoints, cfg) as reader:
        assert _read_all(reader, md) == list(enumerate(payloads))
        assert reader.counters["speculative"] >= 1
        assert reader.counters["timeouts"] == 0


def test_bulk_read_config_refuses_a_negative_speculative_timeout():
    with pytest.raises(ValueError, match="speculative_read_timeout_ms"):
        BulkReadConfig(speculative_read_timeout_ms=-1)


def test_bookies_without_read_packed_are_read_with_read_batch(bookies):
    handlers, endpoints = bookies(3)
    md = _metadata([(0, tuple(handlers))], last=299)
    payloads = _payloads(300)
    _store(md, handlers, payloads)
    for h in handlers.values():
        h.old = True
    with BulkReader(endpoints, FAST) as reader:
        assert _read_all(reader, md) == list(enumerate(payloads))
        assert reader.counters["failovers"] == 0  # a refused op is not a failed replica


def test_missing_everywhere_is_no_such_entry(bookies):
    handlers, endpoints = bookies(3)
    md = _metadata([(0, tuple(handlers))], last=49)
    _store(md, handlers, _payloads(40))  # the metadata claims 50 entries
    with BulkReader(endpoints, FAST) as reader, \
            pytest.raises(NoSuchEntryError, match=f"ledger {LEDGER} entry 40"):
        _read_all(reader, md)


def test_unreachable_bookies_name_their_endpoints(bookies, short_tmp):
    handlers, endpoints = bookies(1)
    md = _metadata([(0, ("b0", "gone-1", "gone-2"))], last=9)
    _store(md, handlers, _payloads(10))
    handlers["b0"].silent = True
    dead = {"b0": endpoints["b0"], "gone-1": f"ipc://{short_tmp}/nobody.sock"}
    with BulkReader(dead, FAST) as reader:
        # The transport knows gone-1 was never reached once its first request
        # timed out: the second round's try fails at once, and that last
        # answer names the error (b0, silent, timed out twice before it).
        with pytest.raises(BookieUnavailableError) as info:
            _read_all(reader, md)
        message = str(info.value)
        assert endpoints["b0"] in message and "nobody.sock" in message
        assert "gone-2" in message and "not registered" in message
        assert message.count(f"{BKTimeoutError.__name__} (no reply within 300 ms)") == 3
        assert reader.counters["timeouts"] == 3
    with BulkReader({}, FAST) as reader, pytest.raises(BookieUnavailableError):
        _read_all(reader, md)


def test_abandoned_read_leaves_the_reader_usable(bookies):
    handlers, endpoints = bookies(3)
    md = _metadata([(0, tuple(handlers))], last=999)
    payloads = _payloads(1000)
    _store(md, handlers, payloads)
    with BulkReader(endpoints, FAST) as reader:
        partial = reader.read(md, 0, 999, KEY)
        next(partial)
        partial.close()  # requests still in flight: their replies must be dropped
        assert _read_all(reader, md, 500, 999) == list(enumerate(payloads))[500:]


# -- the pure parts ------------------------------------------------------------------
def test_verify_records_cuts_at_the_first_bad_record():
    digest = make_digest("crc32c", KEY)
    payloads = _payloads(10)
    recs, _ = pack_entries(LEDGER, 0, -1, 0, payloads, digest)
    chunk, why = verify_records(recs, LEDGER, 0, digest)
    assert why is None and chunk.count == 10
    assert [chunk.payloads[chunk.offsets[i]:chunk.offsets[i + 1]] for i in range(10)] == payloads
    cases = {  # index of the bad record -> its replacement
        4: recs[4][:-1] + bytes([recs[4][-1] ^ 0x80]),  # payload bit flip
        5: recs[5][:20] + bytes([recs[5][20] ^ 1]) + recs[5][21:],  # header bit flip
        6: recs[6][:30],  # truncated below header + digest
        7: recs[8],  # another entry's record
    }
    for bad, record in cases.items():
        spoiled = list(recs)
        spoiled[bad] = record
        chunk, why = verify_records(spoiled, LEDGER, 0, digest)
        assert chunk.count == bad and why is not None
    assert verify_records(recs, LEDGER + 1, 0, digest)[0] is None  # wrong ledger
    assert verify_records(recs[3:], LEDGER, 2, digest)[0] is None  # wrong entry ids


def test_verify_records_checks_lac_and_running_length():
    digest = make_digest("crc32c", KEY)
    good, _ = pack_entries(LEDGER, 0, -1, 0, [b"aa", b"bb", b"cc"], digest)
    skewed, _ = pack_entries(LEDGER, 2, -1, 999, [b"cc"], digest)  # length jumps
    chunk, why = verify_records(good[:2] + skewed, LEDGER, 0, digest)
    assert chunk.count == 2 and "running length" in why
    lac_too_high, _ = pack_entries(LEDGER, 0, -1, 0, [b"x"], digest)
    header = bytearray(lac_too_high[0][:32])
    header[16:24] = (5).to_bytes(8, "big")  # lac 5 >= entry 0
    forged = bytes(header) + digest.compute(bytes(header), b"x") + b"x"
    assert verify_records([forged], LEDGER, 0, digest)[0] is None


def test_parse_reply_reads_both_ops_and_refuses_malformed_replies():
    data = [b"r" * 40, b"s" * 41]
    rows = [(3, OK, data[0]), (4, OK, data[1])]
    for reply in (ReadBatchReply(LEDGER, rows, 9), ReadPackedReply.from_rows(LEDGER, rows, 9)):
        parsed = parse_reply([bytes(f) for f in encode_reply(reply)], 1 << 20)
        assert (parsed.request_id, parsed.first_entry_id) == (9, 3)
        assert (bytes(parsed.data), parsed.lengths.tolist()) == (b"".join(data), [40, 41])
    stop = encode_reply(ReadPackedReply.from_rows(LEDGER, [(3, OK, data[0]), (4, 3, None)], 9))
    parsed = parse_reply([bytes(f) for f in stop], 1 << 20)
    assert parsed.stop_status == 3 and parsed.lengths.tolist() == [40]
    batch = [bytes(f) for f in encode_reply(ReadBatchReply(LEDGER, rows, 9))]
    packed = [bytes(f) for f in encode_reply(ReadPackedReply.from_rows(LEDGER, rows, 9))]
    for broken in (batch[:1], batch[:-1], [batch[0][:20]] + batch[1:],  # frames/header short
                   [batch[0], batch[1][:-1]] + batch[2:],  # status table short
                   [batch[0], batch[1][12:] + batch[1][:12]] + batch[2:],  # rows out of order
                   [b"\x02" + batch[0][1:]] + batch[1:],  # another wire version
                   packed[:2] + [packed[2][:-1]],  # data shorter than the table says
                   packed + [b"extra"]):  # a frame too many
        with pytest.raises(BadRequestError):
            parse_reply(broken, 1 << 20)
    for frames in (batch, packed):
        with pytest.raises(BadRequestError):
            parse_reply(frames, 10)  # a record over entry_bytes_max
    failed = parse_reply([batch[0][:28] + (7).to_bytes(4, "big")], 1 << 20)
    assert failed.status == 7 and len(failed.lengths) == 0

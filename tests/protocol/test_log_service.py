"""The log service's pure rules: the duplicate filter, the spread of logs
over servers, the tagged entry format (and that untagged entries read as
before), the packed records and position runs of the wire, and the
multi-log request and reply (sections of single-log ones)."""

from __future__ import annotations

import pytest

from appliance.errors import BadRequestError, CorruptRecordError
from appliance.protocol.log_entry import EntryHeader, pack_entry, unpack_entry, unpack_tags
from appliance.protocol.log_service import (
    DUPLICATE,
    FORGOTTEN,
    FULL,
    GAP,
    NEW,
    OLD,
    DedupTable,
    Verdict,
    check_write,
    decode_header,
    decode_mux,
    decode_mux_reply,
    decode_request,
    decode_written,
    dlsn_runs,
    encode_header,
    encode_mux,
    encode_mux_reply,
    encode_write,
    encode_written,
    mux_groups,
    owner_of,
    pack_records,
    runs_dlsns,
    section_route,
    unpack_records,
)

A, B, C = b"a" * 16, b"b" * 16, b"c" * 16


def test_a_producer_new_records_in_order_then_retries_answered_from_the_table():
    t = DedupTable(producers_max=4, recent_max=3, idle_ms=1000)
    for seq in (1, 2, 3, 4):
        assert t.admit(A, seq, now_ms=0).kind == NEW
        t.store(A, seq, f"pos{seq}")
    assert t.admit(A, 4, 0) == t.admit(A, 4, 0)  # asking again changes nothing
    assert (t.admit(A, 4, 0).kind, t.admit(A, 4, 0).position) == (DUPLICATE, "pos4")
    assert t.admit(A, 2, 0).position == "pos2"
    assert t.admit(A, 1, 0).kind == OLD  # only the last 3 positions are kept
    gap = t.admit(A, 7, 0)
    assert (gap.kind, gap.expected) == (GAP, 5)
    assert t.admit(A, 5, 0).kind == NEW and t.next_seq(A) == 6


def test_an_unknown_producer_starts_where_it_says():
    t = DedupTable(4, 8, 1000)
    assert t.next_seq(B) is None
    assert t.admit(B, 41, 0).kind == NEW
    assert t.next_seq(B) == 42


def test_an_unknown_producer_starts_at_its_oldest_unacknowledged_write():
    t = DedupTable(4, 8, 1000)
    # its request for 3 overtook the one for 1 and 2 (a reconnection): a gap,
    # never a fresh start that would answer 1 and 2 as duplicates
    gap = t.admit(C, 3, 0, oldest=1)
    assert (gap.kind, gap.expected) == (GAP, 1)
    assert [t.admit(C, s, 0, oldest=1).kind for s in (1, 2, 3)] == [NEW, NEW, NEW]


def test_producers_are_bounded_and_only_idle_ones_make_room():
    t = DedupTable(producers_max=2, recent_max=8, idle_ms=1000)
    assert t.admit(A, 1, now_ms=0).kind == NEW
    assert t.admit(B, 1, now_ms=500).kind == NEW
    assert t.admit(C, 1, now_ms=900).kind == FULL  # both wrote within idle_ms
    assert t.admit(C, 1, now_ms=1200).kind == NEW  # A was idle 1200 ms: forgotten
    assert t.next_seq(A) is None and t.next_seq(B) == 2


def test_learning_from_the_log_follows_log_order():
    t = DedupTable(4, 8, 1000)
    for seq, pos in ((7, "p7"), (8, "p8"), (1, "p1")):  # a restarted producer began again
        t.learn(A, seq, pos, now_ms=0)
    assert t.next_seq(A) == 2
    assert t.admit(A, 1, 0).position == "p1"
    t.learn(B, 3, "q3", 0)
    assert (t.admit(B, 3, 0).kind, t.admit(B, 4, 0).kind) == (DUPLICATE, NEW)


def test_spread_is_stable_and_moves_only_the_leaving_servers_logs():
    servers = [f"logserver-{i}" for i in range(1, 5)]
    logs = [f"log{i}" for i in range(400)]
    before = {name: owner_of(name, servers) for name in logs}
    assert before == {name: owner_of(name, list(reversed(servers))) for name in logs}
    counts = {s: list(before.values()).count(s) for s in servers}
    assert min(counts.values()) > 60  # about 100 each
    after = {name: owner_of(name, servers[1:]) for name in logs}
    moved = [name for name in logs if before[name] != after[name]]
    assert moved == [name for name in logs if before[name] == "logserver-1"]
    assert owner_of("x", []) is None


def test_tagged_entries_carry_tags_and_read_as_plain_records():
    header = EntryHeader(False, 2, 2, 1, 2, 0, 1)
    data = pack_entry(header, [1, 2], [b"x", b"yy"], tags=[(A, 5), (B, 9)])
    got, txids, payloads = unpack_entry(data)
    assert (got, txids, payloads) == (header, [1, 2], [b"x", b"yy"])
    assert unpack_tags(data) == [(A, 5), (B, 9)]
    plain = pack_entry(header, [1, 2], [b"x", b"yy"])
    assert unpack_entry(plain)[2] == [b"x", b"yy"] and unpack_tags(plain) is None
    with pytest.raises(CorruptRecordError):
        unpack_entry(data[:-1])
    with pytest.raises(ValueError):
        pack_entry(header, [1, 2], [b"x", b"yy"], tags=[(A, 5)])


def test_bad_requests_are_refused_with_one_clear_error():
    with pytest.raises(BadRequestError):
        decode_header(b"{not json")
    with pytest.raises(BadRequestError):
        decode_header(b"[1]")
    assert check_write({"op": "write", "log": "l", "pid": A.hex(), "seq": 3}, 1) == \
        ("l", A, 3, 3)
    assert check_write({"op": "write", "log": "l", "pid": A.hex(), "seq": 3, "oldest": 2},
                       1)[3] == 2
    for doc in ({"op": "write", "log": "l", "pid": "zz", "seq": 1},
                {"op": "write", "log": "l", "pid": "ab", "seq": 1},
                {"op": "write", "log": "l", "pid": A.hex(), "seq": 0},
                {"op": "write", "log": "l", "pid": A.hex(), "seq": 2, "oldest": 3}):
        with pytest.raises(BadRequestError):
            check_write(doc, 1)
    with pytest.raises(BadRequestError):
        check_write({"op": "write", "log": "l", "pid": A.hex(), "seq": 1}, 0)


def test_packed_records_and_position_runs_round_trip():
    records = [b"a", b"", b"xyz" * 100]
    assert unpack_records(*pack_records(records)) == records
    sizes, blob = pack_records(records)
    for bad in ((sizes, blob + b"!"), (sizes[:-1], blob), (b"", b"")):
        with pytest.raises(BadRequestError):
            unpack_records(*bad)
    positions = [(1, 2, 0), (1, 2, 1), (1, 3, 0), None, None, (1, 3, 1), (2, 0, 5)]
    runs = dlsn_runs(positions)
    assert runs == [[1, 2, 0, 2], [1, 3, 0, 1], [None, None, None, 2], [1, 3, 1, 1],
                    [2, 0, 5, 1]]
    assert runs_dlsns(runs) == positions
    assert dlsn_runs([(1, 0, k) for k in range(1000)]) == [[1, 0, 0, 1000]]
    with pytest.raises(BadRequestError):
        runs_dlsns([[1, 2]])


def test_admit_run_takes_a_known_producers_next_records_in_one_step():
    table = DedupTable(4, 3, 1000)
    assert table.admit_run(A, 1, 5, 0) == 0  # unknown producer: one by one
    assert table.admit(A, 1, 0).kind == NEW
    table.store(A, 1, "p1")
    assert table.admit_run(A, 3, 2, 0) == 0  # a gap: one by one
    assert table.admit_run(A, 2, 4, 0) == 4 and table.next_seq(A) == 6
    table.store_many(A, 2, ["p2", "p3", "p4", "p5"])
    assert table.admit(A, 5, 0) == Verdict(DUPLICATE, position="p5")
    assert table.admit(A, 2, 0).kind == OLD  # only the last 3 positions are kept


def test_binary_writes_and_written_replies_round_trip_and_bad_ones_are_refused():
    records = [b"a", b"", b"xyz" * 100]
    frame = encode_write("l\u00e9".encode(), A, 3, 7, 5, records)
    doc, payloads = decode_request([frame])
    assert doc == {"op": "write", "log": "l\u00e9", "pid": A.hex(), "seq": 7, "gen": 3,
                   "oldest": 5}
    assert payloads == records and check_write(doc, len(payloads)) == ("l\u00e9", A, 7, 5)
    for bad in ([frame[:-1]], [frame + b"!"], [frame[:20]], [frame, b"x"], []):
        with pytest.raises(BadRequestError):
            decode_request(bad)
    # the one write encoding is the binary one: a JSON write (the older forms,
    # a frame per record or packed) is refused, and a JSON request is one frame
    json_doc = {"op": "write", "log": "l", "pid": A.hex(), "seq": 1, "packed": 1}
    for bad in ([encode_header(json_doc), *pack_records(records)], [encode_header(json_doc)],
                [encode_header({"op": "hello", "log": "l", "pid": A.hex()}), b"x"]):
        with pytest.raises(BadRequestError):
            decode_request(bad)
    assert decode_request([encode_header({"op": "ping"})]) == ({"op": "ping"}, [])
    runs = [[1, 2, 0, 2], [None, None, None, 3], [4, 5, 6, 1]]
    reply = encode_header({"op": "written", "log": "l", "pid": A.hex(), "seq": 9, "gen": 3,
                           "runs": runs})
    assert decode_header(reply) == {"op": "written", "gen": 3, "seq": 9, "runs": runs}
    assert decode_written(reply) == (3, 9, [(1, 2, 0, 2), (FORGOTTEN, 0, 0, 3), (4, 5, 6, 1)])
    for bad in (reply[:-1], reply + b"!", reply[:5]):
        with pytest.raises(BadRequestError):
            decode_written(bad)
    odd = {"op": "written", "seq": 1, "gen": -1, "runs": [[1, 2, 3, 1]]}  # no u32 gen
    assert decode_header(encode_header(odd)) == odd


def test_a_multi_log_request_carries_single_log_requests_as_they_are():
    writes = [encode_write(b"orders", A, 1, 10, 9, [b"x", b"yy"]),
              encode_write("l\u00e9".encode(), B, 2, 1, 1, [b"z" * 300]),
              encode_header({"op": "hello", "log": "third", "pid": C.hex(), "gen": 4})]
    frame = encode_mux(writes)
    sections = decode_mux(frame, 8, 1 << 20)
    assert sections == writes
    docs = [decode_request([section]) for section in sections]
    assert docs[0] == ({"op": "write", "log": "orders", "pid": A.hex(), "seq": 10, "gen": 1,
                        "oldest": 9}, [b"x", b"yy"])
    assert docs[1][0]["log"] == "l\u00e9" and docs[1][1] == [b"z" * 300]
    assert docs[2][0] == {"op": "hello", "log": "third", "pid": C.hex(), "gen": 4}
    # each section's log and producer, to route even a malformed one's answer
    assert [section_route(s) for s in sections] == \
        [(b"orders", A), ("l\u00e9".encode(), B), (b"third", C)]
    assert section_route(writes[0][:10]) is None and section_route(b"{nope") is None
    # a multi-log request is not a single-log one: refused there, clearly
    with pytest.raises(BadRequestError, match="decode_mux"):
        decode_request([frame])


@pytest.mark.parametrize("cut", ["empty", "short-header", "no-sections", "short-section",
                                 "trailing", "zero-section", "nested", "too-many",
                                 "too-big"])
def test_a_malformed_multi_log_request_is_one_clear_error(cut):
    good = [encode_write(b"a", A, 1, 1, 1, [b"r"]), encode_write(b"b", B, 1, 1, 1, [b"s"])]
    frame = encode_mux(good)
    bad = {"empty": b"", "short-header": frame[:3], "no-sections": encode_mux([]),
           "short-section": frame[:-1], "trailing": frame + b"!",
           "zero-section": encode_mux([b""]), "nested": encode_mux([frame]),
           "too-many": encode_mux(good * 3), "too-big": frame}[cut]
    with pytest.raises(BadRequestError, match="log service: .*multi-log request"):
        decode_mux(bad, 4, len(frame) - 1 if cut == "too-big" else 1 << 20)


def test_a_multi_log_reply_routes_each_answer_to_its_log_and_producer():
    written = encode_written(3, 10, [(1, 2, 0, 2)])
    error = encode_header({"op": "error", "code": "not_owner", "log": "b", "pid": B.hex(),
                           "seq": 1, "gen": 1, "endpoint": "ipc:///x"})
    answers = [(b"a", A, written), ("l\u00e9".encode(), B, error)]
    frame = encode_mux_reply(answers)
    assert decode_mux_reply(frame, 8, 1 << 20) == answers
    assert decode_written(decode_mux_reply(frame, 8, 1 << 20)[0][2]) == (3, 10, [(1, 2, 0, 2)])
    for bad in (frame[:-1], frame + b"!", frame[:4], encode_mux_reply([])):
        with pytest.raises(BadRequestError, match="log service: .*multi-log reply"):
            decode_mux_reply(bad, 8, 1 << 20)
    with pytest.raises(BadRequestError, match="2 sections"):
        decode_mux_reply(frame, 1, 1 << 20)


def test_mux_groups_keep_the_order_within_the_count_and_byte_bounds():
    parts = [b"a" * 3, b"b" * 3, b"c" * 3, b"d" * 9, b"e", b"f", b"g"]
    groups = list(mux_groups(parts, 3, 7))
    assert [p for g in groups for p in g] == parts  # every part once, in order
    assert groups == [[b"aaa", b"bbb"], [b"ccc"], [b"d" * 9], [b"e", b"f", b"g"]]
    assert list(mux_groups([], 3, 7)) == []

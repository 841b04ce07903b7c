"""Fencing and crash recovery across hosts: a recovery on one host fences a
writer running on another (its next adds fail with LedgerFencedError); a
writer killed -9 on host1 is recovered from host3 with its last entry at or
after the last one it saw acknowledged.  Every acknowledged entry is read."""

from __future__ import annotations

ACKED_BEFORE = 30  # entries the writer has acknowledged before the fault
INTERVAL_MS = "5"


def _check_read(read: dict, acked: list[int]) -> None:
    assert acked == list(range(len(acked))), "acks come in entry order, none missing"
    assert read["last"] >= acked[-1], "an acknowledged entry was lost"
    assert read["count"] == read["last"] + 1 and read["bad"] == []
    assert read["state"] == "CLOSED"


def test_recovery_on_host2_fences_the_writer_on_host1(healthy):
    writer = healthy.worker("host1", "write", "--interval-ms", INTERVAL_MS)
    ledger = writer.wait_event("created", timeout_s=60)["ledger"]
    writer.wait_event("acked", lambda e: e["entry"] >= ACKED_BEFORE)

    reader = healthy.worker("host2", "read", "--ledger", str(ledger), "--recovery")
    read = reader.wait_event("read", timeout_s=60)
    error = writer.wait_event("error", timeout_s=60)
    assert error["error"] == "LedgerFencedError", error
    assert writer.wait(30) == 0
    acked = writer.acked()
    assert acked[-1] <= read["last"], "the fenced writer got an ack past the recovered end"
    _check_read(read, acked)


def test_writer_killed_on_host1_is_recovered_from_host3(healthy):
    writer = healthy.worker("host1", "write", "--interval-ms", INTERVAL_MS)
    ledger = writer.wait_event("created", timeout_s=60)["ledger"]
    writer.wait_event("acked", lambda e: e["entry"] >= ACKED_BEFORE)
    writer.kill()  # SIGKILL: no close, adds may be in flight
    acked = writer.acked()

    read = healthy.worker("host3", "read", "--ledger", str(ledger), "--recovery") \
        .wait_event("read", timeout_s=60)
    _check_read(read, acked)
    again = healthy.worker("host2", "read", "--ledger", str(ledger)).wait_event("read")
    assert (again["last"], again["count"]) == (read["last"], read["count"])

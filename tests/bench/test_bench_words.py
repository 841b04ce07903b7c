"""The benches' text output says what each figure is, in words (issue 48
item 5): the load a latency was measured under (adds in flight, closed or
open loop, what is timed), what a per-entry figure counts, what the disk
line is.  Tiny runs on temporary appliances; speed is never asserted, and
--json keeps its keys (tests/bench/test_bench_appliance.py and
test_bench_log_producers.py check them)."""

from __future__ import annotations

import json

from click.testing import CliRunner

from cli.main import cli
from tests.harness.bench_hosts import hosts_lines
from tests.support.bkctl import bkctl

FAKE_PEER = ('echo "redis_stream 1000 records/s write 2000 records/s read '
             'p50 1.00 p99 2.50 ($*)"\n')


def _text(*args: str) -> list[str]:
    result = CliRunner().invoke(cli, ["bench", *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.stdout.splitlines()


def _peer(tmp_path):
    peer = tmp_path / "peer.sh"  # a stand-in for the Redis script: its output format
    peer.write_text(FAKE_PEER)
    return str(peer)


def test_write_says_how_many_adds_were_in_flight_and_what_the_disk_line_is(tmp_path):
    out = bkctl("bench", "write", "--entries", "1000", "--inflight", "100", "--baseline-s",
                "0.05", "--dir", str(tmp_path), text=True)
    assert out.returncode == 0, out.stderr
    rate, latency, cpu, disk = out.stdout.splitlines()
    assert " adds/s acknowledged (durable on 2 bookies at least), " in rate
    assert "(1,000 entries x 1024 B, E3/W3/A2: each entry on 3 of 3 bookies; 1 client" in rate
    assert latency.split(": p50")[0].strip() == (
        "latency of one add, call to acknowledgement, with 100 adds in flight per client "
        "(closed loop: a new add as soon as one completes; one in 16 timed)")
    assert cpu.startswith("cpu   per 1,000 entries: ") and " s in the bookies; " in cpu
    assert disk.startswith("disk  the raw disk under the appliance, measured just before "
                           "the run, to compare with: ")
    assert "(same run)" not in out.stdout


def test_open_loop_write_and_read_say_what_they_timed(tmp_path):
    write = _text("write", "--entries", "400", "--rate", "2000", "--sample-every", "1",
                  "--baseline-s", "0", "--dir", str(tmp_path))
    assert write[1].split(": p50")[0].strip() == (
        "latency of one add, from its scheduled send time to its acknowledgement, 2,000 "
        "adds/s offered by all clients (open loop; every one timed)")
    read = _text("read", "--entries", "400", "--read-batch", "100", "--baseline-s", "0",
                 "--dir", str(tmp_path))
    assert " entries/s read back from a closed ledger, " in read[0]
    assert read[1].split(": p50")[0].strip() == (
        "latency of one read() call of 100 entries, call to return")


def test_bench_log_says_what_per_entry_and_batched_mean(tmp_path):
    lines = _text("log", "--records", "1000", "--rate", "1000", "--tail-seconds", "0.5",
                  "--peer", _peer(tmp_path), "--dir", str(tmp_path))
    head, write, read, tail, peer, load = lines
    assert head == "100 B records, one exclusive writer (E3/W3/A2):"
    assert "records/s durable (write_async, one record a call; " in write
    assert " records packed per ledger entry), " in write
    assert write.endswith(" records/s with write_many_async (1,000 records a call)")
    assert read.startswith("  catch-up read ") and read.endswith(
        " records/s (one reader from the first record)")
    assert tail.startswith("  tail: written at 1,000 records/s, each record reached a reader "
                           "in another process p50 ")
    assert peer.startswith("  redis stream (fsync always), the same records: write 1,000 "
                           "records/s, read 2,000/s; the log writes ")
    assert load.startswith("load average (1, 5, 15 min) ")


def test_bench_log_producers_say_how_they_wrote(tmp_path):
    lines = _text("log", "--producers", "2", "--records", "300", "--size", "64",
                  "--baseline-records", "200", "--peer", _peer(tmp_path), "--dir", str(tmp_path))
    assert lines[0].startswith("one exclusive writer, the baseline: ")
    assert lines[0].endswith(" records/s (300 records of 64 B, write_async)")
    sync, async_ = (next(i for i, line in enumerate(lines) if line.startswith(f"{mode}: "))
                    for mode in ("sync", "async"))
    starts = {
        sync: "sync: 2 producer processes, each write waiting for its DLSN: ",
        sync + 1: "  latency of a record, from the write call to its DLSN: p50 ",
        async_: "async: 2 producer processes, write_async, up to 1,000 records in flight each: ",
        async_ + 1: "  latency of a record, one in 16 timed, from the write call to its DLSN: ",
        async_ + 3: "  redis stream (fsync always), 2 clients, 1000 command(s) in flight each: "
                    "1,000 records/s",
    }
    for i, start in starts.items():
        assert lines[i].startswith(start), (lines[i], start)
    for i in (sync + 2, async_ + 2):
        assert lines[i].endswith(" records per ledger entry (the log server's group commit)")


def test_storage_and_metadata_say_what_they_count(tmp_path):
    out = bkctl("bench", "storage", "--size", "4096", "--entries", "500", "--baseline-s",
                "0.05", "--dir", str(tmp_path), text=True)
    assert out.returncode == 0, out.stderr
    adds, latency, disk = out.stdout.splitlines()
    assert " adds/s durable (journal fdatasync'ed), " in adds
    assert "(500 x 4096 B, one bookie's storage engine, no network; " in adds
    assert latency.strip().startswith("latency of one batch of 64 entries, from add_entries to "
                                      "durable, up to 8 batches in flight: p50 ")
    assert disk.startswith("disk     the raw disk under the bench's folder, measured just "
                           "before the run, to compare with: ")
    table = _text("metadata", "--backend", "sqlite", "--ops", "20", "--processes", "1",
                  "--warmup", "5")
    assert table[0].split() == ["store", "procs", "node", "CAS/s", "conflicts", "seconds"]
    assert table[-1].startswith("CAS/s: successful compare-and-swaps per second, all "
                                "processes together; conflicts: ")


def test_hosts_say_the_delay_and_the_load(tmp_path):
    """bench hosts needs network namespaces; its figures are bench write's
    (--json) with the cluster's shape, so a tiny bench write gives them."""
    out = bkctl("bench", "write", "--entries", "300", "--inflight", "50", "--baseline-s", "0",
                "--dir", str(tmp_path), "--json", text=True)
    assert out.returncode == 0, out.stderr
    doc = {**json.loads(out.stdout), "hosts": 3, "bookies": 6, "delay_ms": 1.0,
           "delay_mode": "netem", "curve": True}
    first, latency = hosts_lines(doc)
    assert first.endswith("3 hosts x 2 bookies over tcp + CURVE; 1.0 ms added each way "
                          "between hosts (netem))")
    assert latency.strip().startswith("latency of one add, call to acknowledgement, with 50 "
                                      "adds in flight per client (closed loop")


def test_repair_and_boot_say_when_the_bookie_served_again(tmp_path):
    [boot] = _text("boot", "--journal-mb", "1", "--dir", str(tmp_path))
    assert boot.startswith("journal ") and " s after the start" in boot
    [repair] = _text("repair", "--mb", "1", "--dir", str(tmp_path))
    assert " MB/s copied from its peers (the wiped bookie served again " in repair
    assert " s after its start, fenced while it repaired; the data was written in " in repair

"""What the sink tests share: reading a whole log back, and a log-to-log
query (``tests.spark.sink_driver``, a Spark driver process of its own)
killed with -9 in the middle of a micro-batch and restarted from its
checkpoint.  Every driver started here is stopped here, also on failure."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from appliance.errors import NoSuchLogError

QUERY_TIMEOUT_S = 300
LAST_ENTRY_VISIBLE_S = 3.0  # > client.explicit_lac_interval_ms (1 s), with room for a busy machine
BATCH = 600  # records per trigger of the killed query


def payloads_of(app, name: str) -> list[bytes]:
    """Every record of the log now, in log order.  A reader sees an open
    segment up to its last add confirmed: the last entry's LAC reaches the
    bookies once the owner has been idle for client.explicit_lac_interval_ms
    (1 s), so the read ends only after a silence longer than that."""
    out: list[bytes] = []
    try:
        if not app.client.log(name).metadata().live_segments:
            return out
    except NoSuchLogError:
        return out
    with app.client.log(name).reader() as reader:
        while True:
            got = reader.read(max_records=1000, timeout_s=LAST_ENTRY_VISIBLE_S)
            if not got:
                return out
            out += [bytes(r.payload) for r in got]


def kill_in_a_batch_then_rerun(app, checkpoint: Path,
                               meanwhile: Callable[[], None] = lambda: None) -> None:
    """Write ``3 * BATCH`` records to log "source"; run the query from
    "source" into "target" until the target holds part of a batch; kill its
    driver with -9 (that batch is planned and not committed, so Spark runs
    it again on restart, writing its rows again); call ``meanwhile()``;
    restart the query from ``checkpoint`` and wait until it ends well."""
    writer = app.client.log("source").writer()
    futures = []
    for i in range(3 * BATCH):  # entries of 25 records: a batch plans 3 tasks
        futures.append(writer.write_async(b"record %d" % i, i + 1))
        if i % 25 == 24:
            writer.flush()
    writer.close()
    assert len({f.result(timeout=60) for f in futures}) == 3 * BATCH

    driver = _driver(app, "source", "target", checkpoint)
    try:
        seen = _follow_until(app, "target", driver, lambda n: n % BATCH)  # a batch in part
        assert driver.poll() is None and seen % BATCH, _stderr(driver)
    finally:
        _kill(driver)
    assert _batches(checkpoint / "offsets") == _batches(checkpoint / "commits") + 1

    meanwhile()
    driver = _driver(app, "source", "target", checkpoint)
    try:
        assert driver.wait(QUERY_TIMEOUT_S) == 0, _stderr(driver)
    finally:
        if driver.poll() is None:
            _kill(driver)


def _kill(driver: subprocess.Popen) -> None:
    os.killpg(driver.pid, signal.SIGKILL)
    driver.wait()


def _follow_until(app, name: str, driver, done) -> int:
    """Follow log ``name`` while the driver runs until ``done(records so
    far)``; the count then."""
    deadline = time.monotonic() + QUERY_TIMEOUT_S
    while time.monotonic() < deadline and driver.poll() is None:  # until the log exists
        try:
            reader = app.client.log(name).reader()
            break
        except NoSuchLogError:
            time.sleep(0.05)  # polling the metadata, with a deadline
    else:
        return 0
    seen = 0
    with reader:
        while time.monotonic() < deadline and driver.poll() is None and not done(seen):
            seen += len(reader.read(max_records=10_000, timeout_s=0.02))
    return seen


def _driver(app, source: str, target: str, checkpoint: Path) -> subprocess.Popen:
    root = Path(__file__).resolve().parents[2]
    err_path = checkpoint.parent / "driver.err"
    with open(err_path, "ab") as err:  # a file: a pipe could fill
        driver = subprocess.Popen(
            [sys.executable, "-m", "tests.spark.sink_driver", app.config, source, target,
             str(checkpoint), str(BATCH)],
            cwd=root, start_new_session=True, stdout=subprocess.DEVNULL, stderr=err)
    driver.err_path = err_path
    return driver


def _batches(folder: Path) -> int:
    return sum(1 for p in folder.iterdir() if p.name.isdigit()) if folder.exists() else 0


def _stderr(driver: subprocess.Popen) -> str:
    if driver.poll() is None:
        return "driver still running"
    return driver.err_path.read_bytes().decode(errors="replace")[-3000:]

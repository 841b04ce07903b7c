"""Races between processes on both backends: no lost update, exactly one
winner per version, unique ledger ids."""

from __future__ import annotations

import multiprocessing
import queue as queue_module

from appliance.errors import MetadataVersionError
from appliance.meta.ledgers import LedgerManager
from storage.metadata import open_store
from tests.support.launch import reap

PROCESSES = 4
INCREMENTS_PER_PROCESS = 1_000
CAS_ATTEMPTS_MAX = 10_000  # per increment: bounded, far above what contention needs
LEDGERS_PER_PROCESS = 25
RESULT_TIMEOUT_S = 240


def _cas_incrementer(uri: str, count: int, ready, go, results) -> None:
    """Increment the counter at /counter ``count`` times by CAS; report the
    version each winning write replaced."""
    try:
        with open_store(uri, session_timeout_ms=10_000) as store:
            ready.put(True)
            go.wait(60)
            won = []
            for _ in range(count):
                for _attempt in range(CAS_ATTEMPTS_MAX):
                    data, version = store.get("/counter")
                    try:
                        store.set("/counter", str(int(data) + 1).encode(), version)
                    except MetadataVersionError:
                        continue
                    won.append(version)
                    break
                else:
                    raise RuntimeError(f"no CAS win in {CAS_ATTEMPTS_MAX} attempts")
            results.put(("ok", won))
    except BaseException as exc:
        results.put(("error", repr(exc)))


def _ledger_creator(uri: str, count: int, ready, go, results) -> None:
    try:
        with open_store(uri, session_timeout_ms=10_000) as store:
            ledgers = LedgerManager(store)
            ready.put(True)
            go.wait(60)
            ids = [ledgers.create_ledger(1, 1, 1, ["b1"]).ledger_id for _ in range(count)]
            results.put(("ok", ids))
    except BaseException as exc:
        results.put(("error", repr(exc)))


def _run_workers(target, uri: str, count: int) -> list:
    """Start PROCESSES workers, release them together, collect their results;
    every worker is stopped before returning, also on failure."""
    ctx = multiprocessing.get_context("spawn")
    ready, go, results = ctx.Queue(), ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=target, args=(uri, count, ready, go, results))
             for _ in range(PROCESSES)]
    try:
        for p in procs:
            p.start()
        for _ in procs:
            ready.get(timeout=120)
        go.set()
        outcomes = [results.get(timeout=RESULT_TIMEOUT_S) for _ in procs]
    except queue_module.Empty as exc:
        raise AssertionError("a worker neither became ready nor reported") from exc
    finally:
        reap(procs)
    errors = [detail for status, detail in outcomes if status != "ok"]
    assert not errors, errors
    return [detail for _, detail in outcomes]


def test_concurrent_cas_increments_lose_no_update(backend):
    store = backend.open()
    store.create("/counter", b"0")
    per_worker = _run_workers(_cas_incrementer, backend.uri, INCREMENTS_PER_PROCESS)
    total = PROCESSES * INCREMENTS_PER_PROCESS
    assert store.get("/counter") == (str(total).encode(), total)
    replaced = sorted(v for won in per_worker for v in won)
    # Each version 0..total-1 was replaced by exactly one winning writer.
    assert replaced == list(range(total))
    assert all(len(won) == INCREMENTS_PER_PROCESS for won in per_worker)


def test_concurrent_ledger_creation_gives_unique_ids(backend):
    per_worker = _run_workers(_ledger_creator, backend.uri, LEDGERS_PER_PROCESS)
    ids = [i for ids in per_worker for i in ids]
    assert len(set(ids)) == PROCESSES * LEDGERS_PER_PROCESS
    assert LedgerManager(backend.open()).list_ledgers() == sorted(ids)

"""What the client keeps alive for Python's garbage collector.

Every object an add keeps until its acknowledgement is promoted to the
collector's oldest generation when the round trip is long (many ledgers,
a busy appliance), and promotions are what trigger full collections of
the host's whole heap.  So the write path keeps few: the add's future and,
per ledger batch, one ``SendAdd`` per bookie; the rest are tuples of ints
and bytes, which the collector stops tracking."""

from __future__ import annotations

import gc
import random
import subprocess
import sys
import threading
import types
from pathlib import Path

import pytest

from appliance.checks.digest import master_key, password_hash
from appliance.client.driver import Driver
from appliance.client.handles import WriteHandle
from appliance.config import ClientConfig
from appliance.protocol.metadata import LedgerMetadata

BOOKIES = ("b1", "b2", "b3", "b4")


class _Registry:
    def available(self):
        return {b: {"endpoint": f"ipc:///nowhere/{b}.sock"} for b in BOOKIES}


class _SilentTransport:
    """Takes every request and never answers: the adds stay in flight."""

    def __init__(self):
        self.requests = 0
        self._woken = threading.Event()

    def send(self, bookie_id, request, timeout_ms):
        self.requests += 1
        return self.requests

    def step(self, timeout_ms):
        self._woken.wait(timeout_ms / 1000)
        self._woken.clear()

    def wake(self):
        self._woken.set()

    def add_bookie(self, *_):
        pass

    def bind_owner(self):
        pass

    def refused_bookies(self):
        return {}

    def close(self):
        pass


@pytest.fixture
def handles():
    driver = Driver(None, _Registry())
    driver.transport.close()
    driver.transport = _SilentTransport()
    driver.start()
    try:
        client = types.SimpleNamespace(config=ClientConfig(), driver=driver,
                                       payload_bytes_max=1 << 20, metrics=None)
        key = master_key(b"pw")
        out = []
        for i in range(200):
            ensemble = tuple(random.Random(i).sample(BOOKIES, 3))
            md = LedgerMetadata(i + 1, 3, 3, 2, ((0, ensemble),),
                                password_hash=password_hash(key))
            out.append(WriteHandle(client, md, 0, key))
        yield driver, out
    finally:
        driver.close()


def _tracked() -> int:
    gc.collect()
    return len(gc.get_objects())


def test_an_add_in_flight_keeps_at_most_two_tracked_objects(handles):
    driver, hs = handles

    def add(n: int) -> None:  # on the driver thread: n adds per ledger, one batch each
        for h in hs:
            for _ in range(n):
                h._add(b"x" * 100, linger=True)
            h._flush(force=True)
        driver._flush_adds()

    driver.call(add, 1).result(timeout=60)  # each handle's first batch sets up the rest
    before = _tracked()
    sent = driver.transport.requests
    driver.call(add, 5).result(timeout=60)
    assert driver.transport.requests > sent  # they did leave for the bookies
    per_add = (_tracked() - before) / (5 * len(hs))
    # the future (1) and three SendAdds per five adds (0.6), plus a little;
    # before the batches' bookkeeping became tuples it was 3.2
    assert per_add <= 2.0, f"{per_add:.2f} tracked objects per add in flight"


def test_the_client_library_does_not_import_asyncio_or_the_bookie_storage_engine():
    # what a client process imports stays in its heap, and every full
    # collection of the host application scans it
    code = ("import sys\n"
            "import appliance.client.client, appliance.client.driver, appliance.client.handles\n"
            "import appliance.meta.ledgers, appliance.meta.bookies, ipc.client, storage.metadata\n"
            "print(sorted(m for m in ('asyncio', 'storage.ledger_storage', 'storage.journal')\n"
            "             if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True, cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.strip() == "[]", out.stdout + out.stderr

"""What the client keeps alive for Python's garbage collector.

Every object an add keeps until its acknowledgement is promoted to the
collector's oldest generation when the round trip is long (many ledgers,
a busy appliance), and promotions are what trigger full collections of
the host's whole heap.  So the write path keeps little more than the
add's future: the rest (each batch's ids, send time, and the ids a reply
is matched against) are tuples of ints, strs and bytes, which the
collector stops tracking.  (The fake transport below keeps the requests
it was sent, a few objects per message: the counts include them.)"""

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
from appliance.client.write_handle import WriteHandle
from appliance.config import ClientConfig
from appliance.errors import OK
from appliance.protocol.metadata import LedgerMetadata
from ipc.client import Event
from ipc.packed import AddMultiReply, AddMultiRequest, AddPackedReply

BOOKIES = ("b1", "b2", "b3", "b4")


class _Registry:
    def available(self):
        return {b: {"endpoint": f"ipc:///nowhere/{b}.sock"} for b in BOOKIES}


class _SilentTransport:
    """Takes every request and answers only when told (``acked``): the adds
    stay in flight."""

    def __init__(self):
        self.requests = 0
        self.unanswered: list = []
        self._woken = threading.Event()

    def send(self, bookie_id, request, timeout_ms):
        self.requests += 1
        self.unanswered.append((bookie_id, request, self.requests))
        return self.requests

    def acked(self) -> list:
        """Each request so far answered OK (and forgotten)."""
        events = []
        for bookie_id, request, rid in self.unanswered:
            statuses = [OK] * len(request.entry_ids)
            reply = (AddMultiReply(list(request.entry_ids), statuses, rid)
                     if type(request) is AddMultiRequest else
                     AddPackedReply(request.ledger_id, list(request.entry_ids), statuses, rid))
            events.append(Event(bookie_id, rid, int(request.OP), OK, reply))
        self.unanswered.clear()
        return events

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
        # nothing on a timer may add objects while the test counts them: no
        # explicit LACs of the idle ledgers (1 s) and no add timeouts (5 s),
        # which a loaded machine reached between the two counts
        config = ClientConfig(explicit_lac_interval_ms=0, add_timeout_ms=3_600_000)
        client = types.SimpleNamespace(config=config, driver=driver,
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


@pytest.mark.parametrize("adds_per_batch, most", [(1, 2.5), (5, 1.5)])
def test_an_add_in_flight_keeps_about_one_tracked_object(handles, adds_per_batch, most):
    driver, hs = handles

    def add(n: int) -> None:  # on the driver thread: n adds per ledger, one batch each
        for h in hs:
            for _ in range(n):
                h._add(b"x" * 100, linger=True)
            h._flush(force=True)
        driver.outbound.flush_adds()

    driver.call(add, 1).result(timeout=60)  # each handle's first batch sets up the rest
    # the bookies answer it: now they are known to take ADD_MULTI
    driver.call(lambda: driver._on_transport_events(driver.transport.acked())).result(60)
    before = _tracked()
    sent = driver.transport.requests
    driver.call(add, adds_per_batch).result(timeout=60)
    # each handle's first add posted a flush (a bound method and its args)
    # that finds nothing left to send; queued behind it, this call returns
    # once they have run (under load the count came before: +2 per ledger)
    driver.call(lambda: None).result(timeout=60)
    assert driver.transport.requests > sent  # they did leave for the bookies
    per_add = (_tracked() - before) / (adds_per_batch * len(hs))
    # the future (1) and each handle's dict of futures, which the collector
    # tracks again once it holds one (1 / adds_per_batch); the code before
    # this round kept 3.0-4.0 (a SendAdd, a list and a tuple per bookie
    # and batch): 4.04 and 1.61 for these two cases before the routes kept
    # only the parts' ids
    assert per_add <= most, f"{per_add:.2f} tracked objects per add in flight"


def test_the_client_library_does_not_import_asyncio_or_the_bookie_storage_engine():
    # what a client process imports stays in its heap, and every full
    # collection of the host application scans it
    code = ("import sys\n"
            "import appliance.client.client, appliance.client.driver\n"
            "import appliance.client.write_handle, appliance.client.read_handle\n"
            "import appliance.meta.ledgers, appliance.meta.bookies, ipc.client, storage.metadata\n"
            "print(sorted(m for m in ('asyncio', 'storage.ledger_storage', 'storage.journal')\n"
            "             if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True, cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.strip() == "[]", out.stdout + out.stderr

"""Fakes for testing the client driver without bookies: a registry of two
bookies that are never reached, a transport that keeps what is sent, and a
core that keeps what it is fed; ``driver_with_fakes`` builds the driver."""

from __future__ import annotations

from contextlib import contextmanager

from appliance.client.driver import Driver
from appliance.protocol import events as ev


class FakeRegistry:
    def available(self):
        return {b: {"endpoint": f"ipc:///nowhere/{b}.sock"} for b in ("b1", "b2")}


class FakeTransport:
    """Keeps each request as (bookie id, request, request id)."""

    def __init__(self):
        self.sent: list[tuple[str, object, int]] = []

    def send(self, bookie_id, request, timeout_ms):
        self.sent.append((bookie_id, request, len(self.sent) + 1))
        return len(self.sent)

    def add_bookie(self, *_):
        pass

    def wake(self):  # the loop never runs: nothing to wake
        pass


class FakeCore:
    """A core that keeps every event it is fed and answers nothing."""

    def __init__(self):
        self.events = []

    def handle(self, event):
        self.events.append(event)
        return []

    def add_rows(self, request_id, bookie_id, ledger_id, entry_ids, codes, now_ms):
        """A part of a multi-ledger reply (``writer_multi``): kept as the
        ``AddResponses`` it stands for."""
        self.events.append(ev.AddResponses(request_id, bookie_id, ledger_id, tuple(entry_ids),
                                           tuple(codes), now_ms))

    def take_actions(self):
        return None


@contextmanager
def driver_with_fakes():
    """A ``Driver`` (its thread not started) sending to a ``FakeTransport``."""
    d = Driver(None, FakeRegistry())
    real = d.transport
    d.transport = FakeTransport()
    try:
        yield d
    finally:
        real.close()
        d.metadata.shutdown()

"""When the log service leaves a log to an exclusive writer (``Log.writer()``):
while it writes, and while it opens (it took the epoch but has not started
its segment); never for a log no one owned or a log server wrote last."""

from __future__ import annotations

from appliance.logservice.routing import held_by_writer
from appliance.protocol.logs import (
    SegmentEnd,
    complete_segment,
    new_log,
    start_segment,
    take_ownership,
)


def test_an_exclusive_writer_holds_the_log_from_taking_it_until_it_closes():
    md = new_log("orders", 0)
    assert not held_by_writer(md)  # created, never written
    md = take_ownership(md, "logserver:logserver-1:11")
    md = start_segment(md, md.epoch, 100, 0)
    assert not held_by_writer(md)  # a log server writes it
    md = take_ownership(md, "host:4242")  # an exclusive writer takes it ...
    assert held_by_writer(md)
    md = complete_segment(md, md.epoch, 1, SegmentEnd())  # ... recovers the old segment ...
    assert held_by_writer(md)  # (not yet its own: still opening)
    md = start_segment(md, md.epoch, 101, 0)  # ... writes ...
    assert held_by_writer(md)
    md = complete_segment(md, md.epoch, 2, SegmentEnd())  # ... and closes
    assert not held_by_writer(md)

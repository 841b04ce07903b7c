"""The durable-reply rule (``appliance.protocol.durable_replies``), the one
the real bookie, the in-memory bookie and the simulated bookie share."""

import pytest

from appliance.errors import TooManyRequestsError
from appliance.protocol.durable_replies import DurableReplies
from appliance.protocol.quorum import Protections


def test_a_reply_whose_ticket_is_durable_goes_at_once():
    parked = DurableReplies(4)
    assert parked.hold(5, 5, "r5") is True
    assert parked.hold(0, 0, "no wait") is True
    assert len(parked) == 0


def test_a_reply_waits_until_its_ticket_is_durable_and_leaves_in_ticket_order():
    parked = DurableReplies(8)
    for ticket, reply in [(7, "a7"), (3, "b3"), (5, "c5"), (3, "d3")]:
        assert parked.hold(ticket, 2, reply) is False
    assert parked.release(2) == []
    assert parked.release(4) == ["b3", "d3"]  # ticket order, arrival order among equals
    assert len(parked) == 2
    assert parked.release(6) == ["c5"]
    assert parked.release(100) == ["a7"]
    assert len(parked) == 0


def test_the_bound_refuses_one_more_and_keeps_what_waits():
    parked = DurableReplies(2)
    parked.hold(3, 0, "x")
    parked.hold(4, 0, "y")
    with pytest.raises(TooManyRequestsError, match="more than 2 replies"):
        parked.hold(5, 0, "z")
    assert parked.hold(0, 0, "durable already") is True  # not parked: no room needed
    assert parked.release(10) == ["x", "y"]


def test_a_crash_forgets_every_parked_reply():
    parked = DurableReplies(4)
    parked.hold(9, 0, "late")
    parked.hold(8, 0, "early")
    assert parked.clear() == ["early", "late"]
    assert parked.release(100) == []


def test_switched_off_every_reply_goes_at_once():
    parked = DurableReplies(1, protections=Protections.without("durable-reply"))
    assert parked.hold(9, 0, "r") is True
    assert parked.hold(10, 0, "s") is True
    assert len(parked) == 0


def test_a_bound_below_one_is_refused():
    with pytest.raises(ValueError, match="parked_max"):
        DurableReplies(0)

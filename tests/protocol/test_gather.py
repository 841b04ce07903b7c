"""The gather rule (appliance.protocol.gather): records held with no entry in
flight wait for the producers just answered, at most gather_s.  (Times in
the tests are exact binary fractions of a 1 s gather.)"""

from __future__ import annotations

import pytest

from appliance.protocol.gather import GatherGate

A, B, C = b"a", b"b", b"c"


def test_nothing_awaited_sends_at_once():
    assert GatherGate(1.0).hold_until(10.0, 10.0) is None


def test_records_wait_for_every_producer_just_answered():
    gate = GatherGate(1.0)
    for p in (A, B, C):
        gate.answered(p, 10.0)
    gate.arrived(A)
    assert gate.hold_until(10.25, 10.25) == 11.0  # B, C awaited
    gate.arrived(B)
    assert gate.hold_until(10.25, 10.5) == 11.0
    gate.arrived(C)
    assert gate.hold_until(10.25, 10.75) is None  # all back: send


def test_a_lone_producer_is_never_held():
    gate = GatherGate(1.0)
    gate.answered(A, 10.0)
    gate.arrived(A)  # its own next write ends its wait
    assert gate.hold_until(10.25, 10.25) is None


def test_a_producer_that_does_not_come_back_delays_the_others_at_most_gather_s():
    gate = GatherGate(1.0)
    gate.answered(A, 10.0)
    gate.answered(B, 10.0)
    gate.arrived(B)
    assert gate.hold_until(10.25, 10.25) == 11.0
    assert gate.hold_until(10.25, 11.0) is None  # A answered gather_s ago: forgotten
    assert len(gate) == 0
    assert gate.hold_until(12.0, 12.0) is None  # and holds nothing later


def test_the_hold_never_outlasts_gather_s_from_when_records_were_held():
    gate = GatherGate(1.0)
    gate.answered(A, 10.75)  # answered after the records began to wait
    assert gate.hold_until(10.5, 11.0) == 11.5
    assert gate.hold_until(10.5, 11.5) is None


def test_zero_turns_it_off():
    gate = GatherGate(0)
    gate.answered(A, 10.0)
    assert gate.hold_until(10.0, 10.0) is None
    with pytest.raises(ValueError):
        GatherGate(-1)

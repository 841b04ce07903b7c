"""Quorum arithmetic and the recovery-read decision table."""

import pytest

from appliance.errors import OK, BKTimeoutError, DataUnknownError, NoSuchEntryError
from appliance.protocol.quorum import (
    NEGATIVE,
    PENDING,
    POSITIVE,
    UNKNOWN,
    Protections,
    WriteSets,
    ack_coverage,
    classify_recovery_read,
    ensemble_coverage,
    in_write_set,
    response_class,
)


def test_coverages():
    assert ack_coverage(3, 2) == 2 and ensemble_coverage(5, 2) == 4
    assert ack_coverage(2, 2) == 1 and ensemble_coverage(3, 3) == 1


def test_write_sets_stripe_from_e_mod_E():
    ws = WriteSets(("b1", "b2", "b3", "b4"), 3)
    assert [ws.of(e) for e in range(5)] == [("b1", "b2", "b3"), ("b2", "b3", "b4"),
                                            ("b3", "b4", "b1"), ("b4", "b1", "b2"),
                                            ("b1", "b2", "b3")]
    for entry in range(8):
        members = {ws.index[b] for b in ws.of(entry)}
        assert all(in_write_set(p, entry, 4, 3) == (p in members) for p in range(4))


@pytest.mark.parametrize("p,n,u,qw,qa,pmin,verdict", [
    (2, 0, 0, 3, 2, 2, POSITIVE),
    (1, 0, 0, 3, 2, 1, POSITIVE),
    (1, 2, 0, 3, 2, 2, NEGATIVE),   # QC = 2 explicit negatives
    (1, 1, 1, 3, 2, 2, UNKNOWN),    # every replica answered, neither threshold
    (1, 1, 0, 3, 2, 2, PENDING),
    (0, 1, 0, 2, 2, 2, NEGATIVE),   # QC = 1 when Qw = Qa
    (2, 1, 0, 3, 3, 3, NEGATIVE),   # Qa = 3: the entry was never acknowledged
    (0, 0, 3, 3, 2, 2, UNKNOWN),
])
def test_recovery_read_decision(p, n, u, qw, qa, pmin, verdict):
    assert classify_recovery_read(p, n, u, qw, qa, pmin) == verdict


def test_response_classes():
    assert response_class(OK) == POSITIVE
    assert response_class(NoSuchEntryError.code) == NEGATIVE
    assert response_class(DataUnknownError.code) == UNKNOWN
    assert response_class(BKTimeoutError.code) == UNKNOWN


def test_protections_switches():
    assert Protections() == Protections(True, True, True, True)
    off = Protections.without("limbo", "fragment-start")
    assert not off.limbo and not off.fragment_start and off.recovery_read_fence
    with pytest.raises(ValueError, match="unknown protection"):
        Protections.without("seatbelts")

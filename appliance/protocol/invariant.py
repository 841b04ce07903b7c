"""``invariant(cond, msg)``: a safety check that ``python -O`` does not strip."""

from __future__ import annotations


class InvariantViolation(AssertionError):
    """A safety invariant was broken: a bug, never an operating error."""


def invariant(condition: object, message: str = "invariant violated") -> None:
    if not condition:
        raise InvariantViolation(message)

"""``invariant(cond, msg)``: a safety check that ``python -O`` does not strip.

A broken invariant is a bug, never an operating error: it raises
``InvariantViolation`` where the rule breaks, in production as in the
simulation.  ``rule`` names the safety rule when it is one the simulation's
checker also holds (``tests/sim/checker.py``: ``"no-divergence"``,
``"one-close"`` ...), so the simulation reports the same violation whether a
core or the checker saw it first; local rules leave it None (reported as
``core-invariant``).  ``args`` are formatted into ``message`` (``%``) only
when the check fails: a check on a hot path costs one call, no string.
"""

from __future__ import annotations


class InvariantViolation(AssertionError):
    """A safety invariant was broken: a bug, never an operating error.
    ``rule``: the checker's name of the broken rule, or None."""

    def __init__(self, message: str, rule: str | None = None):
        super().__init__(message)
        self.rule = rule


def invariant(condition: object, message: str = "invariant violated", *args: object,
              rule: str | None = None) -> None:
    if not condition:
        raise InvariantViolation(message % args if args else message, rule)

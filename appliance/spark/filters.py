"""Filter pushdown for the ``bookkeeper`` source: Spark's pushed filters ->
bounds on ``ledger_id`` and ``entry_id`` that the planner applies exactly.

Pure (no I/O).  A filter is *accepted* (Spark will not re-evaluate it) only
when the bounds express it exactly: ``=``, ``<=>``, ``<``, ``<=``, ``>``,
``>=`` with an integer literal on either column, and ``IN`` of integers on
``ledger_id``.  ``IN`` on ``entry_id`` narrows the range to its min..max but
is handed back to Spark, which keeps the rows it names.  Anything else
(other columns, ``NOT``, ``OR`` - Spark never pushes those -, non-integer
literals) is handed back untouched.  Filters are ANDed, so narrowing by any
of them, accepted or not, never drops a row the query keeps.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pyspark.sql.datasource import (
    EqualNullSafe,
    EqualTo,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    LessThan,
    LessThanOrEqual,
)

from appliance.protocol import limits

COLUMNS = ("ledger_id", "entry_id")


@dataclass(frozen=True)
class Bounds:
    """Inclusive bounds on both id columns; ``ledger_ids`` None means any."""

    ledger_min: int = 0
    ledger_max: int = limits.ID_MAX
    ledger_ids: frozenset[int] | None = None
    entry_min: int = 0
    entry_max: int = limits.ID_MAX

    def admits_ledger(self, ledger_id: int) -> bool:
        return (self.ledger_min <= ledger_id <= self.ledger_max
                and (self.ledger_ids is None or ledger_id in self.ledger_ids))

    def narrow(self, column: str, low: int, high: int) -> Bounds:
        prefix = "ledger" if column == "ledger_id" else "entry"
        lo, hi = getattr(self, f"{prefix}_min"), getattr(self, f"{prefix}_max")
        return replace(self, **{f"{prefix}_min": max(lo, low), f"{prefix}_max": min(hi, high)})

    def only_ledgers(self, ids) -> Bounds:
        ids = frozenset(ids)
        return replace(self, ledger_ids=ids if self.ledger_ids is None else self.ledger_ids & ids)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _range_of(f) -> tuple[int, int] | None:
    """The inclusive range a comparison filter allows, or None if it is not one."""
    kind = type(f)
    v = getattr(f, "value", None)
    if not _is_int(v):
        return None
    if kind in (EqualTo, EqualNullSafe):
        return v, v
    if kind is GreaterThan:
        return v + 1, limits.ID_MAX
    if kind is GreaterThanOrEqual:
        return v, limits.ID_MAX
    if kind is LessThan:
        return -1 << 63, v - 1
    if kind is LessThanOrEqual:
        return -1 << 63, v
    return None


def push_filters(filters) -> tuple[Bounds, list]:
    """(bounds, the filters Spark must still evaluate, as the same objects)."""
    bounds = Bounds()
    rest = []
    for f in filters:
        column = ".".join(getattr(f, "attribute", ()) or ())
        if column not in COLUMNS:
            rest.append(f)
            continue
        if isinstance(f, In):
            values = tuple(f.value)
            if not values or not all(_is_int(v) for v in values):
                rest.append(f)
            elif column == "ledger_id":
                bounds = bounds.only_ledgers(values)
            else:  # narrow to min..max, but Spark keeps only the listed ids
                bounds = bounds.narrow(column, min(values), max(values))
                rest.append(f)
            continue
        window = _range_of(f)
        if window is None:
            rest.append(f)
        else:
            bounds = bounds.narrow(column, *window)
    return bounds, rest

"""Replica failover for a bulk read: which replica to ask next after an
error or a timeout, when to back off, and what to raise when none served.

Pure functions (no I/O, no clock), so the reader and a simulation can drive
the same decision.  The rules the reader's guarantees rest on:

* **Bounded**: each replica of a chunk's first entry (its write set) is
  asked at most ``rounds_max`` times; then ``replicas_to_ask`` says None
  and the read fails with ``no_replica_error``.
* **Rounds**: the replicas asked next are those with the fewest tries so
  far, so none is asked again before every other was asked as often.
* **Preference** among them: the longest run of the chunk held (striped
  ledgers: one request serves more), then not suspect (timed out lately),
  then the write set rotated by the chunk's ordinal (spreads the load).  A
  suspect replica is asked only when no healthy one with the fewest tries
  is left: a busy healthy replica beats a suspect one.
* **Backoff**: a failure that completes a round over the write set asks for
  a pause before the next round (a restarting bookie gets a moment).
* **Honest errors**: the error is an explicit negative (BP-46) only when
  every answer was one; a bad record makes it ``DigestMismatchError``; all
  timeouts make it ``BKTimeoutError``; otherwise the class of the last
  answer that was not a negative (a timeout after a "no such entry" is
  still unknown, never a "no").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set

from appliance.errors import (
    BKError,
    BKTimeoutError,
    BookieUnavailableError,
    DigestMismatchError,
    error_class,
    is_explicit_negative,
)


def replicas_to_ask(write_set: Sequence[str], ordinal: int, run_lens: Mapping[str, int],
                    tries: Mapping[str, int], suspects: Set[str],
                    rounds_max: int) -> tuple[str, ...] | None:
    """The replicas to ask for a chunk next, best first (the caller asks the
    first that has room for a request, and waits if none has); None when
    every replica has had ``rounds_max`` tries.  ``run_lens``: replica ->
    entries of the chunk it holds in a row; ``tries``: replica -> times asked."""
    k = ordinal % len(write_set)
    rotated = list(write_set[k:]) + list(write_set[:k])
    ranked = sorted(rotated, key=lambda b: (-run_lens[b], b in suspects))
    fewest = min(tries.get(b, 0) for b in ranked)
    if fewest >= rounds_max:
        return None
    best = [b for b in ranked if tries.get(b, 0) == fewest]
    healthy = [b for b in best if b not in suspects]
    return tuple(healthy or best)


def tries_after_failure(write_set: Sequence[str], tries: Mapping[str, int], bookie_id: str,
                        rounds_max: int, exhaust: bool = False) -> tuple[dict[str, int], bool]:
    """The tries after ``bookie_id`` failed to serve the chunk (an error
    reply, a bad record, a timeout), and whether that failure completed a
    round over ``write_set`` (back off before the next).  ``exhaust``: it
    never can (no endpoint), so it uses up all its rounds at once."""
    before = min(tries.get(b, 0) for b in write_set)
    after_tries = dict(tries)
    after_tries[bookie_id] = rounds_max if exhaust else tries.get(bookie_id, 0) + 1
    after = min(after_tries.get(b, 0) for b in write_set)
    return after_tries, after > before


def no_replica_error(ledger_id: int, entry_id: int, codes: Sequence[int],
                     answers: Sequence[str]) -> BKError:
    """The error a read raises when no replica served ``entry_id``; ``codes``
    and ``answers`` are what each try answered, in order."""
    if codes and all(is_explicit_negative(c) for c in codes):
        cls = error_class(codes[0])
    elif DigestMismatchError.code in codes:
        cls = DigestMismatchError
    elif codes and all(c == BKTimeoutError.code for c in codes):
        cls = BKTimeoutError
    else:  # the last answer that was not a negative: some replica never said "no"
        unknown = [c for c in codes if not is_explicit_negative(c)]
        cls = error_class(unknown[-1]) if unknown else BookieUnavailableError
    return cls(f"ledger {ledger_id} entry {entry_id}: no replica served it "
               f"({'; '.join(answers)})")

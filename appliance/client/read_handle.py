"""``ReadHandle`` (``Client.open_ledger``): a reader of a ledger, recovered
and closed, or open up to its last add confirmed.  It wraps one pure core
(``LedgerReader``) that lives on the client's driver thread; the handle's
methods hand work to that thread and wait on futures.

Guarantees: reads return entries in order, verified (digest, ledger and
entry ids; failover between replicas; a read unanswered for
``speculative_read_timeout_ms`` is also sent to the next replica, and
bookies the client quarantined are asked last); a read past the LAC raises
``NoSuchEntryError`` before anything is sent; ``read`` keeps the next range
of the same size in flight (read-ahead) and retries it once if it failed;
``wait_for_lac`` long-polls the bookies; ``read_chunks`` is the bulk path
(``appliance.client.bulk_read``).  Reads and LAC waits in flight fail with
``ClientClosedError`` when the client closes.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from itertools import repeat

from appliance.checks.digest import make_digest
from appliance.checks.record_check import verify_run_fast
from appliance.client.calls import Entry, check_entry_id, wait_result
from appliance.errors import OK, BKError, BKTimeoutError, ClientClosedError, NoSuchEntryError
from appliance.protocol import events as ev
from appliance.protocol import limits
from appliance.protocol.metadata import CLOSED
from appliance.protocol.reader import LedgerReader, ReaderConfig

READ_CHUNK_ENTRIES = 1000  # entries per read() round trip through the driver


class ReadHandle:
    """A reader of a ledger (recovered and closed, or open up to its LAC)."""

    def __init__(self, client, metadata, key: bytes):
        self._client = client
        self._driver = client.driver
        self.id = metadata.ledger_id
        self._key = key
        cfg = client.config
        rcfg = ReaderConfig(read_timeout_ms=cfg.read_timeout_ms,
                            read_batch_entries=cfg.read_batch_entries_max, long_poll=True,
                            speculative_read_timeout_ms=cfg.speculative_read_timeout_ms)
        digest = make_digest(metadata.digest_type, key)
        self._reader = LedgerReader(metadata, digest, master_key=key,
                                    config=rcfg, ids=self._driver.ids,
                                    verify_batch=verify_run_fast, health=client.health)
        self._waiting: dict[int, Future] = {}
        # read-ahead: ((first, last), started read) of the range after the last read()
        self._ahead: tuple | None = None
        self._ahead_lock = threading.Lock()
        self._driver.call(self._driver.register, self._reader, self).result()
        if metadata.state != CLOSED:
            self._call(lambda: self._reader.open(self._driver.now_ms()), None)

    @property
    def last_add_confirmed(self) -> int:
        return self._reader.last_add_confirmed

    @property
    def metadata(self):
        return self._reader.metadata

    def read_chunks(self, first_entry_id: int, last_entry_id: int):
        """Bulk catch-up read: entries ``first..last`` (at most the LAC) as
        ``appliance.client.bulk_read.VerifiedChunk`` s, in order, each entry once:
        ``chunk.first_entry_id``, ``chunk.count``, and payload ``i`` is
        ``chunk.payloads[chunk.offsets[i]:chunk.offsets[i + 1]]`` (one buffer
        per chunk, no object per entry).  The same verified bytes as ``read``
        (digest, ledger and entry ids checked; failover between replicas),
        fetched straight from the bookies with READ_PACKED, several requests
        in flight: the fast way to replay a long ledger.  Raises like ``read``
        (``NoSuchEntryError`` past the LAC, before anything is sent)."""
        # The bulk reader loads on the first bulk read (Spark, replays): in
        # every other client it would be 6 more modules and ~230 more objects
        # for the collector to scan (measured 2026-11-27).
        from appliance.client.bulk_read import BulkReadConfig, BulkReader
        from appliance.curve import bookie_routes

        self._check_range(first_entry_id, last_entry_id)
        cfg = self._client.config
        config = BulkReadConfig(read_timeout_ms=cfg.read_timeout_ms,
                                batch_entries_max=cfg.read_batch_entries_max,
                                batch_bytes_max=cfg.read_batch_bytes_max,
                                speculative_read_timeout_ms=cfg.speculative_read_timeout_ms)

        endpoints, server_keys = bookie_routes(self._driver.curve,
                                               self._client.registry.available())
        metadata, key = self.metadata, self._key
        curve_keys = self._driver.curve.keys if self._driver.curve is not None else None

        def chunks():
            with BulkReader(endpoints, config, curve_keys=curve_keys,
                            server_keys=server_keys) as reader:
                yield from reader.read(metadata, first_entry_id, last_entry_id, key)
        return chunks()

    def client_closed(self) -> None:
        """The driver stopped (``Client.close``): reads and LAC waits in
        flight fail with ``ClientClosedError``."""
        waiting, self._waiting = self._waiting, {}
        error = ClientClosedError(f"the client was closed during a read of ledger {self.id}")
        for fut in waiting.values():
            if not fut.done():
                fut.set_exception(error)

    def on_result(self, action) -> None:
        key = getattr(action, "read_id", None)
        if isinstance(action, ev.OpenDone):
            key = ("open", action.ledger_id)
        fut = self._waiting.pop(key, None)
        if fut is not None and not fut.done():
            fut.set_result(action)

    def _call(self, start, read_id):
        """Run ``start`` on the driver thread and wait for the result action
        whose read id is ``read_id`` (None: the open)."""
        key = read_id if read_id is not None else ("open", self.id)
        fut: Future = Future()

        def run():
            self._waiting[key] = fut
            self._driver.run(self._reader, start())

        self._driver.call(run).result()
        result = wait_result(fut, limits.CLIENT_CALL_TIMEOUT_S_MAX, f"read of ledger {self.id}")
        if result.code != OK:
            raise self._driver.error(result.code, f"ledger {self.id}")
        return result

    def _check_range(self, first_entry_id: int, last_entry_id: int) -> None:
        """Before anything is sent: ids are ints >= 0, in order, within the LAC."""
        check_entry_id("first_entry_id", first_entry_id)
        check_entry_id("last_entry_id", last_entry_id)
        if last_entry_id < first_entry_id:
            raise ValueError(f"last_entry_id ({last_entry_id}) < first_entry_id "
                             f"({first_entry_id})")
        if last_entry_id > self.last_add_confirmed:
            raise NoSuchEntryError(f"ledger {self.id}: entry {last_entry_id} is past the last "
                                   f"add confirmed ({self.last_add_confirmed})")

    def read(self, first_entry_id: int, last_entry_id: int) -> list[Entry]:
        """Entries first..last (inclusive), in order.  Reading past the LAC
        raises ``NoSuchEntryError``."""
        self._check_range(first_entry_id, last_entry_id)
        chunks = [(s, min(s + READ_CHUNK_ENTRIES - 1, last_entry_id))
                  for s in range(first_entry_id, last_entry_id + 1, READ_CHUNK_ENTRIES)]
        with self._ahead_lock:
            ahead, self._ahead = self._ahead, None
        pending = ahead[1] if ahead is not None and ahead[0] == chunks[0] else None
        speculative = pending is not None
        if pending is None:
            pending = self._start_read(*chunks[0])
        out: list[Entry] = []
        for i, chunk in enumerate(chunks):
            following = chunks[i + 1] if i + 1 < len(chunks) else self._next_range(chunk)
            started = self._start_read(*following) if following is not None else None
            done = self._finish_read(pending, chunk, retry=speculative)
            out += map(tuple.__new__, repeat(Entry), zip(
                repeat(self.id), range(chunk[0], chunk[1] + 1), map(bytes, done.payloads)))
            pending, speculative = started, False
        if pending is not None:  # the caller likely asks for it next: keep it in flight
            with self._ahead_lock:
                self._ahead = (following, pending)
        return out

    def _next_range(self, chunk: tuple[int, int]) -> tuple[int, int] | None:
        """The range of the same size after ``chunk``, if it is below the LAC."""
        last = chunk[1] + chunk[1] - chunk[0] + 1
        return (chunk[1] + 1, last) if last <= self.last_add_confirmed else None

    def _start_read(self, first: int, last: int) -> tuple[Future, Future]:
        """Start ``read(first, last)`` on the driver thread without waiting:
        (the start's future, the ``ReadDone``'s future)."""
        read_id = next(self._driver.ids)
        fut: Future = Future()

        def run():
            self._waiting[read_id] = fut
            self._driver.run(self._reader, self._reader.read(first, last, self._driver.now_ms(),
                                                             read_id=read_id))

        return self._driver.call(run), fut

    def _finish_read(self, started: tuple[Future, Future], chunk: tuple[int, int],
                     retry: bool):
        """The ``ReadDone`` of a started read; ``retry``: a read started ahead
        that failed is read again now (the caller's own attempt)."""
        try:
            started[0].result(timeout=limits.CLIENT_CALL_TIMEOUT_S_MAX)
            result = wait_result(started[1], limits.CLIENT_CALL_TIMEOUT_S_MAX,
                                 f"read of ledger {self.id}")
            if result.code == OK:
                return result
            if not retry:
                raise self._driver.error(result.code, f"ledger {self.id}")
        except BKError:
            if not retry:
                raise
        return self._finish_read(self._start_read(*chunk), chunk, retry=False)

    def learn_lac(self, entry_id: int) -> int:
        """The ledger's writer says entries up to ``entry_id`` are
        acknowledged (durable on an ack quorum): read up to there, past the
        LAC the bookies know.  Returns the LAC then."""
        return self._driver.call(lambda: self._reader.learn_lac(entry_id)).result()

    def read_lac(self) -> int:
        """Ask the bookies for the LAC now; returns it (and remembers it)."""
        read_id = next(self._driver.ids)
        done = self._call(lambda: self._reader.read_lac(self._driver.now_ms(), read_id=read_id),
                          read_id)
        return done.lac

    def wait_for_lac(self, above: int, timeout_s: float) -> int:
        """Block until the LAC exceeds ``above`` or ``timeout_s`` passed;
        returns the LAC then (``<= above`` on timeout).  The bookies are asked
        with WAIT_LAC long polls: each answers as soon as it learns a LAC past
        ``above``, so a tailing reader sees a new entry about one round trip
        after the writer's next message reached the bookies.  A CLOSED
        ledger answers at once."""
        if not isinstance(above, int) or isinstance(above, bool) or above < -1:
            raise ValueError(f"above must be an int >= -1, got {above!r}")
        if not isinstance(timeout_s, int | float) or timeout_s < 0:
            raise ValueError(f"timeout_s must be >= 0, got {timeout_s!r}")
        read_id = next(self._driver.ids)
        fut: Future = Future()
        timeout_ms = max(1, int(timeout_s * 1000))

        def run():
            self._waiting[read_id] = fut
            self._driver.run(self._reader, self._reader.wait_for_lac(
                above, timeout_ms, self._driver.now_ms(), read_id=read_id))

        self._driver.call(run).result()
        result = wait_result(fut, limits.CLIENT_CALL_TIMEOUT_S_MAX + timeout_s,
                             f"LAC wait on ledger {self.id}")
        if result.code not in (OK, BKTimeoutError.code):
            raise self._driver.error(result.code, f"ledger {self.id}")
        return result.lac

    def close(self) -> None:
        self._driver.post(self._driver.unregister, self._reader)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

"""A single background thread that performs one aligned write at a time, so the
caller (the bookie's event loop) keeps filling the next entry-log buffer while
the previous one goes to disk (double buffering).

Guarantees: writes happen in submission order, one at a time; ``wait_idle``
returns only once every submitted write completed, ``wait_done(n)`` once the
first ``n`` did (a checkpoint waits for its writes while later ones keep
coming, without being starved by them); a failed write is kept and
raised (``BookieIOError``) from every later call, never retried.  The queue is
bounded at one job: ``submit`` waits for the previous write first.
"""

from __future__ import annotations

import threading

from appliance.protocol.errors import BookieIOError

from . import aligned_io as aio

WRITE_SLICE_BYTES = 256 * 1024  # default slice: one pwrite; a multiple of 4 KiB


class BackgroundWriter:
    def __init__(self, name: str, slice_bytes: int = WRITE_SLICE_BYTES):
        self._slice = max(aio.ALIGN_BYTES, slice_bytes - slice_bytes % aio.ALIGN_BYTES)
        self._cond = threading.Condition(threading.Lock())
        self._job = None
        self._busy = False
        self._stopping = False
        self._failure: BaseException | None = None
        self.submitted_jobs = 0  # writes handed over so far (read under the caller's lock)
        self._completed_jobs = 0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, view: memoryview, fd: int, offset: int, path: str) -> None:
        """Queue one aligned write (after the previous one completed)."""
        with self._cond:
            self._wait_idle_locked()
            self._job = (view, fd, offset, path)
            self._busy = True
            self.submitted_jobs += 1
            self._cond.notify_all()

    def wait_idle(self) -> None:
        with self._cond:
            self._wait_idle_locked()

    def wait_done(self, jobs: int) -> None:
        """Wait until the first ``jobs`` submitted writes completed."""
        with self._cond:
            while self._completed_jobs < jobs and self._failure is None:
                self._cond.wait()
            if self._failure is not None:
                raise BookieIOError(f"entry log write failed: {self._failure}") from self._failure

    def failure(self) -> BaseException | None:
        return self._failure

    def _wait_idle_locked(self) -> None:
        while self._busy:
            self._cond.wait()
        if self._failure is not None:
            raise BookieIOError(f"entry log write failed: {self._failure}") from self._failure

    def close(self) -> None:
        """Let the current write finish, then stop the thread (errors are kept)."""
        with self._cond:
            while self._busy:
                self._cond.wait()
            self._stopping = True
            self._cond.notify_all()
        self._thread.join()

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._job is None and not self._stopping:
                    self._cond.wait()
                if self._job is None:
                    return
                view, fd, offset, path = self._job
            try:
                # In slices: a journal write that comes meanwhile (another
                # bookie's too: they share disks on one host) waits behind
                # one slice, not behind the whole buffer.
                step = self._slice
                for start in range(0, len(view), step):
                    aio.write_aligned(fd, view[start:start + step], offset + start, path)
            except BaseException as exc:  # noqa: BLE001 - kept and raised to callers
                self._failure = exc.with_traceback(None)
            del view
            with self._cond:
                self._job = None
                self._busy = False
                self._completed_jobs += 1
                self._cond.notify_all()

"""A self-pipe that wakes a thread blocked in a poll.

The waiting thread polls ``fd`` (readable = woken) and calls ``drain()``;
any thread calls ``wake()``.  Both ends are non-blocking: a wake while
another is pending adds nothing a drain would miss (a full pipe is still
one wake), and one ``drain()`` takes every pending wake.  ``wake()`` after
``close()`` does nothing (it never writes to a closed descriptor's number,
which the process may have handed to another file since)."""

from __future__ import annotations

import os


class WakePipe:
    __slots__ = ("fd", "_w")

    def __init__(self):
        self.fd, self._w = os.pipe()
        os.set_blocking(self.fd, False)
        os.set_blocking(self._w, False)

    def wake(self) -> None:
        w = self._w
        if w < 0:
            return
        try:
            os.write(w, b"x")
        except OSError:  # BlockingIOError: a wake is pending already
            pass

    def drain(self) -> None:
        try:
            while os.read(self.fd, 4096):
                pass
        except BlockingIOError:
            pass

    def close(self) -> None:
        w, self._w = self._w, -1
        if w >= 0:
            os.close(w)
            os.close(self.fd)

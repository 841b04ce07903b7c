"""Tells a process promptly that a log server it talks to died or was
replaced: its registration (``/logservice/servers/<id>``,
``appliance.meta.logservice``) disappeared or changed.

Why: a producer whose owner was killed otherwise learns it only when its
request times out (``LOG_PRODUCER_REQUEST_TIMEOUT_MS``).  A log server that
dies under its supervisor has its registration deleted at once (the
supervisor's ``_forget_dead_log_server``); one that dies elsewhere, when its
metadata session expires; a restarted server registers again with another
pid (on the same endpoint: a ZeroMQ socket reconnects to it silently, and
the requests the dead process had are lost).  Either way the registration
a producer connected to is gone or changed, and this watch says so within
about a poll of the store (SQLite: ``poll_interval_ms``; ZooKeeper: a
children watch; SQLite: a read of the names every
``LOG_SERVER_WATCH_POLL_MS``) instead of seconds later.

Use::

    watch = ServerWatch.of(client.logs.store)     # one per store, started once
    sub = watch.subscribe(endpoint, callback)     # or a server id
    ...                                           # callback() once, on the watch's thread
    sub.fired()                                   # True from then on
    sub.cancel()

A subscription remembers the registration the watch knows for its key when
it is made (none: the first one seen later) and fires once, when that
registration is deleted or replaced by another (any change of its record:
a new pid, endpoint or metrics address).  The watch's view may be a poll
behind: a subscription made just after a restart can fire once for it (a
producer then resends what is unacknowledged: the owner drops the
duplicates), never miss a death it made after.

Threads: one daemon thread per store (``server-watch``) reads the
registrations; it alone owns ``_known`` (server id -> its record's bytes).
``_subs`` (the subscriptions) is shared with the threads that subscribe
and cancel, under ``_lock``; a callback runs on the watch's thread outside
the lock and must only hand an event to its owner (a wake-up), never block.
The thread ends when the store is closed or ``close()`` is called.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable

from appliance.errors import BKError, ClientClosedError, NoNodeError
from appliance.meta.logservice import SERVERS_ROOT, LogServiceRegistry
from appliance.protocol import limits
from storage.metadata.sqlite_store import SqliteStore

log = logging.getLogger("appliance.logs")


class Subscription:
    """One key's watch (see the module docstring)."""

    def __init__(self, watch: ServerWatch, key: str, known: tuple | None,
                 callback: Callable[[], None] | None):
        self.key = key
        self._watch = watch
        self._registration = known  # (server id, record bytes): the watch's lock guards it
        self._callback = callback
        self._fired = threading.Event()

    def registration(self) -> tuple | None:
        """(server id, record bytes) of the registration this subscription
        knows (None: none seen yet)."""
        with self._watch._lock:
            return self._registration

    def fired(self) -> bool:
        """The registration known at subscribe time is gone or changed."""
        return self._fired.is_set()

    def wait_fired(self, timeout_s: float) -> bool:
        return self._fired.wait(timeout_s)

    def cancel(self) -> None:
        self._watch.unsubscribe(self)

    def _fire(self) -> None:
        """The watch's thread, once."""
        self._fired.set()
        if self._callback is not None:
            try:
                self._callback()
            except Exception:  # one subscriber's failure must not stop the watch
                log.exception("server watch callback for %s failed", self.key)


class ServerWatch:
    """The registrations of one store's log servers, read by a thread of its
    own; subscriptions fire when one goes or changes."""

    # the store's own watch (by the store object: an id could be reused after a close)
    _by_store: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
    _by_store_lock = threading.Lock()

    @classmethod
    def of(cls, store) -> ServerWatch:
        """The process's watch of ``store`` (made and started on first use)."""
        with cls._by_store_lock:
            watch = cls._by_store.get(store)
            if watch is None or watch._stop.is_set():
                watch = cls._by_store[store] = cls(store)
                watch.start()
            return watch

    def __init__(self, store, rescan_s: float = limits.LOG_SERVER_WATCH_RESCAN_MS / 1000,
                 poll_s: float | None = limits.LOG_SERVER_WATCH_POLL_MS / 1000):
        self._store = store
        # a store told of changes is waited on; one that would poll is polled every poll_s
        self._poll_s = poll_s if isinstance(store, SqliteStore) else None
        self._registry = LogServiceRegistry(store)
        self._rescan_s = rescan_s
        self._lock = threading.Lock()
        self._subs: list[Subscription] = []
        self._view: dict[str, tuple] = {}  # key (id or endpoint) -> (id, record): _lock
        self._known: dict[str, bytes] = {}  # the thread's own
        self._stop = threading.Event()
        self._ready = threading.Event()  # the first read is done
        self._thread = threading.Thread(target=self._run, name="server-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        with ServerWatch._by_store_lock:
            if ServerWatch._by_store.get(self._store) is self:
                del ServerWatch._by_store[self._store]
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=self._rescan_s + 5)

    def running(self) -> bool:
        """Its thread still reads (it ends with its store, or ``close()``)."""
        return self._thread.is_alive()

    def wait_ready(self, timeout_s: float) -> bool:
        """The first read of the registrations is done (a subscription made
        before knows nothing yet: it waits for the first registration of
        its key)."""
        return self._ready.wait(timeout_s)

    def subscribe(self, key: str, callback: Callable[[], None] | None = None) -> Subscription:
        """Watch the server registered as ``key`` (its id or its endpoint)."""
        with self._lock:
            sub = Subscription(self, key, self._view.get(key), callback)
            self._subs.append(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        with self._lock:
            if sub in self._subs:
                self._subs.remove(sub)

    # -- the watch's thread ---------------------------------------------------------------
    def _run(self) -> None:
        try:
            names = self._names()
            while not self._stop.is_set():
                self._read_all(names)
                self._ready.set()
                names = self._wait_for_change(names)
        except ClientClosedError:
            pass  # the store closed: the process is done with it
        finally:
            self._stop.set()
            self._ready.set()

    def _names(self) -> list[str]:
        try:
            return self._store.children(SERVERS_ROOT)
        except NoNodeError:
            return []

    def _wait_for_change(self, names: list[str]) -> list[str]:
        """The servers' names once they change, or after ``rescan_s`` (a
        record replaced between two reads of the names: re-read anyway)."""
        try:
            if self._poll_s is None:  # the store is told of changes (ZooKeeper's watches)
                changed = self._store.wait_for_children_change(SERVERS_ROOT, names,
                                                               self._rescan_s)
            else:
                changed = self._poll_children(names)
        except NoNodeError:
            self._stop.wait(self._rescan_s)  # no server registered yet
            return []
        except ClientClosedError:
            raise
        except BKError as exc:
            log.warning("log server watch: %s", exc)
            self._stop.wait(self._rescan_s)
            return names
        return names if changed is None else changed

    def _poll_children(self, names: list[str]) -> list[str] | None:
        """A store that would poll (SQLite, every ``poll_interval_ms``: 10 ms
        by default, 2% of a core per process here) is polled at this watch's
        pace instead: the names once they changed, None after ``rescan_s``."""
        deadline = time.monotonic() + self._rescan_s
        while not self._stop.wait(self._poll_s):
            now = self._names()
            if set(now) != set(names):
                return now
            if time.monotonic() >= deadline:
                return None
        return None

    def _read_all(self, names: list[str]) -> None:
        """Every registration now; the subscriptions whose one went or
        changed fire."""
        known: dict[str, bytes] = {}
        for name in names:
            try:
                known[name] = self._store.get(f"{SERVERS_ROOT}/{name}")[0]
            except NoNodeError:
                continue
            except ClientClosedError:
                raise
            except BKError as exc:  # unreadable now: keep what was known of it
                log.warning("log server watch: %s: %s", name, exc)
                if name in self._known:
                    known[name] = self._known[name]
        self._known = known
        self._publish(known)

    def _publish(self, known: dict[str, bytes]) -> None:
        view: dict[str, tuple] = {}
        for name, data in known.items():
            view[name] = (name, data)
            endpoint = _endpoint(self._registry, name, data)
            if endpoint:
                view[endpoint] = (name, data)
        due = []
        with self._lock:
            self._view = view
            for sub in list(self._subs):
                now = view.get(sub.key)
                if sub._registration is None:
                    sub._registration = now  # its first registration
                elif now != sub._registration:
                    self._subs.remove(sub)
                    due.append(sub)
        for sub in due:
            sub._fire()


def _endpoint(registry: LogServiceRegistry, name: str, data: bytes) -> str | None:
    """The endpoint a registration names (None if its record is damaged)."""
    try:
        return registry.server_record(name, data)["endpoint"]
    except BKError:
        return None

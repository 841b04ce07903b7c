"""Where a log server sends requests for logs it does not own, and the
metadata reads that decides, off its loop thread.

A request for a log not owned here needs the log's lease, the live servers
and the log's metadata (is an exclusive writer holding it?), then maybe the
lease itself: metadata round trips (a ZooKeeper ensemble's, or a SQLite
file's) that the loop serving every other log and answering pings must not
wait for.  So the request is parked, and one worker thread looks the log
up (``decide``) and hands the decision back to the loop (``post``), which
answers every request parked for that log with it:

* ``not_owner`` with the owner's endpoint: the lease holder, else the live
  server the hashing names (never a gone server: the list is read fresh);
* ``retry``: the lease is this server's id from an earlier process (its
  session must expire), the lease was just taken by another, or the
  metadata store failed (the producer resends after its back-off);
* ``held``: an exclusive writer holds the log;
* else this server took the lease: the log is opened (``LogServer.own``)
  and the requests are answered ``retry`` until it is open.

Requests for one log share one lookup; at most ``LOG_SERVICE_ROUTE_PARKED_MAX``
wait for it (then ``retry`` at once).  The live servers the periodic check
needs are read by the same worker (``refresh_servers``).

Threads: the loop thread owns ``Router`` (``_parked``, ``_refreshing``);
the worker thread runs ``decide`` and ``_read_servers`` on the server's
immutable fields (``id``, ``endpoint``, ``registry``, ``client``) and posts
their outcome.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor

from appliance.errors import BKError, NoSuchLogError
from appliance.protocol import limits
from appliance.protocol.log_owner import Answer
from appliance.protocol.log_service import owner_of

log = logging.getLogger("appliance.logservice")

SERVICE_OWNER_PREFIX = "logserver:"  # the log metadata's owner when a log server writes it


def held_by_writer(md) -> bool:
    """Is the log held by an exclusive writer (``Log.writer()``, not a log
    server)?  While it writes (its segment in progress), and also while it
    opens: it has taken the log (the epoch is its own) but not yet started
    its segment (the last segment is from an older epoch)."""
    if not md.owner or md.owner.startswith(SERVICE_OWNER_PREFIX):
        return False
    if md.in_progress is not None:
        return True
    return not md.segments or md.segments[-1].epoch != md.epoch


def _error(code: Answer, message: str, **more) -> dict:
    return {"op": "error", "code": code.value, "message": message, **more}


def decide(server, name: str) -> tuple[str, object]:
    """The worker thread: ("answer", doc) or ("taken", the session the lease
    is on) for a log ``server`` does not own."""
    registry = server.registry
    lease = registry.owner(name)
    if lease is not None and lease.get("server") != server.id:
        return "answer", _error(Answer.NOT_OWNER, f"log {name} is owned elsewhere",
                                owner=lease.get("server"), endpoint=lease["endpoint"])
    if lease is not None:  # our id, an earlier process's session: wait for its expiry
        return "answer", _error(Answer.RETRY, f"log {name}: stale lease")
    servers = registry.servers()
    target = owner_of(name, servers)
    if target is not None and target != server.id:
        return "answer", _error(Answer.NOT_OWNER, f"log {name} belongs to {target}",
                                owner=target, endpoint=servers[target]["endpoint"])
    try:
        md = server.client.logs.read_log(name)[0]
        if held_by_writer(md):
            return "answer", _error(
                Answer.HELD, f"log {name} is held by exclusive writer {md.owner}: producers "
                "wait until it closes (if it died, open log.writer() and close it: that "
                "recovers its segment)")
    except NoSuchLogError:
        pass
    session = registry.store.session_id
    if not registry.acquire(name, server.id, server.endpoint):
        return "answer", _error(Answer.RETRY, f"log {name}: lease taken")
    return "taken", session


class Router:
    """See the module docstring.  ``server``: ``post``, ``queue_reply``,
    ``own(name, session)``, ``checked(servers)``, ``stats``."""

    def __init__(self, server):
        self.server = server
        self._worker = ThreadPoolExecutor(1, "log-route")
        self._parked: dict[str, list] = {}  # log -> (identity, echoed head) waiting
        self._refreshing = False

    def route(self, identity: bytes, head: dict, name: str) -> dict | None:
        """The loop thread: an answer now (too many waiting), or None (the
        answer follows the lookup)."""
        parked = self._parked.get(name)
        if parked is None:
            self._parked[name] = [(identity, head)]
            self._worker.submit(self._look_up, name)
            return None
        if len(parked) >= limits.LOG_SERVICE_ROUTE_PARKED_MAX:
            return _error(Answer.RETRY, f"log {name}: its owner is being looked up")
        parked.append((identity, head))
        return None

    def _look_up(self, name: str) -> None:
        try:
            decision = decide(self.server, name)
        except Exception as exc:  # noqa: BLE001 - the store failed: the producers resend
            if not isinstance(exc, BKError):
                log.exception("log %s: looking up its owner failed", name)
            decision = "answer", _error(Answer.RETRY, f"log {name}: {exc}")
        self.server.post(lambda: self._decided(name, decision))

    def _decided(self, name: str, decision: tuple) -> None:
        """The loop thread: answer every request parked for ``name``."""
        kind, value = decision
        if kind == "taken":
            answer = self.server.own(name, value)
        else:
            answer = value
        parked = self._parked.pop(name, [])
        if answer.get("code") == Answer.NOT_OWNER.value:
            self.server.stats["redirects"] += len(parked)
        for identity, head in parked:
            self.server.queue_reply(identity, {**head, **answer})

    def refresh_servers(self) -> None:
        """The loop thread: read the live servers (once at a time), then
        ``server.checked(servers)`` on the loop thread."""
        if not self._refreshing:
            self._refreshing = True
            self._worker.submit(self._read_servers)

    def _read_servers(self) -> None:
        try:
            servers = self.server.registry.servers()
        except Exception as exc:  # noqa: BLE001 - the next check reads them again
            log.warning("live log servers unknown: %s", exc)
            servers = None
        self.server.post(lambda: self._servers_read(servers))

    def _servers_read(self, servers: dict | None) -> None:
        self._refreshing = False
        if servers is not None:
            self.server.checked(servers)

    def shutdown(self) -> None:
        """The loop thread, stopping: let the lookups under way end (their
        decisions are posted: run them next), start no other."""
        self._worker.shutdown(wait=True, cancel_futures=True)

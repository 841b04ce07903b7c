"""Cookies (bookie identity on every directory) and the clean-shutdown marker.

A cookie is written to the journal dir and the ledger dir at format time:
bookie id, the directory's role, both directories as formatted, and a random
instance id shared by the pair.  Open verifies both and refuses
(``CookieMismatchError``, naming the directory and the fix) when a cookie is
missing (wiped or wrong disk), unreadable, belongs to another bookie, has the
other role (directories swapped) or comes from another format (instance ids
differ).  Directory paths are recorded but not compared: moving the whole
data tree is legitimate, swapping or replacing a disk is not.

Two more markers in the ledger dir carry BP-46's "possible data loss" across
restarts: ``JOURNAL_LESS`` (adds were being acknowledged without the journal:
the mode the data was written in, not the current config, decides) and
``POSSIBLE_LOSS`` (the reasons found, kept until the bookie's phase one is
durable, so a crash in between cannot hide them).

The clean marker (``CLEAN`` in the ledger dir) is written by a clean close
after the final checkpoint and consumed (deleted, dir fsynced) by the next
open before anything is written: its absence at open means the previous run
ended uncleanly (BP-46 needs it).

Both files are JSON carrying a crc32c of their canonical form, written
atomically (temp file, fsync, rename, dir fsync).
"""

from __future__ import annotations

import json
import os
import uuid

from appliance.protocol.errors import CookieMismatchError

from . import aligned_io as aio
from .codec import crc

COOKIE_NAME = "COOKIE"
CLEAN_NAME = "CLEAN"
# Present while adds may be acknowledged without the journal (journal_write_data
# false): after an unclean shutdown, acknowledged entries may be gone.
JOURNAL_LESS_NAME = "JOURNAL_LESS"
# Possible data loss was detected and BP-46 phase one has not yet made its
# fences and limbo marks durable: every boot until then redoes phase one.
POSSIBLE_LOSS_NAME = "POSSIBLE_LOSS"
ROLES = ("journal", "ledger")


def _seal(doc: dict) -> bytes:
    body = json.dumps(doc, sort_keys=True, separators=(",", ":"))
    return json.dumps({"doc": doc, "crc32c": crc(body.encode())}, sort_keys=True).encode()


def _unseal(raw: bytes) -> dict | None:
    try:
        wrapper = json.loads(raw)
        doc = wrapper["doc"]
        body = json.dumps(doc, sort_keys=True, separators=(",", ":"))
        return doc if crc(body.encode()) == wrapper["crc32c"] else None
    except (ValueError, KeyError, TypeError):
        return None


def write_cookies(bookie_id: str, journal_dir: str, ledger_dir: str) -> str:
    """Write a fresh identity to both directories; returns the instance id."""
    instance_id = uuid.uuid4().hex
    for role, directory in zip(ROLES, (journal_dir, ledger_dir), strict=True):
        doc = {"format": 1, "bookie_id": bookie_id, "instance_id": instance_id, "role": role,
               "journal_dir": os.path.abspath(journal_dir),
               "ledger_dir": os.path.abspath(ledger_dir)}
        aio.write_file_atomic(os.path.join(directory, COOKIE_NAME), [_seal(doc)])
    return instance_id


def read_cookie(directory: str) -> dict | None:
    path = os.path.join(directory, COOKIE_NAME)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return None
    doc = _unseal(raw)
    if doc is None:
        raise CookieMismatchError(f"cookie {path} is corrupt: restore it or reformat "
                                  f"this bookie (its data is then re-replicated from peers)")
    return doc


def verify_cookies(bookie_id: str, journal_dir: str, ledger_dir: str) -> dict:
    """Check both cookies against each other and the configured bookie id."""
    docs = {}
    for role, directory in zip(ROLES, (journal_dir, ledger_dir), strict=True):
        doc = read_cookie(directory)
        if doc is None:
            raise CookieMismatchError(
                f"{role}_dir {directory} has no cookie: the directory was wiped, is a new "
                f"disk or the wrong mount. Mount the right disk, or accept the new one with "
                f"`bkctl bookie fix-cookie {bookie_id}` (or server.cookie_auto_fix = true): "
                f"the bookie then fences, limbos and repairs its ledgers from peers")
        if doc.get("bookie_id") != bookie_id:
            raise CookieMismatchError(
                f"{role}_dir {directory} belongs to bookie {doc.get('bookie_id')!r}, not "
                f"{bookie_id!r}: fix the bookie id or the directory in the config")
        if doc.get("role") != role:
            raise CookieMismatchError(
                f"{role}_dir {directory} holds the {doc.get('role')} directory's cookie: "
                f"journal_dir and ledger_dir are swapped in the config")
        docs[role] = doc
    if docs["journal"]["instance_id"] != docs["ledger"]["instance_id"]:
        raise CookieMismatchError(
            f"journal_dir {journal_dir} and ledger_dir {ledger_dir} come from different "
            f"formats (instance {docs['journal']['instance_id']} vs "
            f"{docs['ledger']['instance_id']}): one was replaced; restore it or reformat")
    return docs["ledger"]


def write_clean_marker(ledger_dir: str, instance_id: str, seq: int) -> None:
    doc = {"instance_id": instance_id, "seq": seq}
    aio.write_file_atomic(os.path.join(ledger_dir, CLEAN_NAME), [_seal(doc)])


def consume_clean_marker(ledger_dir: str, instance_id: str) -> bool:
    """True if a valid marker of this instance was present; removes it durably."""
    path = os.path.join(ledger_dir, CLEAN_NAME)
    try:
        with open(path, "rb") as f:
            doc = _unseal(f.read())
    except FileNotFoundError:
        return False
    os.unlink(path)
    aio.fsync_dir(ledger_dir)
    return doc is not None and doc.get("instance_id") == instance_id


def read_marker(ledger_dir: str, name: str) -> dict | None:
    """A marker's document; None if absent.  A damaged marker reads as
    present (``{"damaged": True}``): its meaning errs on the safe side."""
    try:
        with open(os.path.join(ledger_dir, name), "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return None
    return _unseal(raw) or {"damaged": True}


def write_marker(ledger_dir: str, name: str, doc: dict) -> None:
    aio.write_file_atomic(os.path.join(ledger_dir, name), [_seal(doc)])


def remove_marker(ledger_dir: str, name: str) -> None:
    try:
        os.unlink(os.path.join(ledger_dir, name))
    except FileNotFoundError:
        return
    aio.fsync_dir(ledger_dir)


REPLACED_MARK = "replaced (a new empty disk)"


def adopt_replaced_dir(bookie_id: str, journal_dir: str, ledger_dir: str) -> str | None:
    """One directory of the pair is new and empty while the other still holds
    this bookie's valid cookie: give the new one a cookie of the same
    instance, after recording in the ledger dir's ``POSSIBLE_LOSS`` marker
    that its data is gone.  Returns that reason, or None when the pair is
    not in that state (both cookies there, both missing, the other directory
    not this bookie's, or the new one not empty: those stay refusals)."""
    dirs = dict(zip(ROLES, (journal_dir, ledger_dir), strict=True))
    docs = {role: read_cookie(directory) for role, directory in dirs.items()}
    missing = [role for role, doc in docs.items() if doc is None]
    if len(missing) != 1:
        return None
    new_role = missing[0]
    kept = docs[ROLES[1 - ROLES.index(new_role)]]
    if kept.get("bookie_id") != bookie_id or kept.get("role") == new_role:
        return None
    new_dir = dirs[new_role]
    aio.make_dirs(new_dir)
    if [n for n in os.listdir(new_dir) if n != POSSIBLE_LOSS_NAME]:
        return None  # not empty: never adopt a directory holding something else
    reason = f"{new_role}_dir {new_dir} {REPLACED_MARK}: what it held is gone"
    found = read_marker(ledger_dir, POSSIBLE_LOSS_NAME) or {}
    reasons = [r for r in found.get("reasons", []) if r != reason] + [reason]
    write_marker(ledger_dir, POSSIBLE_LOSS_NAME, {"reasons": reasons})
    doc = {**{k: v for k, v in kept.items() if k != "role"}, "role": new_role}
    aio.write_file_atomic(os.path.join(new_dir, COOKIE_NAME), [_seal(doc)])
    return reason

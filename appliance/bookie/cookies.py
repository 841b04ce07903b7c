"""Bookie identity across its disks and the metadata store (BP-46 cookies).

Each bookie's two directories carry a cookie (``storage.cookie``: bookie id,
role, instance id of the format); the metadata store keeps a copy of the
instance id under ``/bookies/cookies/<id>``.  A disk that was wiped,
replaced or swapped shows up as a missing cookie or another instance id.

* Boot (``check_metadata_cookie``): a local instance the metadata store does
  not know means the bookie may have lost data it acknowledged.  Without
  ``server.cookie_auto_fix`` the boot is refused with one line naming
  ``bkctl bookie fix-cookie``; with it, the reason is recorded durably in the
  ledger dir (``POSSIBLE_LOSS``) *before* the metadata copy is rewritten,
  and the bookie boots through BP-46 phase one (fence and limbo every ledger
  naming it) and phase two (repair from peers).
* ``fix_cookie`` (``bkctl bookie fix-cookie ID``, bookie stopped): accept the
  bookie's current disks.  New empty directories are formatted; directories
  with valid matching cookies are kept; the metadata copy is rewritten and
  the ``POSSIBLE_LOSS`` marker makes the next start fence, limbo and repair.
  One new empty directory beside one that still holds this bookie's cookie
  is adopted (``storage.cookie.adopt_replaced_dir``: same instance; a lost
  journal replays from what is there, a lost ledger dir is rebuilt from the
  journal; either way possible loss is recorded).  Anything else (the other
  directory holds another bookie's or another format's data) is refused
  unless ``reformat`` is given, which wipes and formats both (the peers hold
  every acknowledged entry, except entries written with an ack quorum of 1).
* Both disks replaced at once (``adopt_replaced_pair``, boot with
  ``server.cookie_auto_fix``): two empty directories without cookies are
  formatted afresh and the loss recorded (``POSSIBLE_LOSS``); the
  metadata check then sees a new instance and the bookie boots through
  BP-46 phase one and repair, like ``bkctl bookie fix-cookie`` would make it.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

from appliance.errors import CookieMismatchError
from storage import LedgerStorage
from storage import cookie as ck
from storage.aligned_io import make_dirs

log = logging.getLogger("appliance.bookie")

FIX_REASON = "cookie fixed by `bkctl bookie fix-cookie`"


def check_metadata_cookie(registry, bookie_id: str, storage, *, auto_fix: bool = False) -> bool:
    """Compare the storage's identity with the metadata copy; publish it on
    first boot.  A mismatch raises ``CookieMismatchError`` naming the fix,
    or with ``auto_fix`` records possible data loss and rewrites the copy.
    True when the metadata store knew this very instance already (it
    served as this bookie before)."""
    local = _cookie_doc(bookie_id, storage.instance_id)
    found = registry.read_cookie(bookie_id)
    if found is None:
        registry.write_cookie(bookie_id, local)
        return False
    data, version = found
    try:
        remote = json.loads(data).get("instance_id")
    except (ValueError, AttributeError):
        remote = None  # unreadable: treated as another instance
    if remote == storage.instance_id:
        return True
    what = (f"bookie {bookie_id}: its directories hold instance {storage.instance_id} but "
            f"the metadata store knows instance {remote}: the disks were wiped, replaced or "
            "swapped, so data this bookie acknowledged may be lost")
    if not auto_fix:
        raise CookieMismatchError(
            f"{what}. With the bookie stopped, run `bkctl bookie fix-cookie {bookie_id}` to "
            "accept these disks (the next start fences, limbos and repairs its ledgers from "
            "peers), or set server.cookie_auto_fix = true; or restore the original disks")
    storage.note_possible_loss(f"cookie mismatch (instance {remote} replaced by "
                               f"{storage.instance_id}); fixed automatically")
    registry.write_cookie(bookie_id, local, expected_version=version)
    log.warning("%s; server.cookie_auto_fix: cookie rewritten, booting through BP-46 "
                "fence/limbo and repair", what)
    return False


PAIR_REPLACED = "journal_dir and ledger_dir both replaced (new empty disks): what they held is gone"


def adopt_replaced_pair(bookie_id: str, journal_dir: str, ledger_dir: str,
                        options) -> str | None:
    """Both directories are new: empty, so without cookies.  Format them as
    ``bookie_id`` and record durably that its data is gone; returns that
    reason, or None when the pair is not in that state (anything in either
    directory stays a refusal).  A crash between the two steps loses
    nothing: the metadata copy of the cookie names the old instance and the
    ledgers name the bookie, and either sends the next boot through BP-46."""
    dirs = (journal_dir, ledger_dir)
    for directory in dirs:
        make_dirs(directory)
        if os.listdir(directory):
            return None  # a cookie, or something not ours: never format over it
    LedgerStorage.format(bookie_id, journal_dir, ledger_dir, options)
    ck.write_marker(ledger_dir, ck.POSSIBLE_LOSS_NAME, {"reasons": [PAIR_REPLACED]})
    return PAIR_REPLACED


def _cookie_doc(bookie_id: str, instance_id: str) -> bytes:
    return json.dumps({"bookie_id": bookie_id, "instance_id": instance_id},
                      sort_keys=True).encode()


def _listing(directory: Path) -> list[str]:
    try:
        return sorted(os.listdir(directory))
    except FileNotFoundError:
        return []


def fix_cookie(config, bookie_id: str, registry, *, reformat: bool = False) -> list[str]:
    """Accept bookie ``bookie_id``'s configured disks as they are now (see the
    module docstring); returns what was done, one line each.  The bookie
    must not be running."""
    spec = config.bookie(bookie_id)
    if bookie_id in registry.available():
        raise CookieMismatchError(f"bookie {bookie_id} is running (registered): stop it "
                                  f"first (`bkctl bookie stop {bookie_id}`)")
    dirs = {"journal_dir": Path(spec.journal_dir), "ledger_dir": Path(spec.ledger_dir)}
    docs = {}
    for name, directory in dirs.items():
        try:
            docs[name] = ck.read_cookie(str(directory))
        except CookieMismatchError:
            docs[name] = {"damaged": True}
    done = []
    adopted = ck.adopt_replaced_dir(bookie_id, str(dirs["journal_dir"]), str(dirs["ledger_dir"]))
    if adopted:
        done.append(f"{adopted}; cookie written")
        docs = {name: ck.read_cookie(str(d)) for name, d in dirs.items()}
    usable = all(d is not None and d.get("bookie_id") == bookie_id and not d.get("damaged")
                 for d in docs.values()) and len({d["instance_id"] for d in docs.values()}) == 1
    if not usable:
        if all(d is None for d in docs.values()) and not any(
                _listing(d) for d in dirs.values()):
            pass  # two new empty disks: format below
        elif not reformat:
            state = "; ".join(f"{name} {dirs[name]}: " + (
                "no cookie" if d is None else "damaged cookie" if d.get("damaged")
                else f"instance {d.get('instance_id')} of bookie {d.get('bookie_id')}")
                for name, d in docs.items())
            raise CookieMismatchError(
                f"bookie {bookie_id}: its directories do not form one bookie ({state}). "
                "Pass --reformat to wipe and format both (its data is then repaired from "
                "peers; entries written with an ack quorum of 1 may exist nowhere else), "
                "or restore the missing disk")
        else:
            for name, directory in dirs.items():
                for entry in _listing(directory):
                    path = directory / entry
                    if path.is_dir() and not path.is_symlink():
                        shutil.rmtree(path)
                    else:
                        path.unlink()
                done.append(f"wiped {name} {directory}")
        for directory in dirs.values():
            make_dirs(directory)
        LedgerStorage.format(bookie_id, dirs["journal_dir"], dirs["ledger_dir"],
                             config.storage.to_options())
        docs["ledger_dir"] = ck.read_cookie(str(dirs["ledger_dir"]))
        done.append(f"formatted {bookie_id} (instance {docs['ledger_dir']['instance_id']})")
    instance_id = docs["ledger_dir"]["instance_id"]
    ck.write_marker(str(dirs["ledger_dir"]), ck.POSSIBLE_LOSS_NAME, {"reasons": [FIX_REASON]})
    done.append("the next start fences and limbos every ledger naming it, then repairs them "
                "from peers")
    found = registry.read_cookie(bookie_id)
    doc = _cookie_doc(bookie_id, instance_id)
    if found is None:
        registry.write_cookie(bookie_id, doc)
    elif found[0] != doc:
        registry.write_cookie(bookie_id, doc, expected_version=found[1])
    done.insert(0, f"metadata cookie of {bookie_id} now names instance {instance_id}")
    return done

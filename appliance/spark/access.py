"""The ``bookkeeper`` source's password check, on the driver, before any
task runs: at ``load()`` (``DataSource.schema``, which Spark calls there),
again while a batch is planned, and at a stream's first trigger.

A wrong or missing password would otherwise reach the user only from the
executors, as every bookie refusing a segment's ledger ("no replica served
it", after the task's retries), naming ledgers the user never made.  Here
it is one ``UnauthorizedError`` line naming what the user named: the log
(checked against its first live segment's password record: its ledger's,
or the cold file's), or the ledgers of option ``ledgers``, and saying
which of the three it is: wrong, none given, or given to a log or ledger
that has none.

Nothing here reads a bookie: ledger metadata and log metadata only.  A log
that does not exist yet is not checked (a batch read fails on it while
planning, a stream waits for it); a log with no segment has nothing to check.
"""

from __future__ import annotations

import appliance
from appliance.config import load_config
from appliance.errors import BKError, NoSuchLedgerError, NoSuchLogError, UnauthorizedError
from appliance.protocol.keys import check_password, master_key
from appliance.protocol.logs import COLD
from appliance.spark.options import ScanOptions, parse_options

# The options load() checks (the others are checked when the query plans).
LOAD_OPTIONS = ("config", "metadata", "log", "ledgers", "password")


def refusal(what: str, password: bytes, record: bytes | None,
            who: str = "bookkeeper source") -> str | None:
    """The one line refusing ``password`` for ``what`` ("log 'orders'",
    "ledger 42") whose password record is ``record``; None if it opens it."""
    if check_password(record, master_key(password)):
        return None
    if not password:
        return f"{who}: {what} has a password and none was given: set option password"
    if check_password(record, master_key(b"")):
        return f"{who}: {what} has no password: remove option password"
    return f"{who}: wrong password for {what}"


def require(what: str, password: bytes, record: bytes | None,
            who: str = "bookkeeper source") -> None:
    """``UnauthorizedError`` with ``refusal``'s line unless ``password`` opens it."""
    line = refusal(what, password, record, who)
    if line is not None:
        raise UnauthorizedError(line)


def segment_record(client, seg) -> bytes | None:
    """A segment's password record: its cold file's, or its ledger's."""
    if seg.tier == COLD:
        return seg.cold.password_hash
    return client.ledger_metadata(seg.ledger_id).password_hash


def check_log_password(client, name: str, md, password: bytes) -> int | None:
    """Refuse ``password`` for log ``name`` (metadata ``md``) in one line; the
    ledger id of the segment checked (None: no segment yet)."""
    for seg in md.live_segments:
        try:
            record = segment_record(client, seg)
        except NoSuchLedgerError:
            continue  # truncated or moved meanwhile: the next one tells
        require(f"log {name!r}", password, record)
        return seg.ledger_id
    return None


def check_access(client, options) -> None:
    """``load()``'s check of a scan's ``options`` (``ScanOptions``): the log's
    password, or each named ledger's; the default ledger selection skips
    what the password does not open, so it is not checked here."""
    if options.log is not None:
        try:
            md, _ = client.logs.read_log(options.log)
        except NoSuchLogError:
            return
        check_log_password(client, options.log, md, options.password)
        return
    for ledger_id in options.ledgers or ():
        try:
            record = client.ledger_metadata(ledger_id).password_hash
        except NoSuchLedgerError:
            continue  # planning says it in one line, with where it looked
        require(f"ledger {ledger_id}", options.password, record)


def open_client(scan: ScanOptions):
    """(the config or None, a connected client) of a scan's target; one
    line naming the target if the appliance cannot be reached."""
    try:
        config = load_config(scan.target) if scan.is_config else None
        return config, appliance.connect(scan.target)
    except BKError as exc:
        raise type(exc)(f"bookkeeper source: cannot reach the appliance ({scan.where}): "
                        f"{exc}") from exc


def check_load(raw) -> None:
    """``load()``'s check (``DataSource.schema``): the target, the log's or
    the named ledgers' password (the other options wait for planning: a
    stream's options are not a batch scan's)."""
    scan = parse_options({k: v for k, v in raw.items() if str(k).lower() in LOAD_OPTIONS})
    _, client = open_client(scan)
    with client:
        check_access(client, scan)

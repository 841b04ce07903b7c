"""Shared pieces of the bkctl commands: the --config option, JSON output,
payloads printed safely on a terminal, and turning library errors into
one-line ``click.ClickException`` at the edge."""

from __future__ import annotations

import functools
import json
import os
import sys

import click

from appliance.errors import BKError, UnauthorizedError

DEFAULT_CONFIG = "configs/local.toml"


def default_config_path() -> str:
    return os.environ.get("BKCTL_CONFIG") or DEFAULT_CONFIG


def config_option(f):
    """``--config PATH`` (default: $BKCTL_CONFIG, else configs/local.toml)."""
    return click.option(
        "--config",
        "config_path",
        type=click.Path(dir_okay=False),
        default=default_config_path,
        show_default="$BKCTL_CONFIG or " + DEFAULT_CONFIG,
        help="Appliance config file (TOML).",
    )(f)


def json_option(f):
    return click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")(f)


def client_knob_options(f):
    """The bench commands' client-process knobs, each a ``[client]`` key
    set for the run only: ``--gc-threshold``, ``--switch-interval-us``,
    ``--add-messages-inflight``."""
    f = click.option(
        "--add-messages-inflight", type=click.IntRange(0, 1_000), default=None,
        help="The client processes hold a ledger's fresh adds for a bookie with this many "
             "add messages awaiting replies ([client] add_messages_inflight; default: the "
             "config's, 1; 0 = no hold), to measure what the hold does with many ledgers.")(f)
    f = click.option(
        "--switch-interval-us", type=click.IntRange(min=0, max=1_000_000), default=0,
        show_default=True,
        help="The client processes raise Python's thread switch interval to N microseconds "
             "([client] switch_interval_us; 0 = Python's own 5,000), to measure what the "
             "driver and adding threads' lock swaps cost.")(f)
    return click.option(
        "--gc-threshold", type=click.IntRange(min=0), default=0, show_default=True,
        help="The client processes raise Python's youngest-generation GC threshold to N "
             "([client] gc_threshold; 0 = Python's own), to measure what the garbage "
             "collector costs with many ledgers.")(f)


def _unauthorized_line(exc: UnauthorizedError, kwargs: dict) -> str:
    """A refused password in the CLI's words: when the command was given no
    password (``password`` "" or ``passwords`` empty, from
    ``password_options``), the ledger or log needs one, and how to give it;
    ``--force`` where the library says ``force=True``."""
    given = kwargs.get("password", kwargs.get("passwords"))
    password_check = str(exc).startswith("wrong password") or " has a password" in str(exc)
    if given is None or given or not password_check:
        # a password was given, or the refusal is not the password check's
        # (a bookie refusing this client's CURVE key, say): the library's words
        return f"UnauthorizedError: {str(exc).replace('force=True', '--force')}"
    if "ledger_id" in kwargs:
        what = f"ledger {kwargs['ledger_id']}"
    elif "name" in kwargs:
        what = f"log {kwargs['name']}"
    else:
        what = "it"
    line = (f"UnauthorizedError: {what} has a password and none was given: give it with "
            f"--password-file, ${PASSWORD_ENV} or --ask-password")
    if "force" in kwargs:
        line += " (or --force to delete without it; logged)"
    return line


def library_errors(f):
    """Turn appliance errors into one line on stderr and a non-zero exit."""

    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        try:
            return f(*args, **kwargs)
        except UnauthorizedError as exc:
            raise click.ClickException(_unauthorized_line(exc, kwargs)) from exc
        except BKError as exc:
            raise click.ClickException(f"{type(exc).__name__}: {exc}") from exc
        except BrokenPipeError:
            raise  # stdout's reader went away: bkctl's group ends quietly (cli/main.py)
        except (OSError, ValueError, TypeError) as exc:
            raise click.ClickException(str(exc)) from exc

    return wrapper


def human_bytes(n: float) -> str:
    """A byte count as people read it: ``812 B``, ``25.3 KB``, ``4.2 MB``,
    ``1.5 GB``, ``2.0 TB`` (decimal units, as disks are sold)."""
    if abs(n) < 1000:
        return f"{n:.0f} B"
    for unit in ("KB", "MB", "GB"):
        n /= 1000
        if abs(round(n, 1)) < 1000:
            return f"{n:.1f} {unit}"
    return f"{n / 1000:.1f} TB"


def echo_json(doc) -> None:
    click.echo(json.dumps(doc, sort_keys=True))


def echo_list(items, as_json: bool) -> None:
    """``items`` as one JSON list with ``--json``, else one a line."""
    if as_json:
        echo_json(items)
    else:
        for item in items:
            click.echo(item)


def list_command(group: click.Group, what: str, listing) -> click.Command:
    """Add ``bkctl GROUP list [--json]`` to ``group``: ``listing(config_path)``
    gives the items (``what`` names them in the help), printed by
    ``echo_list``."""

    @json_option
    @config_option
    @library_errors
    def list_(as_json, config_path):
        echo_list(listing(config_path), as_json)

    list_.__doc__ = f"""List {what}.

    \b
    Example:
      bkctl {group.name} list --json
    """
    return group.command(name="list")(list_)


def is_terminal() -> bool:
    return sys.stdout.isatty()


ESCAPED_NOTE = ("bkctl: payloads that are not printable text are shown escaped (\\xNN); "
                "--json gives their exact bytes (base64), and so does a pipe or a file")


class PayloadLines:
    """Payloads as output lines.  To a pipe or a file, the raw bytes (scripts
    depend on them).  On a terminal (``is_tty``), a payload that is not
    printable UTF-8 text is written with Python-bytes escapes (``\\x1b``,
    ``\\n``; no control byte reaches the terminal, one payload stays one
    line), and stderr says once, at the first, how to get the exact bytes."""

    def __init__(self, is_tty: bool):
        self.is_tty = is_tty
        self.escaped = False  # the note was given

    def line(self, payload) -> bytes:
        payload = bytes(payload)
        if not self.is_tty or _printable(payload):
            return payload + b"\n"
        if not self.escaped:
            self.escaped = True
            click.echo(ESCAPED_NOTE, err=True)
        return repr(payload)[2:-1].encode("ascii") + b"\n"


def _printable(payload: bytes) -> bool:
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return text.replace("\t", " ").isprintable()


PASSWORD_ENV = "BKCTL_PASSWORD"
_VISIBLE = ("--password is visible to other local users (ps, shell history): prefer "
            f"--password-file, ${PASSWORD_ENV} or --ask-password.")


def _read_password_file(path: str) -> list[str]:
    """The passwords in a file: one per line, the line ending stripped (a
    password may hold spaces); blank lines are skipped."""
    try:
        with open(path, encoding="utf-8") as fh:
            lines = [line.rstrip("\r\n") for line in fh]
    except OSError as exc:
        raise click.BadParameter(f"cannot read {path}: {exc.strerror}",
                                 param_hint="--password-file") from None
    except UnicodeDecodeError:
        raise click.BadParameter(f"{path} is not UTF-8 text",
                                 param_hint="--password-file") from None
    return [line for line in lines if line]


def password_options(help_text: str, multiple: bool = False):
    """``--password`` (kept, documented as visible), ``--password-file PATH``,
    ``$BKCTL_PASSWORD`` and ``--ask-password`` (a hidden prompt).  The command
    gets ``password`` (a str; "" = none) or, with ``multiple``, ``passwords``
    (a list: every --password, every line of the file, the variable).  One
    source at a time for a single password: two are a usage error, so a
    forgotten variable never silently wins."""

    def decorate(f):
        @functools.wraps(f)
        def wrapper(*args, password, password_file, ask_password, **kwargs):
            given = list(password) if multiple else ([password] if password else [])
            from_file = _read_password_file(password_file) if password_file else []
            env = os.environ.get(PASSWORD_ENV)
            if password_file and not from_file:
                raise click.BadParameter(f"{password_file} holds no password",
                                         param_hint="--password-file")
            if ask_password:
                given.append(click.prompt("Password", hide_input=True, err=True))
            sources = sum(bool(x) for x in (given, from_file))
            if multiple:
                found = given + from_file + ([env] if env and not sources else [])
                return f(*args, passwords=tuple(found), **kwargs)
            if sources > 1 or len(given) > 1 or len(from_file) > 1:
                raise click.UsageError("give the password once: --password, --password-file "
                                       "(one line) or --ask-password")
            found = (given or from_file or [env or ""])[0]
            return f(*args, password=found, **kwargs)

        wrapper = click.option("--ask-password", is_flag=True,
                               help="Prompt for the password (not echoed).")(wrapper)
        wrapper = click.option("--password-file", type=click.Path(dir_okay=False),
                               help="Read the password from this file (first line"
                                    + ("; one per line" if multiple else "") + ").")(wrapper)
        wrapper = click.option("--password", multiple=multiple,
                               default=() if multiple else "",
                               help=f"{help_text} Also ${PASSWORD_ENV}. {_VISIBLE}")(wrapper)
        return wrapper

    return decorate

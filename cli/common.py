"""Shared pieces of the bkctl commands: the --config option, JSON output and
turning library errors into one-line ``click.ClickException`` at the edge."""

from __future__ import annotations

import functools
import json
import os
import sys

import click

from appliance.errors import BKError

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


def library_errors(f):
    """Turn appliance errors into one line on stderr and a non-zero exit."""

    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        try:
            return f(*args, **kwargs)
        except BKError as exc:
            raise click.ClickException(f"{type(exc).__name__}: {exc}") from exc
        except (OSError, ValueError, TypeError) as exc:
            raise click.ClickException(str(exc)) from exc

    return wrapper


def echo_json(doc) -> None:
    click.echo(json.dumps(doc, sort_keys=True))


def is_terminal() -> bool:
    return sys.stdout.isatty()

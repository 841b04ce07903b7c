"""How a config is refused: one ``Refusal`` (key, problem, fix) raised
where a rule breaks, turned into one ``ConfigError`` line at the edge
(``<file>: <key>: <problem>; fix: <what to do>``)."""

from __future__ import annotations

import difflib

from appliance.errors import ConfigError


class Refusal(Exception):
    def __init__(self, key: str, problem: str, fix: str):
        super().__init__(key, problem, fix)
        self.key, self.problem, self.fix = key, problem, fix


def suggest(name: str, known, fmt: str = "{}") -> str:
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    listing = ", ".join(fmt.format(k) for k in known)
    return f"did you mean {fmt.format(close[0])}?" if close else f"use one of {listing}"


def as_config_error(where, refusal: Refusal) -> ConfigError:
    """The one line a user sees: ``<where>: <key>: <problem>; fix: <fix>``."""
    return ConfigError(f"{where}: {refusal.key}: {refusal.problem}; fix: {refusal.fix}")

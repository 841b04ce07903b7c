"""Fenced code blocks of the project's Markdown documents, for the tests that
run them (so the docs cannot drift from the product).

``blocks(path)`` returns every fenced block (```` ```lang ```` ... ```` ``` ````)
with its language tag, its text and the line it starts on.  A block the
tests must not run (``make run``, which stays in the foreground; a sketch
with placeholders) is preceded, on the line right above its fence, by an
HTML comment the reader never sees::

    <!-- doc-test: skip (why it cannot run as written) -->

The reason is required: a skip without one is refused, so every block that
is not run says why in the document itself.  Unterminated fences are
refused too (a Markdown renderer would swallow the rest of the page).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

FENCE = re.compile(r"^(\s*)```([A-Za-z0-9_+-]*)\s*$")
SKIP = re.compile(r"^\s*<!--\s*doc-test:\s*skip\s*(?:\((?P<why>[^)]*)\))?\s*-->\s*$")


class DocBlockError(ValueError):
    """A document whose blocks cannot be read as the tests need them."""


@dataclass(frozen=True)
class Block:
    path: str
    line: int            # 1-based line of the opening fence
    lang: str            # "" when the fence names none
    text: str            # the block's lines, the fence's indentation removed
    skip_reason: str | None

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"

    def __str__(self) -> str:  # pytest ids and failure messages
        return f"{self.where} ({self.lang or 'no language'})"


def parse(text: str, path: str = "<doc>") -> list[Block]:
    """Every fenced block of ``text``, in order."""
    lines = text.splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, lang, start = m.group(1), m.group(2), i
        body: list[str] = []
        i += 1
        while i < len(lines) and not re.match(rf"^{re.escape(indent)}```\s*$", lines[i]):
            body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i])
            i += 1
        if i >= len(lines):
            raise DocBlockError(f"{path}:{start + 1}: code block never closed")
        out.append(Block(path, start + 1, lang, "\n".join(body) + "\n",
                         _skip_reason(lines, start, path)))
        i += 1
    return out


def _skip_reason(lines: list[str], fence_index: int, path: str) -> str | None:
    if fence_index == 0:
        return None
    m = SKIP.match(lines[fence_index - 1])
    if not m:
        return None
    why = (m.group("why") or "").strip()
    if not why:
        raise DocBlockError(f"{path}:{fence_index}: 'doc-test: skip' needs a reason in parentheses")
    return why


def blocks(path: str | Path, langs: tuple[str, ...] | None = None) -> list[Block]:
    """The blocks of the file at ``path`` (only those in ``langs`` if given)."""
    p = Path(path)
    found = parse(p.read_text(encoding="utf-8"), str(p))
    return [b for b in found if langs is None or b.lang in langs]

"""How `bkctl ledger read` / `bkctl log read` print payloads: raw bytes to a
pipe or a file, escaped on a terminal with one note on stderr (the
terminal case of a real subprocess: tests/integration/test_cli_listing.py)."""

from __future__ import annotations

import pytest

from cli.common import ESCAPED_NOTE, PayloadLines


@pytest.fixture
def lines_of(capsys):
    def lines_of(is_tty: bool, payloads: list[bytes]) -> tuple[list[bytes], str]:
        """(lines, stderr) of printing ``payloads`` through one ``PayloadLines``."""
        lines = PayloadLines(is_tty)
        out = [lines.line(p) for p in payloads]
        return out, capsys.readouterr().err

    return lines_of


BINARY = [b"\x00\x01\xfe\xff", b"\x1b[2J\x1b[31mred", b"two\nlines\r"]
TEXT = [b"plain", b"caf\xc3\xa9 \xe2\x82\xac", b"tab\tseparated", b""]


@pytest.mark.parametrize("payload", BINARY + TEXT)
def test_a_pipe_or_a_file_gets_the_exact_bytes_and_no_note(lines_of, payload):
    assert lines_of(False, [payload]) == ([payload + b"\n"], "")


def test_a_terminal_gets_printable_text_as_it_is(lines_of):
    assert lines_of(True, TEXT) == ([p + b"\n" for p in TEXT], "")


def test_a_terminal_gets_other_payloads_escaped_one_a_line_and_the_note_once(lines_of):
    out, err = lines_of(True, TEXT[:1] + BINARY + TEXT[1:2])
    assert out == [b"plain\n", b"\\x00\\x01\\xfe\\xff\n", b"\\x1b[2J\\x1b[31mred\n",
                   b"two\\nlines\\r\n", b"caf\xc3\xa9 \xe2\x82\xac\n"]
    assert all(b not in line[:-1] for line in out for b in (b"\x1b", b"\n", b"\r", b"\x00"))
    assert err == ESCAPED_NOTE + "\n" and "--json" in err
    for line, payload in zip(out[1:4], BINARY, strict=True):  # Python-bytes escapes
        assert eval("b'" + line[:-1].decode() + "'") == payload  # noqa: S307 - test

"""Passwords reach bkctl without the command line: --password-file,
$BKCTL_PASSWORD, --ask-password (hidden prompt); --password still works and
its help says it is visible to other users."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

import cli.ledger as ledger_cli
import cli.log as log_cli
from appliance.errors import UnauthorizedError
from cli.common import PASSWORD_ENV, password_options
from cli.main import cli as bkctl


@click.command()
@password_options("Ledger password.")
def one(password):
    click.echo(f"[{password}]")


@click.command()
@password_options("Ledger passwords.", multiple=True)
def many(passwords):
    click.echo("|".join(passwords))


def _run(cmd, args, env=None, input=None):
    result = CliRunner().invoke(cmd, args, env={PASSWORD_ENV: None, **(env or {})},
                                input=input)
    return result.exit_code, result.output


def test_each_source_gives_the_password(tmp_path):
    secret = tmp_path / "pw"
    secret.write_text("s3cret with spaces\n")
    assert _run(one, ["--password", "a"]) == (0, "[a]\n")
    assert _run(one, ["--password-file", str(secret)]) == (0, "[s3cret with spaces]\n")
    assert _run(one, [], env={PASSWORD_ENV: "from-env"}) == (0, "[from-env]\n")
    code, out = _run(one, ["--ask-password"], input="typed\n")
    assert code == 0 and out.endswith("[typed]\n") and "typed\n[" not in out  # not echoed
    assert _run(one, []) == (0, "[]\n")  # none


def test_an_explicit_source_wins_over_the_variable_and_two_sources_are_refused(tmp_path):
    secret = tmp_path / "pw"
    secret.write_text("file\n")
    assert _run(one, ["--password", "flag"], env={PASSWORD_ENV: "env"}) == (0, "[flag]\n")
    assert _run(one, ["--password-file", str(secret)], env={PASSWORD_ENV: "env"}) == \
        (0, "[file]\n")
    code, out = _run(one, ["--password", "a", "--password-file", str(secret)])
    assert code == 2 and "give the password once" in out


def test_bad_password_files_are_one_clear_error(tmp_path):
    code, out = _run(one, ["--password-file", str(tmp_path / "missing")])
    assert code == 2 and "cannot read" in out
    empty = tmp_path / "empty"
    empty.write_text("\n")
    code, out = _run(one, ["--password-file", str(empty)])
    assert code == 2 and "holds no password" in out
    binary = tmp_path / "bin"
    binary.write_bytes(b"\xff\xfe\x00")
    code, out = _run(one, ["--password-file", str(binary)])
    assert code == 2 and "not UTF-8" in out


def test_several_passwords_from_flags_file_or_variable(tmp_path):
    pwfile = tmp_path / "pws"
    pwfile.write_text("one\ntwo\n\n")
    assert _run(many, ["--password", "a", "--password", "b"]) == (0, "a|b\n")
    assert _run(many, ["--password-file", str(pwfile)]) == (0, "one|two\n")
    assert _run(many, ["--password", "a", "--password-file", str(pwfile)]) == (0, "a|one|two\n")
    assert _run(many, [], env={PASSWORD_ENV: "env"}) == (0, "env\n")


@pytest.mark.parametrize("args", [["ledger", "read"], ["ledger", "create"], ["log", "read"],
                                  ["bookie", "recover"]])
def test_help_says_the_flag_is_visible_and_names_the_alternatives(args):
    from cli.main import cli

    out = CliRunner().invoke(cli, [*args, "--help"]).output
    assert "--password-file" in out and "--ask-password" in out and PASSWORD_ENV in out
    assert "visible to other local users" in " ".join(out.split())


class _Refusing:
    """A connection whose every call is refused with the library's own
    words (the real messages of ``Client.delete_ledger`` / ``open_ledger``)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def delete_ledger(self, ledger_id, password, force=False):
        if password is not None:
            raise UnauthorizedError(f"wrong password for ledger {ledger_id}: not deleted")
        raise UnauthorizedError(f"ledger {ledger_id} has a password: give it to delete "
                                "(or force=True, the metadata owner's override); not deleted")

    def open_ledger(self, ledger_id, password, recovery=False):
        raise UnauthorizedError(f"wrong password for ledger {ledger_id}")

    def log(self, name, password):
        raise UnauthorizedError(f"wrong password for log {name}")


class _CurveRefused(_Refusing):
    def open_ledger(self, ledger_id, password, recovery=False):
        raise UnauthorizedError("bookie bookie-1 refused this client's CURVE key")


@pytest.fixture
def refusing(monkeypatch):
    monkeypatch.setattr(ledger_cli, "_connect", lambda config_path: _Refusing())
    monkeypatch.setattr(log_cli, "_connect", lambda config_path: _Refusing())
    return lambda *args, env=None: CliRunner().invoke(
        bkctl, list(args), env={PASSWORD_ENV: None, **(env or {})})


def test_no_password_says_the_ledger_needs_one_and_how_to_give_it(refusing):
    for args in (["ledger", "read", "7"], ["log", "read", "events"]):
        result = refusing(*args)
        assert result.exit_code == 1
        line = result.output.strip()
        assert "wrong password" not in line and "none was given" in line, line
        assert "--password-file" in line and PASSWORD_ENV in line and "--ask-password" in line
    assert "ledger 7 has a password" in refusing("ledger", "read", "7").output
    # a password that was given and refused is still a wrong password
    wrong = refusing("ledger", "read", "7", env={PASSWORD_ENV: "nope"})
    assert wrong.exit_code == 1 and "wrong password for ledger 7" in wrong.output


def test_a_delete_refusal_names_the_cli_flag_not_the_python_keyword(refusing):
    result = refusing("ledger", "delete", "7")
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1
    assert "--force" in result.output and "force=True" not in result.output
    assert "--password-file" in result.output
    wrong = refusing("ledger", "delete", "7", env={PASSWORD_ENV: "nope"})
    assert "wrong password for ledger 7: not deleted" in wrong.output


def test_a_refusal_that_is_not_the_password_check_keeps_the_library_s_words(monkeypatch):
    # no password given, but the bookie refused the client's key: saying the
    # ledger needs a password would send the user the wrong way
    monkeypatch.setattr(ledger_cli, "_connect", lambda config_path: _CurveRefused())
    result = CliRunner().invoke(bkctl, ["ledger", "read", "7"], env={PASSWORD_ENV: None})
    assert result.exit_code == 1
    assert "refused this client's CURVE key" in result.output
    assert "none was given" not in result.output

"""``[security]`` (CURVE) settings: refused with one clear line when wrong,
at load (``load_config``) or before anything starts (``check_host``, the
bookie, ``appliance.connect``); and ``bkctl keys generate``."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest
from click.testing import CliRunner

from appliance.config import load_config
from appliance.config.host_checks import check_host
from appliance.curve import client_curve, generate_keys, server_curve
from appliance.errors import ConfigError
from cli.main import cli
from ipc.curve import load_key_pair
from tests.test_config import minimal, refusal, write


def _tcp(text: str) -> str:
    return text.replace('"ipc://data/b0.sock"', '"tcp://127.0.0.1:3181"')


def _keys(tmp_path):
    generate_keys("host", tmp_path / "keys")
    (tmp_path / "authorized").mkdir()
    return tmp_path / "keys" / "host.key_secret"


def test_security_is_off_by_default_and_loads_when_complete(tmp_path):
    assert load_config(write(tmp_path, minimal(3))).security.curve is False
    config = load_config(write(tmp_path, minimal(3, '\n[security]\ncurve = true\n'
                                                'key_file = "keys/h.key_secret"\n'
                                                'authorized_keys_dir = "authorized"\n')))
    assert config.security.key_file == tmp_path / "keys" / "h.key_secret"
    assert config.security.authorized_keys_dir == tmp_path / "authorized"


@pytest.mark.parametrize("extra, key, fix", [
    ("curve = true\n", "security.key_file", "bkctl keys generate NAME"),
    ('curve = "yes"\n', "security.curve", "write true or false"),
    ('key_fle = "k"\n', "security.key_fle", "did you mean key_file?"),
    ('curve = false\ntrusted_keys_dir = ""\n', "security.trusted_keys_dir", "quote the value"),
])
def test_bad_security_settings_are_refused_with_one_line(tmp_path, extra, key, fix):
    message = refusal(tmp_path, minimal(3, "\n[security]\n" + extra))
    assert f": {key}: " in message and fix in message, message


def test_check_host_refuses_unusable_keys_before_anything_starts(tmp_path):
    key_file = _keys(tmp_path)
    text = _tcp(minimal(3, f'\n[security]\ncurve = true\nkey_file = "{key_file}"\n'))
    config = load_config(write(tmp_path, text))
    with pytest.raises(ConfigError, match="security.authorized_keys_dir: unset is not a dir"):
        check_host(config)
    config = load_config(write(tmp_path, text + 'authorized_keys_dir = "authorized"\n'))
    assert server_curve(config, "b0")[0] == load_key_pair(key_file)
    os.chmod(key_file, 0o640)
    with pytest.raises(ConfigError, match=r"security.key_file: .* readable by other accounts "
                                          r"\(mode 640\); fix: chmod 600"):
        check_host(config)
    os.unlink(key_file)
    with pytest.raises(ConfigError, match="security.key_file: cannot read"):
        server_curve(config, "b0")


def test_ipc_bookies_never_use_curve(tmp_path):
    key_file = _keys(tmp_path)
    config = load_config(write(tmp_path, minimal(3, f'\n[security]\ncurve = true\n'
                                                  f'key_file = "{key_file}"\n')))
    assert server_curve(config, "b0") is None  # no authorized_keys_dir needed either
    assert client_curve(config).keys == load_key_pair(key_file)  # clients still use it


def test_connect_keywords_need_a_key_and_win_over_the_config(tmp_path):
    key_file = _keys(tmp_path)
    with pytest.raises(ValueError, match="trusted_keys_dir needs curve_key_file"):
        client_curve(None, None, tmp_path / "authorized")
    with pytest.raises(ConfigError, match="trusted_keys_dir: .* is not a directory"):
        client_curve(None, key_file, tmp_path / "nowhere")
    assert client_curve(None, None, None) is None
    curve = client_curve(None, key_file, tmp_path / "authorized")
    assert curve.keys == load_key_pair(key_file)
    assert curve.trusted.directory == tmp_path / "authorized"
    with pytest.raises(ConfigError, match="curve_key_file: .* holds no secret key"):
        os.chmod(tmp_path / "keys" / "host.key", 0o600)
        client_curve(None, tmp_path / "keys" / "host.key")


def test_docs_describe_the_security_keys():
    from tests.test_config import REPO

    text = (REPO / "docs" / "SECURITY.md").read_text()
    assert "## Network: CURVE" in text and "trusted_keys_dir" in text


# -- bkctl keys generate --------------------------------------------------------------
def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_keys_generate_writes_a_pair_and_never_overwrites(tmp_path):
    runner = CliRunner()
    keys_dir = tmp_path / "new" / "keys"
    result = runner.invoke(cli, ["keys", "generate", "host-a", "--dir", str(keys_dir)])
    assert result.exit_code == 0, result.output
    public = load_key_pair(keys_dir / "host-a.key_secret").public
    assert result.stdout.strip() == public.decode()
    assert _mode(keys_dir / "host-a.key_secret") == 0o600
    assert _mode(keys_dir) == 0o700
    assert f'public-key = "{public.decode()}"' in (keys_dir / "host-a.key").read_text()
    assert "secret" not in (keys_dir / "host-a.key").read_text().split("curve", 1)[1]
    before = (keys_dir / "host-a.key_secret").read_bytes()
    again = runner.invoke(cli, ["keys", "generate", "host-a", "--dir", str(keys_dir)])
    assert again.exit_code == 1 and "exists: not overwritten" in again.output
    assert (keys_dir / "host-a.key_secret").read_bytes() == before
    bad = runner.invoke(cli, ["keys", "generate", "../escape", "--dir", str(keys_dir)])
    assert bad.exit_code == 1 and "key name '../escape'" in bad.output
    assert sorted(p.name for p in keys_dir.iterdir()) == ["host-a.key", "host-a.key_secret"]


def test_keys_generate_as_a_real_command(tmp_path):
    bkctl = os.path.join(os.path.dirname(sys.executable), "bkctl")
    done = subprocess.run([bkctl, "keys", "generate", "b1", "--dir", str(tmp_path / "k")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.strip()) == 40  # the Z85 public key
    assert "b1.key_secret (secret, 0600)" in done.stderr

"""``[cold_storage]`` in the config and its store: a directory resolves
against the config's folder, off when unset, bad URIs and misplaced keys are
one clear line, S3 keys come from an owner-only file and never show in a
printed URI, and ``bkctl log offload`` without cold storage says how to turn
it on."""

from __future__ import annotations

import pytest

from appliance.cold.store import ColdStore, read_s3_credentials
from appliance.config import load_config
from appliance.errors import ConfigError
from tests.support.bkctl import bkctl
from tests.test_config import minimal, write


def _load(tmp_path, section: str):
    return load_config(write(tmp_path, minimal(extra=f"[cold_storage]\n{section}\n")))


def test_a_directory_resolves_against_the_config_and_unset_is_off(tmp_path):
    cold = _load(tmp_path, 'uri = "data/cold"').cold_storage
    assert cold.uri == (tmp_path / "data" / "cold").as_uri()
    assert ColdStore.from_config(cold).local
    assert _load(tmp_path, 'uri = ""').cold_storage.uri == ""
    assert load_config(write(tmp_path, minimal())).cold_storage.uri == ""
    assert _load(tmp_path, 'uri = "s3://b/p?region=x"').cold_storage.uri == "s3://b/p?region=x"


@pytest.mark.parametrize("section, words", [
    ('uri = "hdfs://nn/cold"', "cold_storage.uri: 'hdfs://nn/cold' has an unsupported scheme"),
    ('uri = "data/cold"\ncredentials_file = "k"', "cold_storage.credentials_file: applies to s3"),
    ("offload_after_ms = -1", "cold_storage.offload_after_ms: -1 is out of range"),
    ('urii = "x"', "cold_storage.urii: unknown key"),
])
def test_bad_cold_storage_keys_are_one_line(tmp_path, section, words):
    with pytest.raises(ConfigError) as exc:
        _load(tmp_path, section)
    assert words in str(exc.value) and "\n" not in str(exc.value)


def test_s3_keys_come_from_an_owner_only_file_and_are_never_printed(tmp_path):
    keys = tmp_path / "cold-s3"
    keys.write_text("AKIA:very-secret\n")
    keys.chmod(0o640)
    with pytest.raises(ConfigError, match="open to other users.*chmod 600"):
        read_s3_credentials(keys)
    keys.chmod(0o600)
    assert read_s3_credentials(keys) == ("AKIA", "very-secret")
    keys.write_text("no colon here\n")
    with pytest.raises(ConfigError, match="one line access_key:secret_key"):
        read_s3_credentials(keys)
    with pytest.raises(ConfigError, match="unknown option.*access_key") as exc:
        ColdStore("s3://bucket/p?access_key=AKIA&secret_key=very-secret")
    assert "very-secret" not in str(exc.value)


def test_offload_without_cold_storage_says_how_to_turn_it_on(tmp_path):
    config = write(tmp_path, minimal())
    done = bkctl("log", "offload", "orders", config=config, text=True)
    assert done.returncode != 0
    assert "cold storage is off: set [cold_storage] uri" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1

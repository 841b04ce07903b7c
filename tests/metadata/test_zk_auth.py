"""ZooKeeper digest ACLs: with ``[metadata] auth_file`` every node is the
appliance's alone; a client without the credentials (or with wrong ones)
can neither change nor read metadata and gets ``MetadataAuthError``."""

from __future__ import annotations

import os

import pytest
from kazoo.client import KazooClient

import appliance
from appliance.bench import launcher
from appliance.config import load_config
from appliance.config.host_checks import check_host
from appliance.errors import ConfigError, MetadataAuthError
from storage.metadata import open_store
from storage.metadata.zk_auth import read_credentials


def _auth_file(path, text="appliance:s3cret-pass", mode=0o600):
    path.write_text(text + "\n")
    os.chmod(path, mode)
    return path


@pytest.mark.parametrize(("text", "mode", "words"), [
    ("appliance:pw", 0o644, "open to other users"),
    ("appliance:pw", 0o660, "chmod 600"),
    ("no-colon", 0o600, "user:password"),
    (":pw", 0o600, "user:password"),
    ("a:b\nc:d", 0o600, "one line"),
    ("a: b", 0o600, "no spaces"),
])
def test_bad_credential_files_are_refused_with_the_fix(tmp_path, text, mode, words):
    path = _auth_file(tmp_path / "auth", text, mode)
    with pytest.raises(ConfigError, match=words) as info:
        read_credentials(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_a_missing_credential_file_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="cannot read it"):
        read_credentials(tmp_path / "nope")


def test_credentials_are_read(tmp_path):
    assert read_credentials(_auth_file(tmp_path / "a")) == ("appliance", "s3cret-pass")


def test_without_credentials_nothing_can_be_changed_or_read(zookeeper, tmp_path):
    uri = zookeeper.new_uri("acl")
    auth = _auth_file(tmp_path / "auth")
    wrong = _auth_file(tmp_path / "wrong", "appliance:guess")
    with open_store(uri, auth_file=str(auth)) as owner:
        owner.create("/ledgers/L1", b"secret record", make_parents=True)
        root = owner.chroot
        for options in ({}, {"auth_file": str(wrong)}):
            with pytest.raises(MetadataAuthError, match="auth_file"):
                open_store(uri, **options)  # the chroot is closed to it
            with open_store(f"zk://{zookeeper.hosts}", **options) as stranger:
                for attempt in (lambda: stranger.create(f"{root}/ledgers/L2", b"x"),
                                lambda: stranger.set(f"{root}/ledgers/L1", b"y", 0),
                                lambda: stranger.delete(f"{root}/ledgers/L1", 0),
                                lambda: stranger.get(f"{root}/ledgers/L1"),
                                lambda: stranger.create(f"{root}/other", b"x")):
                    with pytest.raises(MetadataAuthError, match="auth_file"):
                        attempt()
        assert owner.get("/ledgers/L1") == (b"secret record", 0)


def test_the_chroot_itself_carries_the_owner_only_acl(zookeeper, tmp_path):
    uri = zookeeper.new_uri("chroot")
    with open_store(uri, auth_file=str(_auth_file(tmp_path / "auth"))) as store:
        chroot = store.chroot
    zk = KazooClient(hosts=zookeeper.hosts, auth_data=[("digest", "appliance:s3cret-pass")])
    zk.start(timeout=10)
    try:
        acls, _stat = zk.get_acls(chroot)
    finally:
        zk.stop()
        zk.close()
    assert [(a.id.scheme, a.id.id.split(":")[0], a.perms) for a in acls] == [
        ("digest", "appliance", 31)]


def _config(tmp_path, uri, **metadata):
    return launcher.write_config(tmp_path / "appliance.toml", 1,
                                 metadata={"uri": uri, **metadata},
                                 client={"ensemble": 1, "write_quorum": 1, "ack_quorum": 1})


def test_a_client_without_auth_file_gets_a_clear_error(zookeeper, tmp_path):
    uri = zookeeper.new_uri("client")
    auth = _auth_file(tmp_path / "auth")
    config = load_config(_config(tmp_path, uri, auth_file="auth"))
    assert config.metadata.auth_file == auth
    with appliance.connect(str(config.path)) as bk:
        assert bk.list_ledgers() == []
        assert bk.registry.available() == {}
    with pytest.raises(MetadataAuthError, match="auth_file") as info:
        with appliance.connect(uri) as bk:
            bk.create_ledger(ensemble=1, write_quorum=1, ack_quorum=1, password=b"pw")
    assert "no or wrong digest credentials" in str(info.value)


def test_auth_file_is_refused_with_sqlite_and_checked_by_the_host_check(tmp_path):
    with pytest.raises(ConfigError, match="metadata.auth_file: applies to ZooKeeper"):
        load_config(_config(tmp_path, "sqlite:///meta.db", auth_file="auth"))
    _auth_file(tmp_path / "auth", mode=0o640)
    config = load_config(_config(tmp_path, "zk://127.0.0.1:1/x", auth_file="auth"))
    with pytest.raises(ConfigError, match="open to other users"):
        check_host(config)

"""Cold storage on an S3-compatible object store: moto's server (``moto[server]``
from PyPI, the dev extra), started by the test on a free port.  Keys come
from an owner-only ``credentials_file``; the same moves, reads, truncation
and crash recovery as on a directory."""

from __future__ import annotations

import json
import os

import pytest

import appliance
from tests.cold.offload_proc import offload_killed_at
from tests.support.bkctl import bkctl
from tests.support.launch import wait_for, wait_registered

moto_server = pytest.importorskip("moto.server")
pafs = pytest.importorskip("pyarrow.fs")

SMALL_SEGMENTS = {"segment_records_max": 50, "flush_interval_us": 200,
                  "control_interval_ms": 2}


@pytest.fixture
def s3():
    """(endpoint host:port, filesystem to look at the bucket) of a fresh moto server."""
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"{host}:{port}"
        fs = pafs.S3FileSystem(access_key="test", secret_key="test-secret", scheme="http",
                               endpoint_override=endpoint, region="us-east-1",
                               allow_bucket_creation=True)
        fs.create_dir("bk-cold")
        yield endpoint, fs
    finally:
        server.stop()


def _objects(fs, prefix: str) -> set[str]:
    infos = fs.get_file_info(pafs.FileSelector(prefix, recursive=True, allow_not_found=True))
    return {i.path for i in infos if i.type == pafs.FileType.File}


def _cluster(make_cluster, short_tmp, endpoint: str, keys_in_file: bool = True):
    uri = f"s3://bk-cold/logs?endpoint_override={endpoint}&scheme=http&region=us-east-1"
    cold = {"uri": uri, "delete_after_ms": 0, "orphan_grace_ms": 0, "offload_after_ms": 0}
    if keys_in_file:
        secret = short_tmp / "cold-s3"
        secret.write_text("test:test-secret\n")
        os.chmod(secret, 0o600)
        cold["credentials_file"] = str(secret)
    return make_cluster(3, quorums=(3, 3, 2), log=SMALL_SEGMENTS,
                        autorecovery={"enabled": False}, cold_storage=cold)


ENV_KEYS = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test-secret"}


def _write(log, n: int) -> list:
    with log.writer() as w:
        futures = []
        for i in range(n):
            futures.append(w.write_async(b"s%06d" % i))
            if i % 10 == 9:
                w.flush()
        w.flush()
        return [f.result(timeout=60) for f in futures]


def _read_all(log) -> list:
    out = []
    with log.reader() as r:
        while got := r.read(max_records=1000, timeout_s=0):
            out += got
    return out


@pytest.mark.parametrize("keys_in_file", [True, False], ids=["credentials_file", "environment"])
def test_segments_move_to_s3_and_read_back_once(make_cluster, short_tmp, s3, keys_in_file,
                                                monkeypatch):
    endpoint, fs = s3
    cluster = _cluster(make_cluster, short_tmp, endpoint, keys_in_file)
    config = cluster.config_path
    env = {} if keys_in_file else ENV_KEYS
    for key, value in env.items():  # this process reads the files too
        monkeypatch.setenv(key, value)
    with appliance.connect(str(config)) as bk:
        wait_registered(bk, 3)
        log = bk.log("s3log")
        positions = _write(log, 200)
        done = bkctl("log", "offload", "s3log", "--json", config=config, text=True, env=env)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["moved"] == 4
        md = log.metadata()
        uris = [s.cold.uri for s in md.segments if s.cold is not None]
        assert all(u.startswith("s3://bk-cold/logs/s3log/") and "?" not in u for u in uris)
        assert _objects(fs, "bk-cold/logs/s3log") == {u.removeprefix("s3://") for u in uris}
        records = _read_all(log)
        assert [r.dlsn for r in records] == positions
        assert [r.payload for r in records] == [b"s%06d" % i for i in range(200)]
        cli = bkctl("log", "read", "s3log", config=config, env=env)
        assert cli.stdout.splitlines() == [b"s%06d" % i for i in range(200)]
        log.truncate(positions[100])
        assert len(_objects(fs, "bk-cold/logs/s3log")) == 2
        assert _read_all(log)[0].dlsn == positions[100]


def test_mover_killed_after_upload_leaves_no_orphan_in_s3(make_cluster, short_tmp, s3):
    endpoint, fs = s3
    cluster = _cluster(make_cluster, short_tmp, endpoint)
    config = cluster.config_path
    with appliance.connect(str(config)) as bk:
        wait_registered(bk, 3)
        log = bk.log("k")
        positions = _write(log, 120)
        done = offload_killed_at(config, "k", "written")
        assert done.returncode == -9, done.stderr
        assert len(_objects(fs, "bk-cold/logs/k")) == 1  # the orphan
        assert [r.dlsn for r in _read_all(log)] == positions
        wait_for(lambda: bkctl("log", "offload", "k", config=config).returncode == 0, 60,
                 what="a pass after the killed mover")
        named = {s.cold.uri.removeprefix("s3://") for s in log.metadata().segments
                 if s.cold is not None}
        assert len(named) == 3 and _objects(fs, "bk-cold/logs/k") == named
        assert [r.dlsn for r in _read_all(log)] == positions

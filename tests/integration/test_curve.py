"""CURVE with real bookie processes on tcp (127.0.0.1, free ports): an
authorized client round trips; a client whose key is not authorized gets
``UnauthorizedError`` at once, naming the bookie, while an authorized one
keeps working; a client without a key is refused as unauthorized; each
bookie logs a refusal once per peer per interval; ``trusted_keys_dir``
refuses bookies with a key it does not hold; a bookie refuses to start
with an unusable key file."""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

import pytest

import appliance
from appliance.bench.launcher import free_tcp_port
from appliance.bookie.exit_codes import EXIT_REFUSED
from appliance.curve import generate_keys
from appliance.errors import NotEnoughBookiesError, UnauthorizedError
from tests.logservice.support import log_servers_running, read_all
from tests.support.launch import Cluster, wait_registered

PW = b"pw"
N_BOOKIES = 3
REFUSAL_BOUND_S = 5.0  # an unauthorized client learns it this fast (no timeout involved)


def _tcp_cluster(root: Path, n_bookies: int = N_BOOKIES, **sections) -> Cluster:
    """Three bookies on tcp with CURVE: the host key pair, an authorized
    directory holding the ``good`` client's key; ``bad`` is not there."""
    for sub in ("keys", "clients", "authorized"):
        (root / sub).mkdir(mode=0o700)
    generate_keys("host", root / "keys")
    generate_keys("good", root / "clients")
    generate_keys("bad", root / "clients")
    shutil.copy(root / "clients" / "good.key", root / "authorized" / "good.key")
    sections.setdefault("log", {"port_base": free_tcp_port()})  # log servers on tcp too
    cluster = Cluster(root, n_bookies, quorums=(3, 3, 2),
                      client={"reconnect_ivl_max_ms": 200},
                      security={"curve": True, "key_file": "keys/host.key_secret",
                                "authorized_keys_dir": "authorized"}, **sections)
    text = cluster.config_path.read_text()
    for i in range(1, n_bookies + 1):
        text = text.replace(f'"ipc://b{i}.sock"', f'"tcp://127.0.0.1:{free_tcp_port()}"')
    cluster.config_path.write_text(text)
    from appliance.config import load_config

    cluster.config = load_config(cluster.config_path)
    return cluster


@pytest.fixture(scope="module")
def curve_cluster():
    root = Path(tempfile.mkdtemp(prefix="bkc"))
    cluster = _tcp_cluster(root)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.kill_all()
        shutil.rmtree(root, ignore_errors=True)


def _connect(cluster: Cluster, key: str | None, **kw):
    """A client of the cluster's metadata; with ``key`` (good/bad/host) its
    CURVE key pair, without: no CURVE at all (no config file)."""
    uri = cluster.config.metadata.uri
    if key is None:
        return appliance.connect(uri, **kw)
    sub = "keys" if key == "host" else "clients"
    return appliance.connect(uri, curve_key_file=str(cluster.root / sub / f"{key}.key_secret"),
                             **kw)


def test_an_authorized_client_round_trips_over_curve(curve_cluster):
    with _connect(curve_cluster, "good") as bk:
        wait_registered(bk, N_BOOKIES)
        published = {b: info["info"]["curve_public_key"]
                     for b, info in bk.registry.available().items()}
        host_key = (curve_cluster.root / "keys" / "host.key").read_text()
        assert all(key and f'"{key}"' in host_key for key in published.values()), published
        lh = bk.create_ledger(3, 3, 2, password=PW)
        payloads = [b"entry %d" % i for i in range(20)]
        for f in [lh.add_async(p) for p in payloads]:
            f.result(timeout=30)
        lh.close()
        rh = bk.open_ledger(lh.id, password=PW)
        assert [e.payload for e in rh.read(0, rh.last_add_confirmed)] == payloads
        chunk_payloads = [bytes(c.payloads[c.offsets[i]:c.offsets[i + 1]])
                          for c in rh.read_chunks(0, 19) for i in range(c.count)]
        assert chunk_payloads == payloads  # the bulk reader's own sockets use CURVE too
    with appliance.connect(str(curve_cluster.config_path)) as bk:  # the config: the host key
        assert bk.open_ledger(lh.id, password=PW).read(0, 0)[0].payload == b"entry 0"
    _assert_spark_partitions_read(curve_cluster, lh.id, payloads)


def _assert_spark_partitions_read(cluster: Cluster, ledger_id: int, payloads: list) -> None:
    """The Spark source's planner and executor function, in this process:
    the partitions carry the key file's path and the bookies' server keys."""
    from appliance.spark.filters import Bounds
    from appliance.spark.options import parse_options
    from appliance.spark.planner import plan_partitions
    from appliance.spark.source import read_partition

    options = parse_options({"config": str(cluster.config_path), "ledgers": str(ledger_id),
                             "password": PW.decode()})
    partitions = plan_partitions(options, Bounds())
    assert partitions and all(p.server_keys and p.curve_key_file for p in partitions)
    rows = [bytes(v) for p in partitions for batch in read_partition(p, PW)
            for v in batch.column("payload").to_pylist()]
    assert rows == payloads


def test_an_unauthorized_key_fails_fast_while_an_authorized_client_keeps_working(
        curve_cluster):
    with _connect(curve_cluster, "good") as good, _connect(curve_cluster, "bad") as bad:
        wait_registered(bad, N_BOOKIES)
        ok = good.create_ledger(3, 3, 2, password=PW)
        lh = bad.create_ledger(3, 3, 2, password=PW)  # metadata only: no bookie asked yet
        started = time.monotonic()
        with pytest.raises(UnauthorizedError) as info:
            lh.add(b"refused")
        assert time.monotonic() - started < REFUSAL_BOUND_S
        message = str(info.value)
        assert re.search(r"bookie bookie-\d \(tcp://127\.0\.0\.1:\d+\) refused this client's "
                         r"CURVE key", message), message
        assert "authorized_keys_dir" in message
        for i in range(10):  # the authorized client is not disturbed
            assert ok.add(b"fine %d" % i) == i
        ok.close()


def test_a_client_without_a_key_is_refused_as_unauthorized(curve_cluster):
    with _connect(curve_cluster, None) as plain:
        wait_registered(plain, N_BOOKIES)
        lh = plain.create_ledger(3, 3, 2, password=PW)
        with pytest.raises(UnauthorizedError, match="requires CURVE and this client has no key"):
            lh.add(b"no key")


def test_log_service_over_curve_on_tcp_refuses_strangers_naming_the_log_server(
        curve_cluster):
    """A log server beside tcp bookies serves on tcp with CURVE and
    registers its key: an authorized producer writes and a reader reads
    through it; a producer whose key it does not authorize, and one without
    a key, are refused with ``UnauthorizedError`` naming the log server (not
    a timeout: that would be ``LogServiceUnavailableError`` after the
    deadline)."""
    with _connect(curve_cluster, "good") as bk, \
            log_servers_running(curve_cluster, bk, "logserver-1") as servers:
        info = servers.registry.servers()["logserver-1"]
        assert info["endpoint"].startswith("tcp://127.0.0.1:"), info
        assert info["read_endpoint"].startswith("tcp://127.0.0.1:"), info
        assert info["curve_public_key"], info
        producer = bk.log("curve-orders").producer()
        written = [producer.write(f"r{i}".encode()) for i in range(20)]
        producer.close()
        records = read_all(bk, "curve-orders", 20, nothing_more=True)
        assert [(r.dlsn, r.payload) for r in records] == \
            [(d, f"r{i}".encode()) for i, d in enumerate(written)]
        for key, words in (("bad", "refused this client's CURVE key"),
                           (None, "requires CURVE and this client has no key")):
            with _connect(curve_cluster, key) as stranger:
                refused = stranger.log("curve-orders").producer()
                with pytest.raises(UnauthorizedError, match="log server logserver-1") as info:
                    refused.write(b"x")
                assert words in str(info.value)
                with pytest.raises(UnauthorizedError):  # sticky, as every producer error
                    refused.close()


def test_each_bookie_logs_a_refusal_once_per_peer_per_interval(curve_cluster):
    for _ in range(3):  # three clients, each a fresh handshake to every bookie it writes to
        with _connect(curve_cluster, "bad") as bad:
            wait_registered(bad, N_BOOKIES)
            lh = bad.create_ledger(3, 3, 2, password=PW)
            with pytest.raises(UnauthorizedError):
                lh.add(b"refused")
    bad_key = (curve_cluster.root / "clients" / "bad.key").read_text()
    bad_key = re.search(r'public-key = "(.*)"', bad_key).group(1)
    for b in curve_cluster.config.bookies:
        lines = [line for line in curve_cluster.log(b.id).splitlines()
                 if f"refused a client at 127.0.0.1 with key {bad_key}" in line]
        assert len(lines) == 1, (b.id, lines)


def test_trusted_keys_dir_refuses_a_bookie_whose_key_it_does_not_hold(curve_cluster, caplog):
    root = curve_cluster.root
    trusted = root / "trusted-other"
    trusted.mkdir(exist_ok=True)
    shutil.copy(root / "clients" / "good.key", trusted / "good.key")  # not the bookies' key
    with caplog.at_level(logging.WARNING, logger="appliance.client.driver"), \
            _connect(curve_cluster, "good", trusted_keys_dir=str(trusted)) as bk:
        assert bk.driver.available_bookies == ()
        with pytest.raises(NotEnoughBookiesError):
            bk.create_ledger(3, 3, 2, password=PW)
    refused = [m for m in (r.getMessage() for r in caplog.records)
               if "not in trusted_keys_dir" in m]
    assert {re.search(r"bookie (bookie-\d)", m).group(1) for m in refused} == {
        b.id for b in curve_cluster.config.bookies}
    trusted_host = root / "trusted-host"
    trusted_host.mkdir(exist_ok=True)
    shutil.copy(root / "keys" / "host.key", trusted_host / "host.key")
    with _connect(curve_cluster, "good", trusted_keys_dir=str(trusted_host)) as bk:
        wait_registered(bk, N_BOOKIES)
        lh = bk.create_ledger(3, 3, 2, password=PW)
        assert lh.add(b"trusted") == 0
        lh.close()


def test_a_bookie_refuses_to_start_with_a_key_file_others_can_read(short_tmp):
    cluster = _tcp_cluster(short_tmp)
    cluster.format()
    key_file = short_tmp / "keys" / "host.key_secret"
    os.chmod(key_file, 0o644)
    try:
        # a refusal a restart cannot change (appliance.bookie.exit_codes.EXIT_REFUSED):
        # the supervisor leaves it down instead of restarting it
        with pytest.raises(RuntimeError, match=f"exited {EXIT_REFUSED}: .*key_file.*chmod 600"):
            cluster.start_bookie("bookie-1")
        assert f"security.key_file: {key_file} is readable by other accounts (mode 644); " \
               f"fix: chmod 600 {key_file}" in cluster.log("bookie-1")
    finally:
        cluster.kill_all()


def test_a_whole_appliance_runs_over_curve(short_tmp):
    """``bkctl up`` with tcp bookies and CURVE: the supervisor's pings, the
    status probe and the ledger commands all present the host key."""
    import json

    from tests.support.bkctl import bkctl
    from tests.support.launch import kill_pids, supervisor_pids

    config = _tcp_cluster(short_tmp).config_path
    seen: set[int] = set()
    try:
        up = bkctl("up", "--detach", config=config)
        seen.update(supervisor_pids(config))
        assert up.returncode == 0, up.stderr.decode()
        status = json.loads(bkctl("status", "--json", config=config).stdout)
        assert [b["state"] for b in status["bookies"]] == ["up"] * N_BOOKIES
        appended = bkctl("ledger", "append", "-", config=config, input=b"x\ny\n")
        assert appended.returncode == 0, appended.stderr.decode()
        read = bkctl("ledger", "read", appended.stdout.decode().strip(), config=config)
        assert read.stdout == b"x\ny\n"
        assert bkctl("down", config=config).returncode == 0
    finally:
        seen.update(supervisor_pids(config))
        kill_pids(seen)


def test_a_lost_bookie_is_rereplicated_over_curve(short_tmp):
    """``bkctl bookie recover`` (its own transport) copies over CURVE."""
    from tests.support.bkctl import bkctl

    cluster = _tcp_cluster(short_tmp, 4, autorecovery={"enabled": False})
    try:
        cluster.start()
        with _connect(cluster, "good") as bk:
            wait_registered(bk, 4)
            lh = bk.create_ledger(3, 3, 2, password=PW)
            for i in range(30):
                lh.add(b"keep %d" % i)
            lh.close()
            lost = bk.ledger_metadata(lh.id).ensembles[0][1][0]
            cluster.kill(lost)
            recover = bkctl("bookie", "recover", lost, "--password", "pw",
                            config=cluster.config_path)
            assert recover.returncode == 0, recover.stderr.decode()
            md = bk.ledger_metadata(lh.id)
            assert all(lost not in bookies for _, bookies in md.ensembles), md.ensembles
            rh = bk.open_ledger(lh.id, password=PW)
            assert [e.payload for e in rh.read(0, 29)] == [b"keep %d" % i for i in range(30)]
    finally:
        cluster.kill_all()

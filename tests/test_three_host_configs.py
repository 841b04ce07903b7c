"""configs/three-host: the documented three-host example loads with the
validator, and its files agree with each other the way docs/DEPLOYMENT.md
says they must (one metadata line, unique ids, own endpoints per host)."""

from __future__ import annotations

from pathlib import Path

import pytest

from appliance.config import load_config

HERE = Path(__file__).resolve().parents[1] / "configs" / "three-host"
HOSTS = ("host1", "host2", "host3")


@pytest.mark.parametrize("host", HOSTS)
def test_each_host_config_loads(host):
    config = load_config(HERE / f"{host}.toml")
    number = host.removeprefix("host")
    assert [b.id for b in config.bookies] == [f"{host}-b1", f"{host}-b2"]
    assert all(b.endpoint.startswith(f"tcp://10.0.0.{number}:") for b in config.bookies)
    assert {b.host for b in config.bookies} == {host}  # placement label
    assert (config.client.ensemble, config.client.write_quorum, config.client.ack_quorum) \
        == (3, 3, 2)
    assert config.client.add_retries_max == 0
    # a cut-off host's bookies leave the registry before an add to them times out
    assert config.metadata.session_timeout_ms < config.client.add_timeout_ms


def test_the_hosts_share_metadata_and_credentials_and_nothing_else():
    configs = [load_config(HERE / f"{h}.toml") for h in HOSTS]
    assert len({c.metadata.uri for c in configs}) == 1
    assert configs[0].metadata.uri.startswith("zk://") and \
        configs[0].metadata.uri.count(":2181") == 3
    assert len({c.metadata.auth_file for c in configs}) == 1
    ids = [b.id for c in configs for b in c.bookies]
    endpoints = [b.endpoint for c in configs for b in c.bookies]
    assert len(set(ids)) == len(ids) == 6 and len(set(endpoints)) == 6


def test_the_readme_points_at_the_deployment_guide():
    assert "docs/DEPLOYMENT.md" in (HERE / "README.md").read_text()
    assert (HERE.parents[1] / "docs" / "DEPLOYMENT.md").exists()

"""Across hosts: a ledger written from the client namespace (1 KB entries,
E3/W3/A2, bookies on three hosts over tcp) reads back from another host;
`bkctl status` on one host lists every host's bookies; a client without
the ZooKeeper credentials cannot change the metadata."""

from __future__ import annotations

import json

from tests.harness.hosts import CLIENT

ENTRIES = 300


def test_write_on_the_client_read_on_another_host(healthy):
    writer = healthy.worker(CLIENT, "write", "--entries", str(ENTRIES), "--size", "1024")
    assert writer.wait(120) == 0
    closed = writer.wait_event("closed", timeout_s=1)
    assert closed["last"] == ENTRIES - 1 and writer.acked() == list(range(ENTRIES))
    assert not writer.of("error")

    reader = healthy.worker("host2", "read", "--ledger", str(closed["ledger"]))
    read = reader.wait_event("read", timeout_s=120)
    assert (read["last"], read["count"], read["bad"]) == (ENTRIES - 1, ENTRIES, [])
    assert read["state"] == "CLOSED"
    [(first, ensemble)] = read["ensembles"]
    assert first == 0 and len(set(ensemble)) == 3


def test_status_on_one_host_lists_every_host(healthy):
    done = healthy.bkctl("host3", "status", "--json")
    assert done.returncode == 0, done.stderr
    rows = {r["id"]: r for r in json.loads(done.stdout)["bookies"]}
    assert sorted(rows) == sorted(healthy.bookie_ids())
    assert all(r["state"] == "up" and r["pid"] for r in rows.values())
    assert {r["id"] for r in rows.values() if r["local"]} == set(healthy.bookie_ids("host3"))
    for bookie_id, row in rows.items():
        host = bookie_id.split("-")[0]
        assert row["endpoint"].startswith(f"tcp://{healthy.address(host)}:")


def test_a_client_without_credentials_cannot_change_metadata(healthy):
    text = healthy.config_path("host1").read_text()
    no_auth = healthy.root / "no-auth.toml"
    no_auth.write_text("\n".join(ln for ln in text.splitlines()
                                 if not ln.startswith("auth_file")))
    writer = healthy.worker(CLIENT, "write", "--entries", "1", config=str(no_auth))
    error = writer.wait_event("error", timeout_s=60)
    assert error["error"] == "MetadataAuthError" and "auth_file" in error["message"]
    assert not writer.of("created") and not writer.of("acked")

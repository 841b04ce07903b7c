"""Host-aware placement on real bookie processes of one machine, labelled
with three hosts in their config: new ledgers' write sets, a writer's
ensemble change after a bookie is killed, re-replication of a lost bookie,
and the labels as ``bkctl status --json``, ``bkctl ledger meta`` and the
registry show them."""

from __future__ import annotations

import json

import appliance
from appliance.meta.bookies import bookie_locations
from appliance.protocol.placement import meets_rule
from appliance.rereplication.rereplicator import Rereplicator
from tests.support.bkctl import bkctl
from tests.support.launch import wait_for, wait_registered

PW = b"pw"
# bookie-1, bookie-2 on host-a (rack r1); bookie-3, bookie-4 on host-b (r1);
# bookie-5, bookie-6 on host-c (r2)
HOSTS = ["host-a", "host-a", "host-b", "host-b", "host-c", "host-c"]
LABELS = [{"host": h, "rack": "r2" if h == "host-c" else "r1"} for h in HOSTS]
HOST_OF = {f"bookie-{i}": h for i, h in enumerate(HOSTS, 1)}


def _labelled(make_cluster, quorums, placement="host"):
    return make_cluster(6, quorums=quorums, per_bookie=LABELS, autorecovery={"enabled": False},
                        client={"placement": placement, "explicit_lac_interval_ms": 0})


def _hosts(ensemble) -> list[str]:
    return [HOST_OF[b] for b in ensemble]


def test_new_ledgers_spread_every_write_set_and_an_ensemble_change_keeps_it(make_cluster):
    cluster = _labelled(make_cluster, (4, 2, 2))
    with appliance.connect(str(cluster.config_path)) as bk:
        wait_registered(bk, 6)
        wait_for(lambda: len(bk.driver.locations) == 6, 15, what="labels from the registry")
        assert bookie_locations(bk.registry.available())["bookie-5"].rack == "r2"
        locations = bk.driver.locations
        for _ in range(12):  # E=4, W=2 over 3 hosts: neighbours always on two hosts
            lh = bk.create_ledger(password=PW)
            ensemble = bk.ledger_metadata(lh.id).last_fragment[1]
            assert meets_rule(ensemble, 2, locations), _hosts(ensemble)
            lh.close()
        assert bk.placement_degraded == 0

        # E=3, W=3 over 3 hosts: each host once; killing one leaves a single
        # host outside the write sets, and the replacement must come from it
        lh = bk.create_ledger(ensemble=3, write_quorum=3, ack_quorum=2, password=PW)
        first = bk.ledger_metadata(lh.id).last_fragment[1]
        assert sorted(_hosts(first)) == ["host-a", "host-b", "host-c"]
        victim = first[1]
        for i in range(5):
            lh.add(b"before-%d" % i)
        cluster.kill(victim)
        for i in range(5):
            lh.add(b"after-%d" % i)
        md = bk.ledger_metadata(lh.id)
        assert len(md.ensembles) == 2, md.ensembles
        second = md.last_fragment[1]
        replacement = second[1]
        assert replacement != victim and HOST_OF[replacement] == HOST_OF[victim]
        assert meets_rule(second, 3, locations)
        lh.close()
        with bk.open_ledger(lh.id, PW) as rh:
            expected = [b"before-%d" % i for i in range(5)] + [b"after-%d" % i for i in range(5)]
            assert [bytes(e.payload) for e in rh.read(0, 9)] == expected


def test_rereplication_takes_a_replacement_on_the_lost_bookies_host(make_cluster):
    cluster = _labelled(make_cluster, (3, 3, 2))
    config = cluster.config_path
    status = bkctl("status", "--json", config=config, text=True)
    assert status.returncode == 0, status.stderr
    rows = {r["id"]: (r["host"], r["rack"]) for r in json.loads(status.stdout)["bookies"]}
    assert rows == {b: (h, "r2" if h == "host-c" else "r1") for b, h in HOST_OF.items()}
    with appliance.connect(str(config)) as bk:
        wait_registered(bk, 6)
        wait_for(lambda: len(bk.driver.locations) == 6, 15, what="labels from the registry")
        lh = bk.create_ledger(password=PW)
        for i in range(20):
            lh.add(b"entry-%d" % i)
        lh.close()
        ensemble = bk.ledger_metadata(lh.id).last_fragment[1]
        lost = ensemble[0]
        cluster.stop_bookie(lost)
        wait_for(lambda: lost not in bk.registry.available(), 15, what=f"{lost} gone")
        with Rereplicator(bk.ledgers, bk.registry, passwords=[PW]) as rr:
            report = rr.recover(lost)
        assert report.ok, report
        repointed = bk.ledger_metadata(lh.id).last_fragment[1]
        assert lost not in repointed and HOST_OF[repointed[0]] == HOST_OF[lost]
        assert meets_rule(repointed, 3, bk.driver.locations)
        meta = bkctl("ledger", "meta", str(lh.id), "--json", config=config, text=True)
        assert meta.returncode == 0, meta.stderr
        (place,) = json.loads(meta.stdout)["placement"]
        assert place["hosts"] == [HOST_OF[b] for b in repointed]
        assert place["write_sets_on_distinct_hosts"] is True
        with bk.open_ledger(lh.id, PW) as rh:
            expected = [b"entry-%d" % i for i in range(20)]
            assert [bytes(e.payload) for e in rh.read(0, 19)] == expected


def test_too_few_hosts_still_create_ledgers_counted_and_warned_once(make_cluster, caplog):
    two_hosts = [{"host": h} for h in ("host-a", "host-a", "host-b", "host-b")]
    spread = make_cluster(4, quorums=(3, 3, 2), per_bookie=two_hosts)
    one_host = make_cluster(3, quorums=(3, 3, 2))  # the default: this machine's hostname
    caplog.set_level("INFO", logger="appliance.client.client")
    with appliance.connect(str(spread.config_path)) as bk:
        wait_registered(bk, 4)
        wait_for(lambda: len(bk.driver.locations) == 4, 15, what="labels from the registry")
        for _ in range(3):  # W=3 over 2 hosts: the rule cannot hold; never refused
            lh = bk.create_ledger(password=PW)
            lh.add(b"x")
            lh.close()
        assert bk.placement_degraded == 3
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "placement degraded" in warnings[0].getMessage()
    caplog.clear()
    with appliance.connect(str(one_host.config_path)) as bk:
        wait_registered(bk, 3)
        lh = bk.create_ledger(password=PW)
        lh.add(b"x")
        lh.close()
        assert bk.placement_degraded == 1
    levels = [r.levelname for r in caplog.records if "placement degraded" in r.getMessage()]
    assert levels == ["INFO"]  # one machine: the deployment, not news

"""Dependencies point one way (``tests/support/import_graph.py`` states the
layers): the pure core imports only the standard library, storage and ipc
only the core, the rest of ``appliance`` nothing above it, no two modules
import each other, directly or around a loop, and inside ``appliance`` the
rooms follow their own order (``ROOMS``) and never import each other."""

import re

from tests.support import import_graph as ig

BAD_LAZY = """
import os


def f():
    from appliance.client import client  # a reason, on its line
    # a reason for the group below
    from appliance.config import load_config
    from storage import cookie

    import os as os2  # not the project's: not counted
    from appliance.meta import bookies
    return client, load_config, cookie, os2, bookies
"""


def test_no_module_imports_a_layer_above_its_own():
    graph = ig.import_graph()
    assert len(graph) > 50  # the walk found the product, not an empty tree
    assert ig.layer_violations(graph) == []


def test_no_import_cycles_between_modules():
    assert ig.module_cycles(ig.import_graph()) == []


def test_the_check_catches_an_upward_import_and_a_cycle():
    graph = {
        "appliance.protocol.core": {"product": {"appliance.client.client"}, "external": {"zmq"}},
        "storage.journal": {"product": {"ipc.frames"}, "external": set()},
        "ipc.frames": {"product": {"appliance.protocol.errors"}, "external": set()},
        "appliance.protocol.errors": {"product": set(), "external": set()},
        "appliance.client.client": {"product": {"appliance.protocol.core"}, "external": set()},
    }
    bad = ig.layer_violations(graph)
    assert any("appliance.protocol.core imports appliance.client.client" in b for b in bad)
    assert any("storage.journal imports ipc.frames" in b for b in bad)
    assert any("imports zmq: the pure core is stdlib only" in b for b in bad)
    assert len(bad) == 3
    assert ig.module_cycles(graph) == [["appliance.client.client", "appliance.protocol.core"]]


def test_no_two_rooms_of_appliance_import_each_other():
    graph = ig.import_graph()
    rooms = ig.room_graph(graph)
    assert {"appliance.client", "appliance.logs", "appliance.bookie"} <= set(rooms)
    assert ig.room_cycles(graph) == []


def test_every_room_of_appliance_has_a_level():
    rooms = ig.room_graph(ig.import_graph())
    assert sorted(set(rooms) - set(ig.ROOMS)) == []


def test_the_check_catches_a_room_importing_a_room_above_or_a_new_room():
    graph = {
        "appliance.client.client": {"product": {"appliance.logs.log"}, "external": set()},
        "appliance.logs.log": {"product": {"appliance.client.client"}, "external": set()},
        "appliance.bookie.server": {"product": {"appliance.newroom.x"}, "external": set()},
        "appliance.newroom.x": {"product": set(), "external": set()},
        "appliance.supervisor.supervisor": {"product": {"appliance.config"}, "external": set()},
        "appliance.config": {"product": set(), "external": set()},
    }
    bad = ig.layer_violations(graph)
    assert any("room appliance.client (level 1) may not import room appliance.logs (level 2)"
               in b for b in bad)
    assert any("room appliance.newroom has no level" in b for b in bad)
    assert len(bad) == 2
    assert ig.room_cycles(graph) == [["appliance.client", "appliance.logs"]]


def test_the_graph_script_prints_edges_and_exits_zero(capsys):
    assert ig.main([]) == 0
    out = capsys.readouterr().out
    assert "layer violations: 0; module cycles: 0; room cycles: 0" in out
    assert "storage" in out and "appliance.protocol" in out


def test_an_import_of_the_project_inside_a_function_says_why():
    # every import counts for the layers; one inside a function must also say
    # beside it why it is not at the top (start-up cost, an optional
    # dependency), or the file's header no longer says what it depends on
    assert ig.unexplained_inner_imports() == []


def test_the_inner_import_check_finds_an_import_without_a_reason():
    found = ig.unexplained_in_source("appliance.x", BAD_LAZY)
    assert found == ["appliance.x:12 f: from appliance.meta import bookies"]


def test_the_installed_package_imports_nothing_from_tests():
    """appliance/, cli/, ipc/, storage/ (what setup.py installs) never import
    ``tests``: the harness (tests/harness) and the fixtures stay beside the
    tests, and an installed bkctl runs without them."""
    installed = re.search(r"find_packages\(include=\[([^\]]*)\]",
                          (ig.ROOT / "setup.py").read_text())
    assert installed, "setup.py no longer lists its packages as find_packages(include=[...])"
    assert sorted(p.strip().strip("\"'*") for p in installed.group(1).split(",")) == \
        sorted(ig.PACKAGES)  # the graph covers exactly what is installed
    graph = ig.import_graph()
    assert sorted(m for m, deps in graph.items() if "tests" in deps["external"]) == []
    assert [line for line in ig.layer_violations(graph) if line.endswith("imports tests")] == []


def test_the_check_catches_an_import_of_tests():
    graph = {
        "appliance.bench.x": {"product": set(), "external": {"tests"}},
        "cli.main": {"product": {"appliance.bench.x"}, "external": set()},
    }
    assert ig.layer_violations(graph) == ["appliance.bench.x imports tests"]


def test_every_bench_module_is_one_bkctl_runs():
    """The benches ship in the package for `bkctl bench` on a user's machine;
    a module of appliance.bench that no bkctl command reaches is harness
    code, and belongs under tests/ (tests/harness)."""
    assert ig.unreached_from_cli(ig.import_graph()) == []


def test_the_reach_check_finds_a_bench_module_bkctl_never_runs():
    graph = {
        "cli.bench": {"product": {"appliance.bench.ledgers"}, "external": set()},
        "appliance.bench.ledgers": {"product": {"appliance.bench.launcher"}, "external": set()},
        "appliance.bench.launcher": {"product": set(), "external": set()},
        "appliance.bench.netns": {"product": {"appliance.bench.launcher"}, "external": set()},
    }
    assert ig.unreached_from_cli(graph) == ["appliance.bench.netns"]

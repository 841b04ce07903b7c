"""Dependencies point one way (``tests/support/import_graph.py`` states the
layers): the pure core imports only the standard library, storage and ipc
only the core, the rest of ``appliance`` nothing above it, and no two modules
import each other, directly or around a loop."""

from tests.support import import_graph as ig


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


def test_the_graph_script_prints_edges_and_exits_zero(capsys):
    assert ig.main([]) == 0
    out = capsys.readouterr().out
    assert "layer violations: 0; module cycles: 0" in out
    assert "storage" in out and "appliance.protocol" in out

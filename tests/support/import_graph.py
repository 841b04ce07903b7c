"""The import graph of the product's packages, read from the source (``ast``,
nothing is imported), and the layer rule it must follow.

    python -m tests.support.import_graph             # layers and package edges
    python -m tests.support.import_graph --modules   # every module's imports

Layers, lowest first; a module may import its own layer and the ones below,
never one above (``tests/test_layers.py`` enforces it):

    0  appliance.protocol   the pure core and the kernel (errors, invariant):
                            the standard library only
    1  storage, ipc         one bookie's disks and the metadata store
                            backends; the wire.  Peers: neither imports the
                            other
    2  appliance            client, bookie, supervisor, meta, rereplication,
                            bench, spark: the drivers over the layers below
    3  cli                  ``bkctl``

Inside ``appliance`` the rooms (a module file or a folder under
``appliance/``) are layered too, lowest first (``ROOMS``): a room imports
its own level and the ones below, and no two rooms import each other, even
around a loop through other rooms:

    0  errors, heap, curve, config, checks, meta   the shared kernel of the
                                                   drivers (protocol is layer 0)
    1  client                                      the ledger client
    2  logs, cold, rereplication, spark, and the users of ledgers
       ``appliance`` itself (``connect``)
    3  autorecovery                                the auditor and workers
    4  bookie, logservice                          server processes
    5  supervisor, bench                           what starts the processes

A new room must be given its level here before it may be imported.

Every import counts, also one inside a function: a lazy import is still a
dependency.  No module of the product imports ``tests``.

The installed package carries no test harness: every module of
``appliance.bench`` is reached from ``bkctl`` (``cli``) through imports
(``unreached_from_cli``); what only tests use lives under ``tests/``
(``tests/harness``).
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("appliance", "storage", "ipc", "cli")
LAYERS = {"appliance.protocol": 0, "storage": 1, "ipc": 1, "appliance": 2, "cli": 3}
PEERS_APART = {("storage", "ipc"), ("ipc", "storage")}
ROOMS = {
    "appliance.errors": 0, "appliance.heap": 0, "appliance.curve": 0,
    "appliance.config": 0, "appliance.checks": 0, "appliance.meta": 0,
    "appliance.client": 1,
    "appliance.logs": 2, "appliance.rereplication": 2, "appliance.spark": 2,
    "appliance.cold": 2,
    "appliance": 2,
    "appliance.autorecovery": 3,
    "appliance.bookie": 4, "appliance.logservice": 4,
    "appliance.supervisor": 5, "appliance.bench": 5,
}


def product_modules(root: Path = ROOT) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package ``__init__``)."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts = parts[:-1]
            modules[".".join(parts)] = (path, is_package)
    return modules


def _imported_names(tree: ast.AST, module: str, is_package: bool,
                    modules: dict) -> Iterable[str]:
    """Every dotted name a module imports: ``from a import b`` is ``a.b`` when
    that is a module of the product, else ``a`` (``b`` is a name in ``a``)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module if is_package else module.rpartition(".")[0]
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                origin = f"{base}.{node.module}" if node.module else base
            else:
                origin = node.module or ""
            for alias in node.names:
                submodule = f"{origin}.{alias.name}"
                yield submodule if submodule in modules else origin


def _owner(name: str, modules: dict) -> str | None:
    """The product module a dotted name lives in, or None (stdlib, third party)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(root: Path = ROOT) -> dict[str, dict[str, set[str]]]:
    """module -> {"product": product modules it imports,
    "external": top-level names of everything else it imports}."""
    modules = product_modules(root)
    graph = {}
    for module, (path, is_package) in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        product, external = set(), set()
        for name in _imported_names(tree, module, is_package, modules):
            owner = _owner(name, modules)
            if owner is not None:
                if owner != module:
                    product.add(owner)
            elif name:
                external.add(name.split(".")[0])
        graph[module] = {"product": product, "external": external}
    return graph


def layer_of(module: str) -> str:
    """The layer key of a module: ``appliance.protocol``, ``storage``, ...."""
    if module == "appliance.protocol" or module.startswith("appliance.protocol."):
        return "appliance.protocol"
    return module.split(".")[0]


def room_of(module: str) -> str | None:
    """The room of an ``appliance`` module outside the protocol:
    ``appliance.client.driver`` -> ``appliance.client``, the package
    ``appliance`` -> ``appliance``; None for the other layers."""
    if layer_of(module) != "appliance":
        return None
    parts = module.split(".")
    return ".".join(parts[:2])


def _room_violation(module: str, target: str) -> str | None:
    here, there = room_of(module), room_of(target)
    if here is None or there is None or here == there:
        return None
    for room in (here, there):
        if room not in ROOMS:
            return (f"{module} imports {target}: room {room} has no level "
                    f"(add it to ROOMS in tests/support/import_graph.py)")
    if ROOMS[there] > ROOMS[here]:
        return (f"{module} imports {target}: room {here} (level {ROOMS[here]}) may "
                f"not import room {there} (level {ROOMS[there]})")
    return None


def layer_violations(graph: dict) -> list[str]:
    """One line per import that breaks the layer rule (between layers, and
    between the rooms of ``appliance``)."""
    stdlib = sys.stdlib_module_names
    bad = []
    for module, deps in sorted(graph.items()):
        here = layer_of(module)
        for target in sorted(deps["product"]):
            there = layer_of(target)
            if LAYERS[there] > LAYERS[here] or (here, there) in PEERS_APART:
                bad.append(f"{module} imports {target}: layer {here} may not import {there}")
            elif (line := _room_violation(module, target)) is not None:
                bad.append(line)
        if "tests" in deps["external"]:
            bad.append(f"{module} imports tests")
        if here == "appliance.protocol":
            for name in sorted(deps["external"] - stdlib - {"__future__"}):
                bad.append(f"{module} imports {name}: the pure core is stdlib only")
    return bad


def module_cycles(graph: dict) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, cycles = {}, {}, set(), [], []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start]["product"])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]["product"]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    cycles.append(sorted(group))
    return cycles


def room_graph(graph: dict) -> dict[str, dict[str, set[str]]]:
    """The rooms of ``appliance`` as a graph of the same shape: room -> the
    other rooms its modules import."""
    rooms: dict[str, dict[str, set[str]]] = {}
    for module, deps in graph.items():
        here = room_of(module)
        if here is None:
            continue
        node = rooms.setdefault(here, {"product": set(), "external": set()})
        for target in deps["product"]:
            there = room_of(target)
            if there is not None and there != here:
                node["product"].add(there)
    for node in list(rooms.values()):
        for there in node["product"]:
            rooms.setdefault(there, {"product": set(), "external": set()})
    return rooms


def room_cycles(graph: dict) -> list[list[str]]:
    """Groups of rooms that import each other, directly or around a loop."""
    return module_cycles(room_graph(graph))


def unreached_from_cli(graph: dict, room: str = "appliance.bench") -> list[str]:
    """Modules of ``room`` that no chain of imports from ``cli`` reaches:
    code the installed package ships that ``bkctl`` never runs."""
    seen = {m for m in graph if layer_of(m) == "cli"}
    todo = list(seen)
    while todo:
        for target in graph[todo.pop()]["product"]:
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return sorted(m for m in graph if m.startswith(room + ".") and m not in seen)


def _explained(lines: list[str], lineno: int) -> bool:
    """A comment on the import's line, or on a line above it within its
    group of imports (no blank line between): one reason serves a group."""
    if "#" in lines[lineno - 1]:
        return True
    i = lineno - 2
    while i >= 0:
        text = lines[i].strip()
        if text.startswith("#"):
            return True
        if not (text.startswith(("import ", "from ")) or text.endswith((",", "("))
                or text == ")"):
            return False
        i -= 1
    return False


def unexplained_in_source(module: str, source: str) -> list[str]:
    """``module:line function: import`` for each import of the project's
    own modules inside a function with no reason written beside it."""
    lines = source.splitlines()
    found = []
    for fn in ast.walk(ast.parse(source)):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(fn):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                     else [a.name for a in node.names])
            own = (isinstance(node, ast.ImportFrom) and node.level) or any(
                n.split(".")[0] in PACKAGES for n in names)
            if own and not _explained(lines, node.lineno):
                found.append(f"{module}:{node.lineno} {fn.name}: {ast.unparse(node)}")
    return sorted(set(found))


def unexplained_inner_imports(root: Path = ROOT) -> list[str]:
    """``unexplained_in_source`` over every product module."""
    found = []
    for module, (path, _) in sorted(product_modules(root).items()):
        found += unexplained_in_source(module, path.read_text())
    return found


def package_edges(graph: dict) -> dict[tuple[str, str], int]:
    """(from layer package, to layer package) -> number of module imports,
    with ``appliance`` split into its rooms (``appliance.client`` ...)."""
    def room(module: str) -> str:
        parts = module.split(".")
        return ".".join(parts[:2]) if parts[0] == "appliance" and len(parts) > 1 else parts[0]

    edges: dict[tuple[str, str], int] = {}
    for module, deps in graph.items():
        for target in deps["product"]:
            key = (room(module), room(target))
            if key[0] != key[1]:
                edges[key] = edges.get(key, 0) + 1
    return edges


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modules", action="store_true", help="list every module's imports")
    args = parser.parse_args(argv)
    graph = import_graph()
    if args.modules:
        for module, deps in sorted(graph.items()):
            print(f"{module}  [{layer_of(module)}]")
            for target in sorted(deps["product"]):
                print(f"    -> {target}")
    else:
        print("package edges (importer -> imported: module imports):")
        for (src, dst), count in sorted(package_edges(graph).items()):
            print(f"  {src:<28} -> {dst:<28} {count:3d}")
    violations, cycles = layer_violations(graph), module_cycles(graph)
    rooms = room_cycles(graph)
    print(f"{len(graph)} modules; layer violations: {len(violations)}; "
          f"module cycles: {len(cycles)}; room cycles: {len(rooms)}")
    for line in violations:
        print("  violation:", line)
    for group in cycles + rooms:
        print("  cycle:", " <-> ".join(group))
    return 1 if violations or cycles or rooms else 0


if __name__ == "__main__":
    sys.exit(main())

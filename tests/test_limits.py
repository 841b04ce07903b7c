"""Limits have one home (``appliance/protocol/limits.py``) and fit each other.

* every client default fits the wire/server limit it depends on (a client
  batch the bookie would refuse is a bug found here, not in production);
* the config's defaults, and the defaults of code built without a config
  (a ``Driver``, a ``FrameServer``, ``open_store``, ...), are the values in
  ``limits``: they cannot drift apart;
* no product module but ``limits.py`` assigns a literal to a limit name
  (``*_MAX*``, ``*TIMEOUT*``, ``*TRIES*``, ``*RETRIES*``), and no name is
  assigned in two modules, outside the documented exceptions below.
"""

from __future__ import annotations

import ast
import inspect
from collections.abc import Mapping
from dataclasses import MISSING, fields

import pytest

from appliance.config import SECTIONS, ClientConfig, MetadataConfig, ServerConfig
from appliance.protocol import limits
from appliance.protocol.entry import ENTRY_OVERHEAD_MAX
from ipc.frames import DEFAULT_LIMITS, WireLimits
from storage.options import StorageOptions
from tests.support.import_graph import product_modules

HOME = "appliance.protocol.limits"
LIMIT_WORDS = {"MAX", "TIMEOUT", "TRIES", "RETRIES"}

# Modules whose limit-named constants stay local, and why.
EXEMPT_MODULES = {
    "appliance.bench": "the benchmarks' own harness timeouts and bounds, not the product's",
    "ipc.bench": "the wire benchmark's harness (an in-memory bookie's id wrap)",
    "cli": "bkctl's own probe and scrape timeouts",
}
EXEMPT_NAMES = {
    ("appliance.meta.update_loop", "_EXPONENT_MAX"): "arithmetic: keeps 2**attempt finite, "
                                                     "not a bound on the work",
    ("appliance.protocol.entry", "DIGEST_BYTES_MAX"): "the format: hmac-sha256's 32 bytes",
    ("appliance.protocol.entry", "ENTRY_OVERHEAD_MAX"): "the format: header + largest digest",
    ("appliance.protocol.entry", "_U64_MAX"): "the format: the range of a u64 header field",
    ("appliance.protocol.logs", "NAME_MAX"): "the format: a log name's length, defined once",
    ("appliance.protocol.logs", "TXID_MAX"): "the format: paired with TXID_MIN, defined once",
    ("appliance.checks.record_check", "FAST_LENGTHS_MAX"): "a measured crossover of the "
                                                           "digest check, not a bound",
    ("appliance.checks.record_check", "STRIPPED_PAYLOAD_MAX"): "a measured crossover of the "
                                                               "digest check, not a bound",
}
_LITERAL_NODES = (ast.Constant, ast.BinOp, ast.UnaryOp, ast.operator, ast.unaryop, ast.Name,
                  ast.expr_context)


def is_limit_name(name: str) -> bool:
    """``FOO_MAX``, ``MAX_FOO``, ``FOO_TIMEOUT_MS``, ``FOO_TRIES_MAX``, ``RETRIES``...
    (a word of the name, so ``READ_CHUNK_ENTRIES`` is not one)."""
    return name.upper() == name and bool(LIMIT_WORDS & set(name.strip("_").split("_")))


def _is_literal(value: ast.expr) -> bool:
    """Numbers and arithmetic on numbers or local names (``64 * MiB``), not a
    read of ``limits.NAME`` (an attribute) nor a call."""
    return all(isinstance(node, _LITERAL_NODES) for node in ast.walk(value))


def literal_limits(source: str) -> list[tuple[str, int]]:
    """(name, line) of every module-level limit assigned a literal value."""
    found = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        for target in targets:
            if isinstance(target, ast.Name) and is_limit_name(target.id) \
                    and _is_literal(value):
                found.append((target.id, node.lineno))
    return found


def _exempt(module: str, name: str) -> bool:
    return (module, name) in EXEMPT_NAMES or any(
        module == m or module.startswith(m + ".") for m in EXEMPT_MODULES)


def limit_problems(sources: Mapping[str, str], home: str = HOME) -> list[str]:
    """One line per limit defined outside ``home`` or defined twice."""
    problems, where = [], {}
    for module, source in sorted(sources.items()):
        for name, line in literal_limits(source):
            if _exempt(module, name):
                continue
            where.setdefault(name, []).append(f"{module}:{line}")
            if module != home:
                problems.append(f"{module}:{line}: {name} is a limit outside {home}; move it "
                                f"there and read limits.<NAME>")
    for name, places in sorted(where.items()):
        if len(places) > 1:
            problems.append(f"{name} is defined {len(places)} times: {', '.join(places)}")
    return problems


def test_no_limit_is_defined_outside_limits_py_or_twice():
    sources = {module: path.read_text() for module, (path, _) in product_modules().items()}
    assert HOME in sources and len(sources) > 50
    assert limit_problems(sources) == []


def test_the_check_catches_a_stray_limit_and_a_double_definition():
    sources = {
        HOME: "KiB = 1024\nSERVER_BATCH_BYTES_MAX = 64 * KiB\nRETRIES = 3\n",
        "ipc.frames": "from appliance.protocol import limits\n"
                      "BATCH = limits.SERVER_BATCH_BYTES_MAX\n"  # a read: fine
                      "LEDGER_ID_MAX = limits.ID_MAX\n"  # an alias of limits: fine
                      "READ_CHUNK_ENTRIES = 1000\n",  # not a limit name
        "storage.read_path": "RUN_BYTES_MAX: int = 16 * 1024\n",
        "appliance.client.driver": "SERVER_BATCH_BYTES_MAX = 8192\nMAX_FOO = 1\n",
        "appliance.bench.launcher": "START_TIMEOUT_S = 120.0\n",  # exempt: the benches
        "appliance.protocol.entry": "DIGEST_BYTES_MAX = 32\n",  # exempt: the format
    }
    problems = limit_problems(sources)
    assert any(p.startswith("storage.read_path:1: RUN_BYTES_MAX") for p in problems)
    assert any(p.startswith("appliance.client.driver:1: SERVER_BATCH_BYTES_MAX")
               for p in problems)
    assert any(p.startswith("appliance.client.driver:2: MAX_FOO") for p in problems)
    assert "SERVER_BATCH_BYTES_MAX is defined 2 times: appliance.client.driver:1, " \
           "appliance.protocol.limits:2" in problems
    assert len(problems) == 4


def shadowed_limits(source: str) -> list[str]:
    """Functions of a module that imports ``limits`` and binds the same name
    locally (a parameter or an assignment): there ``limits.NAME`` would read
    the local, not the module."""
    tree = ast.parse(source)
    names = {alias.asname or alias.name for node in ast.walk(tree)
             if isinstance(node, ast.ImportFrom) and node.module == "appliance.protocol"
             for alias in node.names if alias.name == "limits"}
    found = []
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            continue
        args = fn.args
        bound = {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)}
        bound |= {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)
                  and isinstance(n.ctx, ast.Store)}
        uses = any(isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
                   and n.value.id in names for n in ast.walk(fn))
        found += [f"{getattr(fn, 'name', 'lambda')}:{fn.lineno} binds {name}"
                  for name in sorted(names & bound) if uses]
    return found


def test_no_function_shadows_the_limits_module_it_reads():
    bad = {module: found for module, (path, _) in product_modules().items()
           if (found := shadowed_limits(path.read_text()))}
    assert bad == {}
    crafted = ("from appliance.protocol import limits\n"
               "def read(server):\n"
               "    limits = server.limits\n"
               "    return limits.STORAGE_READ_RUN_ENTRIES_MAX\n")
    assert shadowed_limits(crafted) == ["read:2 binds limits"]


def test_limits_py_is_a_leaf_of_the_standard_library():
    tree = ast.parse(inspect.getsource(limits))
    imports = [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]
    assert [getattr(n, "module", None) for n in imports] == ["__future__"]


# -- the limits fit each other ------------------------------------------------------------
def _rules() -> list[tuple[str, int, str, int]]:
    """(what, value, the limit it must not exceed, that limit) with defaults."""
    client, server, storage = ClientConfig(), ServerConfig(), StorageOptions()
    return [
        ("client.add_batch_entries_max", client.add_batch_entries_max,
         "server.batch_entries_max", server.batch_entries_max),
        ("client.read_batch_entries_max", client.read_batch_entries_max,
         "server.batch_entries_max", server.batch_entries_max),
        ("client.add_batch_bytes_max", client.add_batch_bytes_max,
         "server.batch_bytes_max", server.batch_bytes_max),
        ("client.read_batch_bytes_max", client.read_batch_bytes_max,
         "server.batch_bytes_max", server.batch_bytes_max),
        ("client.read_batch_bytes_max", client.read_batch_bytes_max,
         "the wire's largest frame", DEFAULT_LIMITS.frame_bytes_max),
        ("storage.entry_bytes_max + ENTRY_OVERHEAD_MAX",
         storage.entry_bytes_max + ENTRY_OVERHEAD_MAX,
         "server.batch_bytes_max", server.batch_bytes_max),
        ("storage.record_bytes_max", storage.record_bytes_max,
         "the wire's entry_bytes_max", DEFAULT_LIMITS.entry_bytes_max),
        ("server.batch_entries_max", server.batch_entries_max,
         "STORAGE_READ_RUN_ENTRIES_MAX (one storage read per batch)",
         limits.STORAGE_READ_RUN_ENTRIES_MAX),
        ("REREPLICATION_READ_BATCH_ENTRIES_MAX", limits.REREPLICATION_READ_BATCH_ENTRIES_MAX,
         "server.batch_entries_max", server.batch_entries_max),
        ("REREPLICATION_READ_BATCH_BYTES_MAX", limits.REREPLICATION_READ_BATCH_BYTES_MAX,
         "server.batch_bytes_max", server.batch_bytes_max),
        ("client.reconnect_ivl_ms", client.reconnect_ivl_ms,
         "client.reconnect_ivl_max_ms", client.reconnect_ivl_max_ms),
        ("BOOKIE_REPAIR_RETRY_MS_MIN", limits.BOOKIE_REPAIR_RETRY_MS_MIN,
         "BOOKIE_REPAIR_RETRY_MS_MAX", limits.BOOKIE_REPAIR_RETRY_MS_MAX),
        ("SPARK_BATCH_BYTES_MAX", limits.SPARK_BATCH_BYTES_MAX,
         "Arrow binary's int32 offsets", 2**31 - 1),
    ]


@pytest.mark.parametrize("what,value,limit_name,limit", _rules(),
                         ids=lambda v: v if isinstance(v, str) else "")
def test_a_default_fits_the_limit_it_depends_on(what, value, limit_name, limit):
    assert value <= limit, f"{what} ({value}) is above {limit_name} ({limit})"


def test_the_storage_defaults_pass_their_own_rules():
    StorageOptions().validate()  # add_batch_bytes_max holds the largest record, ...


def test_every_config_default_is_inside_its_own_range():
    for section, cls in SECTIONS.items():
        for f in fields(cls):
            low, high = f.metadata.get("low"), f.metadata.get("high")
            if f.default is MISSING or isinstance(f.default, bool) \
                    or not isinstance(f.default, int | float):
                continue
            assert low is None or f.default >= low, f"{section}.{f.name}"
            assert high is None or f.default <= high, f"{section}.{f.name}"


# -- one value: the config and the code without a config read limits.py --------------------
CONFIG_LIMITS_ELSEWHERE = {
    "server.disk_usage_max": "a share of the disk, paired with disk_usage_resume "
                             "beside it in the config",
}


def test_every_config_limit_defaults_to_its_constant():
    """``[section] key`` -> ``SECTION_KEY`` in limits, for every limit key."""
    checked = 0
    for section, cls in SECTIONS.items():
        for f in fields(cls):
            if f"{section}.{f.name}" in CONFIG_LIMITS_ELSEWHERE \
                    or not is_limit_name(f.name.upper()):
                continue
            name = f"{section.upper()}_{f.name.upper()}"
            assert hasattr(limits, name), f"{section}.{f.name}: add {name} to limits.py"
            assert f.default == getattr(limits, name), f"{section}.{f.name}"
            checked += 1
    assert StorageOptions().entry_bytes_max == limits.STORAGE_ENTRY_BYTES_MAX
    assert checked >= 20


def _defaults(fn) -> dict:
    return {name: p.default for name, p in inspect.signature(fn).parameters.items()
            if p.default is not inspect.Parameter.empty}


def test_code_built_without_a_config_uses_the_config_defaults():
    from appliance.bookie.handler import BookieHandler
    from appliance.client.driver import Driver
    from ipc.memserver import MemoryBookie
    from ipc.server import FrameServer
    from storage.metadata import open_store
    from storage.metadata.sqlite_store import SqliteStore
    from storage.metadata.zk_store import ZkStore

    client, server, metadata = ClientConfig(), ServerConfig(), MetadataConfig(uri="x")
    driver = _defaults(Driver.__init__)
    # a Driver without a config batches adds like a configured client (512,
    # not the 1024 it once had of its own)
    for name in ("add_batch_entries_max", "add_batch_bytes_max", "read_batch_bytes_max"):
        assert driver[name] == getattr(client, name), name
    assert driver["request_timeout_ms"] == client.add_timeout_ms
    for fn in (BookieHandler.__init__, MemoryBookie.__init__):
        d = _defaults(fn)
        assert d["long_polls_max"] == server.long_polls_max
        assert d["wait_lac_timeout_ms_max"] == server.wait_lac_timeout_ms_max
    frame_server = _defaults(FrameServer.__init__)
    assert frame_server["drain_messages_max"] == server.drain_messages_max
    assert frame_server["queue_messages_max"] == server.queue_messages_max
    assert (WireLimits().batch_entries_max, WireLimits().batch_bytes_max) == \
        (server.batch_entries_max, server.batch_bytes_max)
    for fn in (open_store, SqliteStore.__init__, ZkStore.__init__):
        assert _defaults(fn)["session_timeout_ms"] == metadata.session_timeout_ms
    for fn in (open_store, ZkStore.__init__):
        assert _defaults(fn)["connect_timeout_ms"] == metadata.connect_timeout_ms

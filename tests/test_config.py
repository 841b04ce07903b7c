"""Config loader: the sample configs load; relative paths resolve against the
config's folder; every class of bad config is refused with ONE line naming
the key and the fix; host checks (dirs, CPUs, O_DIRECT) before any start."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from dataclasses import MISSING, fields
from pathlib import Path

import pytest

from appliance.config import (
    SECTIONS,
    ApplianceConfig,
    StorageConfig,
    load_config,
    resolve_target,
)
from appliance.config import check_host as documented_check_host
from appliance.config.host_checks import check_host, probe_direct_io
from appliance.errors import ConfigError
from appliance.protocol.entry import ENTRY_OVERHEAD_MAX

REPO = Path(__file__).resolve().parent.parent
CONFIGS = REPO / "configs"

BOOKIE = """
[[bookies]]
id = "{id}"
journal_dir = "data/{id}/journal"
ledger_dir = "data/{id}/ledgers"
endpoint = "ipc://data/{id}.sock"
"""


def write(tmp_path: Path, text: str, name: str = "appliance.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def minimal(bookies: int = 3, extra: str = "") -> str:
    text = '[metadata]\nuri = "sqlite:///meta.db"\n'
    text += "".join(BOOKIE.format(id=f"b{i}") for i in range(bookies))
    return text + extra


def refusal(tmp_path: Path, text: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text))
    message = str(info.value)
    assert "\n" not in message, "a refusal is one line"
    assert "; fix: " in message, "a refusal says how to fix it"
    return message


# -- the sample configs ------------------------------------------------------------------
def test_local_toml_is_four_bookies_under_the_repository_data_dir():
    config = load_config(CONFIGS / "local.toml")
    assert [b.id for b in config.bookies] == [f"bookie-{i}" for i in range(1, 5)]
    assert config.metadata.uri == f"sqlite:///{REPO / 'data' / 'metadata.db'}"
    first = config.bookies[0]
    assert first.journal_dir == REPO / "data" / "bookie-1" / "journal"
    assert first.ledger_dir == REPO / "data" / "bookie-1" / "ledgers"
    assert first.endpoint == f"ipc://{REPO / 'data' / 'bookie-1.sock'}"
    assert config.storage.direct_io is True and config.client.ensemble == 3


def test_local_toml_cold_storage_example_lands_in_the_ignored_data_dir(tmp_path):
    """Uncommented as shipped, configs/local.toml's [cold_storage] uri puts
    the cold files beside the bookies' data, in the data/ folder .gitignore
    ignores (not in configs/data/).  The copy sits in a configs/ folder of
    its own so the relative path resolves as it would in the checkout."""
    text = (CONFIGS / "local.toml").read_text()
    commented = [line for line in text.splitlines() if line.startswith("# uri = ")]
    assert len(commented) == 1, "configs/local.toml shows one commented [cold_storage] uri"
    (tmp_path / "configs").mkdir()
    copy = write(tmp_path / "configs", text.replace(commented[0], commented[0][2:]), "local.toml")
    config = load_config(copy)
    cold = Path(config.cold_storage.uri.removeprefix("file://"))
    data = Path(config.metadata.uri.removeprefix("sqlite:///")).parent
    assert cold == data / "cold" and data == tmp_path / "data"
    ignored = (REPO / ".gitignore").read_text().splitlines()
    assert f"/{cold.relative_to(tmp_path).parts[0]}/" in ignored


@pytest.mark.parametrize("name", sorted(p.name for p in CONFIGS.glob("*.toml")))
def test_every_sample_config_loads(name):
    config = load_config(CONFIGS / name)
    assert isinstance(config, ApplianceConfig) and config.bookies
    assert config.storage.to_options().entry_bytes_max == config.storage.entry_bytes_max


def _schema():
    """(section, key, default) for every key the loader accepts."""
    out = []
    for section, cls in SECTIONS.items():
        if cls is StorageConfig:
            from storage.options import StorageOptions

            out += [(section, f.name, f.default) for f in fields(StorageOptions)]
        else:
            out += [(section, f.name, f.default) for f in fields(cls)]
    return out


def test_local_toml_shows_every_key_at_its_default():
    import tomllib

    text = (CONFIGS / "local.toml").read_text()
    doc = tomllib.loads(text)
    for section, key, default in _schema():
        if section in ("metadata", "bookies") and default is MISSING:
            continue  # required: no default to show
        if default == "":  # optional path, "" = derived: set, or shown as a comment
            table = doc[section][0] if section == "bookies" else doc[section]
            assert key in table or f"# {key} = " in text, f"configs/local.toml lacks {key}"
            continue
        table = doc[section][0] if section == "bookies" else doc[section]
        assert key in table, f"configs/local.toml lacks [{section}] {key}"
        shown = tuple(table[key]) if isinstance(default, tuple) else table[key]
        assert shown == default, f"[{section}] {key}: local.toml shows {shown}, code has {default}"


def test_docs_describe_every_key():
    text = (REPO / "docs" / "CONFIG.md").read_text()
    missing = [f"{s}.{k}" for s, k, _ in _schema() if f"`{k}`" not in text]
    assert not missing, f"docs/CONFIG.md does not describe {missing}"


# -- path resolution -----------------------------------------------------------------------
def test_relative_paths_resolve_against_the_config_folder(tmp_path, monkeypatch):
    monkeypatch.chdir("/")
    (tmp_path / "etc").mkdir()
    config = load_config(write(tmp_path / "etc", minimal(3)))
    assert config.base_dir == tmp_path / "etc"
    assert config.metadata.uri == f"sqlite:///{tmp_path / 'etc' / 'meta.db'}"
    assert config.bookies[0].journal_dir == tmp_path / "etc" / "data" / "b0" / "journal"
    assert config.bookies[0].endpoint == f"ipc://{tmp_path / 'etc' / 'data' / 'b0.sock'}"


def test_absolute_sqlite_and_ipc_paths_stay_absolute(tmp_path):
    text = minimal(3).replace('"sqlite:///meta.db"', '"sqlite:////var/tmp/x/meta.db"')
    text = text.replace('"ipc://data/b0.sock"', '"ipc:///tmp/b0.sock"')
    config = load_config(write(tmp_path, text))
    assert config.metadata.uri == "sqlite:////var/tmp/x/meta.db"
    assert config.bookies[0].endpoint == "ipc:///tmp/b0.sock"


def test_defaults_fill_missing_sections(tmp_path):
    config = load_config(write(tmp_path, minimal(3)))
    assert config.storage.journal_group_wait_us == 0
    assert config.server.drain_messages_max == 256
    assert (config.client.ensemble, config.client.write_quorum, config.client.ack_quorum) == (
        3, 3, 2)
    assert config.supervisor.ping_interval_ms == 1000
    limits = config.wire_limits()
    # the wire takes the largest legal record: a 5 MiB payload plus header and digest
    assert limits.entry_bytes_max == 5 * 1024 * 1024 + ENTRY_OVERHEAD_MAX
    assert limits.batch_entries_max == 8192


# -- refusals: one line naming the key and the fix ----------------------------------------
REFUSALS = [
    (minimal(1).replace("journal_dir", "jornal_dir"), "bookies[0].jornal_dir",
     "did you mean journal_dir"),
    (minimal(3, "\n[storag]\ndirect_io = false\n"), "storag", "did you mean [storage]"),
    (minimal(3, "\n[storage]\njournal_group_wiat_us = 5\n"),
     "storage.journal_group_wiat_us", "did you mean journal_group_wait_us"),
    (minimal(3, "\n[client]\nadd_timeout = 5\n"), "client.add_timeout", "add_timeout_ms"),
    (minimal(2).replace('ledger_dir = "data/b1/ledgers"\n', ""), "bookies[1].ledger_dir",
     "missing required key"),
    (minimal(1).replace('[metadata]\nuri = "sqlite:///meta.db"\n', ""), "metadata",
     "missing section"),
    (minimal(1).replace('uri = "sqlite:///meta.db"', 'session_timeout_ms = 5000'),
     "metadata.uri", "missing required key"),
    ('[metadata]\nuri = "sqlite:///m.db"\n', "bookies", "no bookies"),
    ('[metadata]\nuri = "sqlite:///m.db"\n[bookies]\nid = "x"\n', "bookies",
     "array of tables"),
    (minimal(2).replace('id = "b1"', 'id = "b0"'), "bookies[1].id", "also bookies[0]"),
    (minimal(2).replace('"ipc://data/b1.sock"', '"ipc://./data/../data/b0.sock"'),
     "bookies[1].endpoint", "also used by bookies[0]"),
    (minimal(2).replace('"data/b1/ledgers"', '"data/b0/journal"'), "bookies[1].ledger_dir",
     "overlaps bookies[0].journal_dir"),
    (minimal(2).replace('"data/b1/journal"', '"data/b0/ledgers/j"'),
     "bookies[1].journal_dir", "overlaps"),
    (minimal(1).replace('"data/b0/ledgers"', '"data/b0/journal"'), "bookies[0].ledger_dir",
     "overlaps bookies[0].journal_dir"),
    (minimal(1).replace('"ipc://data/b0.sock"', '"http://x:1"'), "bookies[0].endpoint",
     "unsupported scheme"),
    (minimal(1).replace('"ipc://data/b0.sock"', '"tcp://127.0.0.1"'), "bookies[0].endpoint",
     "tcp://host:port"),
    (minimal(1).replace('"ipc://data/b0.sock"', '"tcp://127.0.0.1:0"'), "bookies[0].endpoint",
     "port 1-65535"),
    (minimal(1).replace('"ipc://data/b0.sock"', f'"ipc://{"x" * 120}.sock"'),
     "bookies[0].endpoint", "over 107 bytes"),
    (minimal(1).replace('"sqlite:///meta.db"', '"mysql://db/x"'), "metadata.uri",
     "unsupported scheme"),
    (minimal(1).replace('"sqlite:///meta.db"', '"zk://localhost/x"'), "metadata.uri",
     "host:port"),
    (minimal(1).replace('"sqlite:///meta.db"', '"sqlite://:memory:"'), "metadata.uri",
     "names a file"),
    (minimal(3).replace("[metadata]\n", "[metadata]\nsession_timeout_ms = \"10s\"\n"),
     "metadata.session_timeout_ms", "must be an integer"),
    (minimal(3, "\n[storage]\ndirect_io = \"yes\"\n"), "storage.direct_io", "true or false"),
    (minimal(3, "\n[storage]\ncheckpoint_interval_s = true\n"),
     "storage.checkpoint_interval_s", "must be a number"),
    (minimal(1).replace('ledgers"\n', 'ledgers"\ncpus = ["a"]\n'), "bookies[0].cpus",
     "list of CPU numbers"),
    (minimal(1).replace('ledgers"\n', 'ledgers"\ncpus = [1, 1]\n'), "bookies[0].cpus",
     "twice"),
    (minimal(1).replace('id = "b0"', 'id = "bad id!"'), "bookies[0].id", "not a valid id"),
    (minimal(3, "\n[server]\ndrain_messages_max = 0\n"), "server.drain_messages_max",
     "out of range"),
    (minimal(2), "client.ensemble", "more than the 2 configured bookies"),
    (minimal(3, "\n[client]\nwrite_quorum = 4\n"), "client.write_quorum", "above ensemble"),
    (minimal(3, "\n[client]\nack_quorum = 3\nwrite_quorum = 2\n"), "client.ack_quorum",
     "above write_quorum"),
    (minimal(3, "\n[client]\ndigest = \"md5\"\n"), "client.digest", "crc32c"),
    (minimal(3, "\n[client]\nadd_batch_entries_max = 9000\n"),
     "client.add_batch_entries_max", "raise server.batch_entries_max"),
    (minimal(3, "\n[supervisor]\nrestart_backoff_min_ms = 20000\n"),
     "supervisor.restart_backoff_min_ms", "restart_backoff_max_ms"),
    (minimal(3, "\n[storage]\nentry_log_buffer_bytes = 5000\n"),
     "storage.entry_log_buffer_bytes", "multiple of 4096"),
    (minimal(3, "\n[storage]\njournal_group_bytes = 0\n"), "storage.journal_group_bytes",
     "positive"),
    (minimal(3, "\n[storage]\nentry_bytes_max = 100000000\n"), "storage.",
     "add_batch_bytes_max"),
    (minimal(3) + "\nthis is not toml\n", "cannot read TOML", "line"),
]


@pytest.mark.parametrize("text, key, words", REFUSALS,
                         ids=[f"{i}-{r[1]}" for i, r in enumerate(REFUSALS)])
def test_bad_configs_are_refused_with_one_line_naming_the_key(tmp_path, text, key, words):
    message = refusal(tmp_path, text)
    assert str(tmp_path) in message
    assert key in message and words in message, message


def test_a_missing_config_file_is_one_clear_line(tmp_path):
    with pytest.raises(ConfigError, match="config file not found; fix: pass --config"):
        load_config(tmp_path / "nope.toml")


# -- host checks -------------------------------------------------------------------------
def _no_direct_io(path, flags, mode=0o777):
    if flags & os.O_DIRECT:
        raise OSError(errno.EINVAL, "Invalid argument")
    return os.open(path, flags, mode)


def test_host_check_passes_and_creates_nothing(tmp_path):
    config = load_config(write(tmp_path, minimal(3)))
    before = sorted(tmp_path.rglob("*"))
    check_host(config)
    assert sorted(tmp_path.rglob("*")) == before  # probe files removed, no dirs made


def test_check_host_is_importable_from_appliance_config_as_documented_without_kazoo():
    assert documented_check_host is check_host  # docs/CONFIG.md's import works
    code = ("import sys, appliance.config\n"
            "print('kazoo' in sys.modules)\n"
            "from appliance.config import check_host\n"
            "print('kazoo' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True, cwd=Path(__file__).resolve().parents[1])
    # a client imports appliance.config; only what checks hosts loads kazoo
    assert out.stdout.split() == ["False", "True"], out.stdout + out.stderr


def test_a_device_without_direct_io_is_refused_before_start(tmp_path):
    config = load_config(write(tmp_path, minimal(3)))
    with pytest.raises(ConfigError) as info:
        check_host(config, open_fn=_no_direct_io)
    message = str(info.value)
    assert "bookies[0].journal_dir" in message and "does not support direct I/O" in message
    assert "direct_io = false" in message and "\n" not in message


def test_direct_io_false_skips_the_probe(tmp_path):
    config = load_config(write(tmp_path, minimal(3, "\n[storage]\ndirect_io = false\n")))
    check_host(config, open_fn=_no_direct_io)  # no refusal: the probe is not run


def test_the_real_probe_writes_with_o_direct_here(tmp_path):
    assert probe_direct_io(tmp_path / "not" / "yet" / "there") is None
    assert list(tmp_path.iterdir()) == []


def test_a_data_path_under_a_file_is_refused(tmp_path):
    (tmp_path / "data").write_text("a file, not a folder")
    config = load_config(write(tmp_path, minimal(3)))
    with pytest.raises(ConfigError, match=r"bookies\[0\]\.journal_dir: .* cannot be created"):
        check_host(config)


def test_a_dir_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "data" / "b0").mkdir(parents=True)
    (tmp_path / "data" / "b0" / "journal").write_text("oops")
    config = load_config(write(tmp_path, minimal(3)))
    with pytest.raises(ConfigError, match=r"bookies\[0\]\.journal_dir: .* not a directory"):
        check_host(config)


def test_unavailable_cpus_are_refused(tmp_path):
    text = minimal(3).replace('b0/ledgers"\n', 'b0/ledgers"\ncpus = [4096]\n')
    config = load_config(write(tmp_path, text))
    with pytest.raises(ConfigError, match=r"bookies\[0\]\.cpus: CPUs \[4096\] are not"):
        check_host(config)


# -- resolve_target ------------------------------------------------------------------------
def test_resolve_target_takes_a_metadata_uri(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert resolve_target("sqlite:///m.db") == (f"sqlite:///{tmp_path / 'm.db'}", tmp_path,
                                                 None)
    assert resolve_target("zk://127.0.0.1:2181/app") == ("zk://127.0.0.1:2181/app",
                                                          tmp_path, None)
    with pytest.raises(ConfigError, match="unsupported scheme"):
        resolve_target("mysql://x")


def test_resolve_target_takes_a_config_path(tmp_path):
    path = write(tmp_path, minimal(3))
    uri, base, config = resolve_target(path)
    assert (uri, base) == (f"sqlite:///{tmp_path / 'meta.db'}", tmp_path)
    assert config == load_config(path)


# -- placement labels ------------------------------------------------------------------------
def test_bookie_host_defaults_to_this_machine_and_rack_to_the_default(tmp_path):
    import socket

    config = load_config(write(tmp_path, minimal(3)))
    assert [b.host for b in config.bookies] == [socket.gethostname()] * 3
    assert [b.rack for b in config.bookies] == ["default-rack"] * 3
    assert config.client.placement == "host"


def test_bookie_labels_are_read_and_checked(tmp_path):
    labelled = minimal(3).replace('id = "b0"', 'id = "b0"\nhost = "h0"\nrack = "r/1"')
    config = load_config(write(tmp_path, labelled + '[client]\nplacement = "rack"\n'))
    assert (config.bookies[0].host, config.bookies[0].rack) == ("h0", "r/1")
    assert config.client.placement == "rack"
    bad = minimal(1).replace('id = "b0"', 'id = "b0"\nhost = "-no good"')
    assert "bookies[0].host: '-no good' is not a valid host" in refusal(tmp_path, bad)
    bad = minimal(1).replace('id = "b0"', 'id = "b0"\nhost = ""')
    assert "bookies[0].host: must be a non-empty string" in refusal(tmp_path, bad)
    assert "client.placement: 'zone' is not supported" in refusal(
        tmp_path, minimal(1) + '[client]\nensemble = 1\nwrite_quorum = 1\nack_quorum = 1\n'
                               'placement = "zone"\n')


def test_one_host_cannot_sit_in_two_racks(tmp_path):
    text = minimal(3).replace('id = "b0"', 'id = "b0"\nhost = "h"\nrack = "r1"')
    text = text.replace('id = "b1"', 'id = "b1"\nhost = "h"\nrack = "r2"')
    message = refusal(tmp_path, text)
    assert "bookies[1].rack: host 'h' is in rack 'r1' at bookies[0]" in message


# -- client.gc_threshold ------------------------------------------------------------------
def test_gc_threshold_is_raised_by_connect_never_lowered(tmp_path, monkeypatch):
    import gc

    from appliance.client.client import raise_gc_threshold

    saved = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        raise_gc_threshold(50_000)
        assert gc.get_threshold() == (50_000, 10, 10)
        raise_gc_threshold(1_000)  # an application's higher setting stays
        assert gc.get_threshold() == (50_000, 10, 10)
    finally:
        gc.set_threshold(*saved)
    config = load_config(write(tmp_path, minimal(extra="[client]\ngc_threshold = 50000\n")))
    assert config.client.gc_threshold == 50_000
    with pytest.raises(ConfigError, match="gc_threshold"):
        load_config(write(tmp_path, minimal(extra="[client]\ngc_threshold = -1\n")))


# -- client.switch_interval_us ------------------------------------------------------------
def test_switch_interval_is_raised_by_connect_never_lowered(tmp_path):
    import sys

    import appliance
    from appliance.client.client import Client, raise_switch_interval

    saved = sys.getswitchinterval()
    try:
        sys.setswitchinterval(0.005)
        raise_switch_interval(50_000)
        assert sys.getswitchinterval() == pytest.approx(0.05)
        raise_switch_interval(20_000)  # an application's higher setting stays
        assert sys.getswitchinterval() == pytest.approx(0.05)
        sys.setswitchinterval(0.005)
        config = write(tmp_path, minimal(extra="[client]\nswitch_interval_us = 30000\n"))
        assert load_config(config).client.switch_interval_us == 30_000
        with appliance.connect(config):  # the metadata store only: no bookie is needed
            assert sys.getswitchinterval() == pytest.approx(0.03)
        sys.setswitchinterval(0.005)
        with appliance.connect(write(tmp_path, minimal())):  # 0: left alone
            assert sys.getswitchinterval() == pytest.approx(0.005)
        with Client(str(config)):  # a bookie's own client (repairs): the bookie's is kept
            assert sys.getswitchinterval() == pytest.approx(0.005)
    finally:
        sys.setswitchinterval(saved)
    for bad in ("-1", "1000001"):
        with pytest.raises(ConfigError, match="switch_interval_us"):
            load_config(write(tmp_path, minimal(extra=f"[client]\nswitch_interval_us = {bad}\n")))


def _tcp_bookies(ports) -> str:
    text = minimal(len(ports))
    for i, port in enumerate(ports):
        text = text.replace(f'"ipc://data/b{i}.sock"', f'"tcp://10.1.2.3:{port}"')
    return text


def test_log_servers_serve_on_ipc_beside_ipc_bookies(tmp_path):
    config = load_config(write(tmp_path, minimal(3)))
    assert config.log_server_endpoint("logserver-1") == \
        f"ipc://{config.run_path / 'logserver-1.sock'}"


def test_log_servers_serve_on_tcp_beside_tcp_bookies(tmp_path):
    config = load_config(write(tmp_path, _tcp_bookies([3181, 3183, 3182])))
    assert [config.log_server_endpoint(s) for s in config.log_server_ids()] == \
        ["tcp://10.1.2.3:3184", "tcp://10.1.2.3:3185"]
    config = load_config(write(tmp_path, _tcp_bookies([3181, 3182, 3183]) +
                               "[log]\nservers = 3\nport_base = 4000\n"))
    assert [config.log_server_endpoint(s) for s in config.log_server_ids()] == \
        ["tcp://10.1.2.3:4000", "tcp://10.1.2.3:4001", "tcp://10.1.2.3:4002"]


def test_log_server_ports_over_a_bookie_or_past_65535_are_refused(tmp_path):
    message = refusal(tmp_path, _tcp_bookies([3181, 3182, 3183]) + "[log]\nport_base = 3180\n")
    assert "log.port_base: log server port 3181 is bookie b0's" in message
    message = refusal(tmp_path, _tcp_bookies([3181, 3182, 3183]) + "[log]\nport_base = 65535\n")
    assert "log.port_base: log server ports 65535..65536 go past 65535" in message

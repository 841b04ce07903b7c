"""``bkctl bookie fix-cookie``'s decisions (``appliance.bookie.cookies``),
without processes: which disks it accepts, what it refuses, what it records."""

from __future__ import annotations

import json
import shutil

import pytest

from appliance.bookie.cookies import check_metadata_cookie, fix_cookie
from appliance.config import load_config
from appliance.errors import CookieMismatchError
from appliance.meta.bookies import BookieRegistry
from storage import LedgerStorage
from storage import cookie as ck
from storage.metadata import open_store
from tests.support.launch import write_config


@pytest.fixture
def setup(tmp_path):
    config = load_config(write_config(tmp_path, 3))
    store = open_store(config.metadata.uri, base_dir=config.base_dir)
    registry = BookieRegistry(store)
    spec = config.bookie("bookie-1")
    for d in (spec.journal_dir, spec.ledger_dir):
        d.mkdir(parents=True)
    LedgerStorage.format("bookie-1", spec.journal_dir, spec.ledger_dir,
                         config.storage.to_options())
    instance = ck.read_cookie(str(spec.ledger_dir))["instance_id"]
    registry.write_cookie("bookie-1", json.dumps({"bookie_id": "bookie-1",
                                                  "instance_id": instance}).encode())
    yield config, registry, spec
    store.close()


def _meta_instance(registry) -> str:
    return json.loads(registry.read_cookie("bookie-1")[0])["instance_id"]


def test_two_new_empty_disks_are_formatted_and_named_in_metadata(setup):
    config, registry, spec = setup
    for d in (spec.journal_dir, spec.ledger_dir):  # two new empty disks
        shutil.rmtree(d)
        d.mkdir()
    done = fix_cookie(config, "bookie-1", registry)
    new = ck.read_cookie(str(spec.ledger_dir))["instance_id"]
    assert _meta_instance(registry) == new
    assert ck.read_marker(str(spec.ledger_dir), ck.POSSIBLE_LOSS_NAME)["reasons"]
    assert any("formatted" in line for line in done)


def test_a_directory_with_foreign_data_is_refused_unless_reformat(setup, tmp_path):
    config, registry, spec = setup
    other = config.bookie("bookie-2")
    for d in (other.journal_dir, other.ledger_dir):
        d.mkdir(parents=True)
    LedgerStorage.format("bookie-2", other.journal_dir, other.ledger_dir,
                         config.storage.to_options())
    (spec.journal_dir / ck.COOKIE_NAME).write_bytes(
        (other.journal_dir / ck.COOKIE_NAME).read_bytes())  # bookie-2's journal disk
    with pytest.raises(CookieMismatchError, match="--reformat"):
        fix_cookie(config, "bookie-1", registry)
    done = fix_cookie(config, "bookie-1", registry, reformat=True)
    assert any("wiped journal_dir" in line for line in done)
    docs = [ck.read_cookie(str(d)) for d in (spec.journal_dir, spec.ledger_dir)]
    assert docs[0]["instance_id"] == docs[1]["instance_id"] == _meta_instance(registry)


def test_a_running_bookie_is_not_touched(setup):
    config, registry, spec = setup
    registry.register("bookie-1", spec.endpoint, {})
    with pytest.raises(CookieMismatchError, match="stop it"):
        fix_cookie(config, "bookie-1", registry)


def test_boot_refuses_a_mismatch_naming_fix_cookie_or_fixes_it(setup):
    config, registry, spec = setup
    registry.write_cookie("bookie-1", b'{"bookie_id": "bookie-1", "instance_id": "old"}',
                          expected_version=registry.read_cookie("bookie-1")[1])
    storage = LedgerStorage.open("bookie-1", spec.journal_dir, spec.ledger_dir,
                                 config.storage.to_options())
    try:
        with pytest.raises(CookieMismatchError, match="bkctl bookie fix-cookie bookie-1"):
            check_metadata_cookie(registry, "bookie-1", storage, auto_fix=False)
        check_metadata_cookie(registry, "bookie-1", storage, auto_fix=True)
        assert _meta_instance(registry) == storage.instance_id
        assert any("cookie mismatch" in r for r in storage.possible_loss_reasons)
    finally:
        storage.close()

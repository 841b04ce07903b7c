"""``bkctl bookie fix-cookie``'s decisions (``appliance.bookie.cookies``),
without processes: which disks it accepts, what it refuses, what it records;
and when a boot calls empty disks a possible loss (BP-46)."""

from __future__ import annotations

import json
import shutil

import pytest

from appliance.bookie.cookies import check_metadata_cookie, fix_cookie
from appliance.bookie.server import possible_loss
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


def test_empty_disks_are_a_possible_loss_only_under_an_instance_the_store_did_not_know(setup):
    # a bookie killed before it stored anything, named in a ledger made while
    # it was down, comes back: it acknowledged nothing (its journal would hold
    # it), so no limbo (before: limbo, and that ledger's recovery answered
    # "unknown" for an entry one other bookie held: unrecoverable for good)
    config, registry, spec = setup
    named = [(7, False)]
    storage = LedgerStorage.open("bookie-1", spec.journal_dir, spec.ledger_dir,
                                 config.storage.to_options())
    try:
        assert storage.fresh
        known = check_metadata_cookie(registry, "bookie-1", storage)
        assert known
        assert possible_loss(storage, named, known) == []
        assert storage.possible_loss_reasons == []
    finally:
        storage.close()
    other = config.bookie("bookie-2")  # its cookie not in the store yet (first boot)
    for d in (other.journal_dir, other.ledger_dir):
        d.mkdir(parents=True)
    LedgerStorage.format("bookie-2", other.journal_dir, other.ledger_dir,
                         config.storage.to_options())
    storage = LedgerStorage.open("bookie-2", other.journal_dir, other.ledger_dir,
                                 config.storage.to_options())
    try:
        known = check_metadata_cookie(registry, "bookie-2", storage)
        assert not known
        assert any("empty directories" in r for r in possible_loss(storage, named, known))
    finally:
        storage.close()

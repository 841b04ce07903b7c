"""Key custody (``appliance.meta.custody``): ledger master keys sealed to the
cluster key in metadata, opened only with the private key file."""

from __future__ import annotations

import dataclasses
import os
import stat
import threading

from appliance.meta.custody import KeyCustody, open_custody, read_public_key, seal
from appliance.protocol.keys import master_key, password_hash
from appliance.protocol.metadata import LedgerMetadata
from storage.metadata import open_store


def ledger(key: bytes, sealed: bytes | None) -> LedgerMetadata:
    return LedgerMetadata(ledger_id=3, ensemble_size=1, write_quorum=1, ack_quorum=1,
                          ensembles=((0, ("b",)),), password_hash=password_hash(key),
                          sealed_key=sealed)


def test_first_bookie_creates_the_key_and_others_share_it(tmp_path):
    key_file = tmp_path / "run" / "cluster.key"
    with open_store(f"sqlite:///{tmp_path}/md.db") as store:
        made = []
        threads = [threading.Thread(target=lambda: made.append(open_custody(store, key_file)))
                   for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len({c.public_key for c in made}) == 1
        assert read_public_key(store) == made[0].public_key
        assert stat.S_IMODE(os.stat(key_file).st_mode) == 0o600


def test_sealed_key_opens_only_with_the_private_key_and_only_if_it_matches(tmp_path):
    with open_store(f"sqlite:///{tmp_path}/md.db") as store:
        custody = open_custody(store, tmp_path / "cluster.key")
        key = master_key(b"secret")
        md = ledger(key, seal(custody.public_key, key))
        assert md.sealed_key != key and key not in md.sealed_key
        assert custody.unseal(md) == key
        # metadata round trip keeps it
        assert LedgerMetadata.from_bytes(md.to_bytes()).sealed_key == md.sealed_key
        # another ledger's sealed key (another password) does not pass the check
        other = seal(custody.public_key, master_key(b"other"))
        assert custody.unseal(dataclasses.replace(md, sealed_key=other)) is None
        # another appliance's private key cannot open it
        stranger = KeyCustody(bytes(32 * [7]))
        assert stranger.unseal(md) is None
        assert custody.unseal(ledger(key, None)) is None


def test_a_missing_or_foreign_key_file_disables_custody_with_a_log_line(tmp_path, caplog):
    with open_store(f"sqlite:///{tmp_path}/md.db") as store:
        assert open_custody(store, tmp_path / "a.key") is not None
        assert open_custody(store, tmp_path / "missing" / "b.key") is None
        assert "missing" in caplog.text
        with open_store(f"sqlite:///{tmp_path}/other.db") as other:
            open_custody(other, tmp_path / "c.key")  # another appliance's key file
        assert open_custody(store, tmp_path / "c.key") is None
        assert "does not hold the private key" in caplog.text

"""Sessions on both backends: ephemeral nodes live exactly as long as their
owner (within the stated bound), and a lost session is replaced and
reported."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.support.launch import stop_process, wait_for

REPO = Path(__file__).resolve().parents[2]

OWNER_SCRIPT = """
import sys
from storage.metadata import open_store
store = open_store(sys.argv[1], session_timeout_ms=int(sys.argv[2]))
store.create("/owned", b"", ephemeral=True)
sys.stdin.read()  # live until killed
"""


def test_ephemeral_node_vanishes_after_owner_is_killed(backend):
    observer = backend.open()
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER_SCRIPT, backend.uri, str(backend.session_timeout_ms)],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        wait_for(lambda: observer.exists("/owned"), timeout_s=60, what="owner's node")
        owner.send_signal(signal.SIGKILL)
        owner.wait(timeout=30)
        killed_at = time.monotonic()
        # The stated bound: gone within the session timeout of the death.
        wait_for(lambda: not observer.exists("/owned"), timeout_s=backend.expiry_bound_s,
                 what="ephemeral node to expire")
        gone_after_s = time.monotonic() - killed_at
        assert gone_after_s <= backend.expiry_bound_s
        assert observer.children("/") == []
    finally:
        stop_process(owner, 30, signal.SIGKILL)


def test_ephemeral_node_outlives_the_session_timeout_while_owner_lives(backend):
    owner, observer = backend.open(), backend.open()
    owner.create("/alive", b"", ephemeral=True)
    # Nothing changes for two session timeouts: heartbeats keep the lease.
    assert observer.wait_for_change("/alive", 0, 2 * backend.session_timeout_ms / 1000) is None
    assert observer.exists("/alive")
    assert owner.ephemeral_owner("/alive") == owner.session_id


def test_lost_session_is_replaced_and_listeners_told(backend):
    owner, observer = backend.open(), backend.open()
    told = threading.Event()
    owner.add_session_listener(told.set)
    owner.create("/mine", b"", ephemeral=True)
    old_session = owner.session_id
    backend.expire_session(owner)
    wait_for(told.is_set, timeout_s=backend.expiry_bound_s, what="session listener")
    assert owner.session_id != old_session
    assert not observer.exists("/mine")
    owner.create("/mine", b"", ephemeral=True)
    assert observer.ephemeral_owner("/mine") == owner.session_id

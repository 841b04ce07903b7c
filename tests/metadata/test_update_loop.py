"""The one metadata update loop (``appliance.meta.update_loop``) on both
backends: a conflict storm converges with every transform applied exactly
once; conflicts are retried a bounded number of times with a bounded,
jittered, injected back-off; ``NO_CHANGE`` and an aborting transform write
nothing; the create-when-absent and exact-version options."""

from __future__ import annotations

import json
import random
import threading
import time

import pytest

from appliance.autorecovery.marks import MARKS, Marks
from appliance.errors import MetadataVersionError, NodeExistsError, NoNodeError
from appliance.meta.update_loop import NO_CHANGE, MetadataUpdateLoop, backoff_cap_ms
from appliance.protocol import limits

PATH = "/loop/record"
THREADS = 16
UPDATES_PER_THREAD = 50
STORM_RETRIES_MAX = 10_000  # bounded, far above what 16 writers need
JOIN_TIMEOUT_S = 240


def _decode(data: bytes) -> list:
    return json.loads(data)


def _encode(value: list) -> bytes:
    return json.dumps(value).encode()


def _append(token: str):
    return lambda tokens: [*(tokens or []), token]


class _Sleeps:
    """An injected sleep that records each call and returns at once."""

    def __init__(self):
        self.calls: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)


class _ConflictingStore:
    """A real store whose next ``conflicts`` writes lose to an invisible rival."""

    def __init__(self, store, conflicts: int):
        self._store = store
        self.conflicts = conflicts
        self.writes = 0

    def get(self, path):
        return self._store.get(path)

    def set(self, path, data, version):
        self.writes += 1
        if self.conflicts > 0:
            self.conflicts -= 1
            raise MetadataVersionError(f"{path}: expected version {version}, found (rival)")
        return self._store.set(path, data, version)

    def create(self, path, data=b"", **kwargs):
        return self._store.create(path, data, **kwargs)


def _run_threads(targets) -> None:
    threads = [threading.Thread(target=t, daemon=True) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN_TIMEOUT_S)
    assert not any(t.is_alive() for t in threads), "a storm thread did not finish"


def test_a_conflict_storm_applies_every_transform_exactly_once(backend):
    """16 threads x 50 appends to one record, each thread on its own store
    session, with the production back-off: every token lands once, in
    exactly one version each."""
    backend.open().create(PATH, _encode([]), make_parents=True)
    stores = [backend.open() for _ in range(THREADS)]
    versions: list[int] = []
    errors: list[BaseException] = []
    backoffs: list[float] = []
    lock = threading.Lock()

    def back_off(seconds: float) -> None:  # the production sleep, counted
        backoffs.append(seconds)
        time.sleep(seconds)

    def writer(index: int):
        loop = MetadataUpdateLoop(stores[index], sleep=back_off, rng=random.Random(index))
        try:
            for n in range(UPDATES_PER_THREAD):
                token = f"{index}:{n}"
                done = loop.update(PATH, _append(token), decode=_decode, encode=_encode,
                                   retries_max=STORM_RETRIES_MAX)
                assert done.changed and done.value[-1] == token
                with lock:
                    versions.append(done.version)
        except BaseException as exc:
            errors.append(exc)

    _run_threads([lambda i=i: writer(i) for i in range(THREADS)])
    assert errors == []
    data, version = backend.open().get(PATH)
    tokens = _decode(data)
    total = THREADS * UPDATES_PER_THREAD
    assert sorted(tokens) == sorted(f"{i}:{n}" for i in range(THREADS)
                                    for n in range(UPDATES_PER_THREAD))
    assert version == total
    assert sorted(versions) == list(range(1, total + 1))  # one winning CAS per update
    assert backoffs and max(backoffs) <= limits.METADATA_BACKOFF_MS_MAX / 1000  # it was a storm
    for i in range(THREADS):  # each thread's own updates in its order
        mine = [t for t in tokens if t.startswith(f"{i}:")]
        assert mine == [f"{i}:{n}" for n in range(UPDATES_PER_THREAD)]


def test_a_mark_storm_keeps_every_missing_bookie(backend):
    """Marks go through the loop: racing auditors marking different bookies
    of one ledger (created by the first) end with the union."""
    bookies = [f"bookie-{i}" for i in range(8)]
    results: dict[str, bool] = {}

    def auditor(bookie: str):
        results[bookie] = Marks(backend.open(), rng=random.Random(bookie)).mark(
            7, [bookie], f"lost {bookie}", 1000)

    _run_threads([lambda b=b: auditor(b) for b in bookies])
    assert results == {b: True for b in bookies}
    doc = json.loads(backend.open().get(f"{MARKS}/7")[0])
    assert doc["missing"] == sorted(bookies)
    assert len(doc["reasons"]) == 5 and doc["since_ms"] == 1000


def test_retries_run_out_in_one_error_naming_the_path_and_count(store):
    store.create(PATH, _encode([]), make_parents=True)
    sleeps = _Sleeps()
    conflicting = _ConflictingStore(store, conflicts=1_000)
    loop = MetadataUpdateLoop(conflicting, sleep=sleeps, rng=random.Random(1))
    calls = []

    def transform(tokens):
        calls.append(list(tokens))
        return [*tokens, "x"]

    with pytest.raises(MetadataVersionError, match=f"{PATH}: gave up after 3 conflicts") as info:
        loop.update(PATH, transform, decode=_decode, encode=_encode, retries_max=3)
    assert isinstance(info.value.__cause__, MetadataVersionError)
    assert len(calls) == 4 and conflicting.writes == 4  # the first try and 3 retries
    assert len(sleeps.calls) == 3  # no sleep after the last conflict
    assert store.get(PATH) == (_encode([]), 0)
    with pytest.raises(MetadataVersionError, match="gave up doing it after 0 conflicts"):
        loop.update(PATH, transform, decode=_decode, encode=_encode, retries_max=0,
                    action="doing it")
    with pytest.raises(ValueError, match="retries_max"):
        loop.update(PATH, transform, decode=_decode, encode=_encode, retries_max=-1)


def test_conflicts_within_the_bound_are_retried_to_success(store):
    store.create(PATH, _encode([]), make_parents=True)
    sleeps = _Sleeps()
    loop = MetadataUpdateLoop(_ConflictingStore(store, conflicts=3), sleep=sleeps)
    done = loop.update(PATH, _append("x"), decode=_decode, encode=_encode, retries_max=3)
    assert (done.value, done.version, done.changed) == (["x"], 1, True)
    assert len(sleeps.calls) == 3


def test_back_off_grows_exponentially_with_bounded_jitter(store):
    store.create(PATH, _encode([]), make_parents=True)
    conflicts = 12

    def sleeps_of(rng) -> list[float]:
        sleeps = _Sleeps()
        MetadataUpdateLoop(_ConflictingStore(store, conflicts), sleep=sleeps, rng=rng).update(
            PATH, _append("x"), decode=_decode, encode=_encode, retries_max=conflicts)
        return sleeps.calls

    caps_ms = [backoff_cap_ms(attempt) for attempt in range(conflicts)]
    assert caps_ms[:6] == [1, 2, 4, 8, 16, 20] and max(caps_ms) == limits.METADATA_BACKOFF_MS_MAX

    class _Top(random.Random):
        def random(self) -> float:
            return 1.0

    assert sleeps_of(_Top()) == [cap / 1000 for cap in caps_ms]  # the jitter's upper bound
    jittered = sleeps_of(random.Random(42))
    assert all(0 <= s <= cap / 1000 for s, cap in zip(jittered, caps_ms, strict=True))
    assert len(set(jittered)) == conflicts  # jittered, not a fixed schedule
    assert sleeps_of(random.Random(42)) == jittered  # one seed, one schedule
    assert backoff_cap_ms(10_000) == limits.METADATA_BACKOFF_MS_MAX  # no overflow for absurd counts


def test_no_change_writes_nothing(store):
    store.create(PATH, _encode(["a"]), make_parents=True)
    sleeps = _Sleeps()
    conflicting = _ConflictingStore(store, conflicts=0)
    done = MetadataUpdateLoop(conflicting, sleep=sleeps).update(
        PATH, lambda tokens: NO_CHANGE, decode=_decode, encode=_encode, retries_max=3)
    assert (done.value, done.version, done.changed) == (["a"], 0, False)
    assert conflicting.writes == 0 and sleeps.calls == []
    assert store.get(PATH) == (_encode(["a"]), 0)


def test_a_transform_that_raises_aborts_without_writing_or_retrying(store):
    store.create(PATH, _encode([]), make_parents=True)
    calls = []

    def refuse(tokens):
        calls.append(tokens)
        raise NodeExistsError("refused")  # even an error a write could raise

    with pytest.raises(NodeExistsError, match="refused"):
        MetadataUpdateLoop(store).update(PATH, refuse, decode=_decode, encode=_encode,
                                         retries_max=3, create_missing=True)
    assert len(calls) == 1 and store.get(PATH) == (_encode([]), 0)


def test_a_missing_node_raises_or_is_created(backend):
    store, rival = backend.open(), backend.open()
    loop = MetadataUpdateLoop(store, sleep=_Sleeps())
    with pytest.raises(NoNodeError, match=PATH):
        loop.update(PATH, _append("x"), decode=_decode, encode=_encode, retries_max=3)
    with pytest.raises(KeyError, match="custom"):
        loop.update(PATH, _append("x"), decode=_decode, encode=_encode, retries_max=3,
                    missing_error=lambda exc: KeyError(f"custom: {exc}"))
    seen = []

    def racing(tokens):  # a rival creates the node between our read and our create
        seen.append(tokens)
        if len(seen) == 1:
            rival.create(PATH, _encode(["rival"]), make_parents=True)
        return [*(tokens or []), "mine"]

    done = loop.update(PATH, racing, decode=_decode, encode=_encode, retries_max=1,
                       create_missing=True)
    assert seen == [None, ["rival"]]
    assert (done.value, done.version) == (["rival", "mine"], 1)
    store.delete(PATH)
    created = loop.update(PATH, _append("first"), decode=_decode, encode=_encode,
                          retries_max=0, create_missing=True)
    assert (created.value, created.version, created.changed) == (["first"], 0, True)


def test_expected_version_is_one_try_at_that_version(backend):
    store, rival = backend.open(), backend.open()
    store.create(PATH, _encode([]), make_parents=True)
    loop = MetadataUpdateLoop(store, sleep=_Sleeps())
    calls = []
    with pytest.raises(MetadataVersionError, match=f"{PATH}: expected version 5, found 0"):
        loop.update(PATH, lambda t: calls.append(t) or t, decode=_decode, encode=_encode,
                    retries_max=3, expected_version=5)
    assert calls == []

    def rival_first(tokens):
        rival.set(PATH, _encode(["rival"]), 0)
        return [*tokens, "mine"]

    with pytest.raises(MetadataVersionError) as info:
        loop.update(PATH, rival_first, decode=_decode, encode=_encode, retries_max=3,
                    expected_version=0)
    assert "gave up" not in str(info.value)  # the store's own conflict, not retried
    done = loop.update(PATH, _append("mine"), decode=_decode, encode=_encode, retries_max=0,
                       expected_version=1)
    assert (done.value, done.version) == (["rival", "mine"], 2)

"""Policy store against a real Redis: immutable, strictly increasing versions, overrides,
rollback, bounded history, and nothing lost when the store object is recreated."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest
import redis

from agent.policy_document import CategoryParams, SupersedeRule
from agent.wire import Keys, decode_policy, encode_policy
from controlplane.service.policy_memory import PolicyMemory
from controlplane.service.store import Base, PolicyStore, StoreError
from controlplane.service.store_terms import (
    MAX_FITTED_CATEGORIES,
    MAX_OVERRIDES,
    LeaseLost,
    PolicyLost,
)

pytestmark = pytest.mark.integration


def _p(rate: float, p: float = 0.5, life: float = 10.0) -> CategoryParams:
    return CategoryParams(rate=rate, p_reuse=p, life_s=life, samples=1000, source="fit")


@pytest.fixture
def store(redis_url: str, key_prefix: str) -> PolicyStore:
    return PolicyStore(redis.Redis.from_url(redis_url), Keys(key_prefix), history_size=5)


@dataclass(frozen=True)
class Watched:
    """A store whose refusals are counted (``on_refused``), and its client, to damage its
    keys."""

    client: redis.Redis
    store: PolicyStore
    counted: list[str]


def _watched(redis_url: str, key_prefix: str, max_categories: int, max_overrides: int) -> Watched:
    client, counted = redis.Redis.from_url(redis_url), list[str]()
    store = PolicyStore(
        client,
        Keys(key_prefix),
        max_categories=max_categories,
        max_overrides=max_overrides,
        on_refused=counted.append,
    )
    return Watched(client, store, counted)


@pytest.fixture
def watched(redis_url: str, key_prefix: str) -> Watched:
    """A store of the default bounds, its refusals counted."""
    return _watched(redis_url, key_prefix, MAX_FITTED_CATEGORIES, MAX_OVERRIDES)


@pytest.fixture
def watched_small(redis_url: str, key_prefix: str) -> Watched:
    """A store of 4 fitted categories and 2 overrides at most, its refusals counted."""
    return _watched(redis_url, key_prefix, max_categories=4, max_overrides=2)


def _said(caplog: pytest.LogCaptureFixture, refused: str = "refused") -> list[str]:
    """The messages logged that hold ``refused``."""
    return [r.getMessage() for r in caplog.records if refused in r.getMessage()]


def test_versions_strictly_increase_and_current_moves(store: PolicyStore) -> None:
    d1 = store.publish_fit({"text_1": _p(0.1)}, None, "first")
    d2 = store.publish_fit({"text_1": _p(0.2)}, None, "second")
    assert (d1.version, d2.version) == (1, 2)
    assert store.current_version() == 2
    current = store.current()
    assert current is not None
    assert current.categories["text_1"].rate == 0.2
    # Version 1 is immutable: still the first parameters.
    v1 = store.get(1)
    assert v1 is not None
    assert v1.categories["text_1"].rate == 0.1


def test_concurrent_publishers_never_share_a_version(redis_url: str, key_prefix: str) -> None:
    keys = Keys(key_prefix)
    versions: list[int] = []
    lock = threading.Lock()

    def publish_many() -> None:
        s = PolicyStore(redis.Redis.from_url(redis_url), keys, history_size=500)
        for i in range(20):
            doc = s.publish_fit({"a_1": _p(0.1 + i)}, None, "race")
            with lock:
                versions.append(doc.version)

    threads = [threading.Thread(target=publish_many) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(versions) == list(range(1, 81))


def test_override_publishes_and_delete_restores_fit(store: PolicyStore) -> None:
    store.publish_fit({"text_1": _p(0.1, 0.4, 20)}, None, "fit")
    doc = store.set_override("text_1", {"life_s": 99.0}).document
    t1 = doc.categories["text_1"]
    assert (t1.rate, t1.p_reuse, t1.life_s, t1.source) == (0.1, 0.4, 99.0, "override")
    # An override survives the next fit.
    doc = store.publish_fit({"text_1": _p(0.3, 0.4, 20)}, None, "refit")
    assert doc.categories["text_1"].life_s == 99.0
    assert doc.categories["text_1"].rate == 0.3
    released = store.delete_override("text_1")
    assert released.published and released.document.categories["text_1"].life_s == 20.0
    assert released.document.version == 4
    again = store.delete_override("text_1")  # no override left: nothing published
    assert (again.published, again.document.version) == (False, 4)


def test_bad_override_is_rejected_and_nothing_published(store: PolicyStore) -> None:
    store.publish_fit({"text_1": _p(0.1)}, None, "fit")
    with pytest.raises(ValueError):
        store.set_override("text_1", {"rate": -1.0})
    with pytest.raises(StoreError, match="rate, p_reuse, life_s"):
        store.set_override("text_1", {"bogus": 1.0})
    assert store.current_version() == 1
    assert store.overrides() == {}


def test_rollback_publishes_a_new_version_with_old_parameters(store: PolicyStore) -> None:
    store.publish_fit({"text_1": _p(0.1)}, None, "good")
    store.publish_fit({"text_1": _p(9.0)}, None, "bad")
    doc = store.rollback(1, hold=True)
    assert doc.version == 3
    assert doc.categories["text_1"].rate == 0.1
    assert "rollback to version 1" in doc.note
    assert store.held()
    store.release_hold()
    assert not store.held()
    with pytest.raises(StoreError, match="not kept"):
        store.rollback(42)


def test_rollback_brings_back_the_overrides_the_version_carried(store: PolicyStore) -> None:
    """The overrides list and the document agree after a rollback: an override the old
    version carried is listed again (at its values then), and can be removed."""
    store.publish_fit({"text_1": _p(0.1), "text_2": _p(0.2)}, None, "fit")
    store.set_override("text_2", {"life_s": 5.0})  # v2
    store.delete_override("text_2")  # v3
    store.set_override("text_1", {"p_reuse": 0.9})  # v4: gone with the rollback
    doc = store.rollback(2)
    assert doc.categories["text_2"].life_s == 5.0 and doc.categories["text_2"].source == "override"
    want = doc.categories["text_2"]
    assert store.overrides() == {
        "text_2": {"rate": want.rate, "p_reuse": want.p_reuse, "life_s": want.life_s}
    }
    assert doc.categories["text_1"].p_reuse == _p(0.1).p_reuse
    after = store.delete_override("text_2").document
    assert after.categories["text_2"].source != "override" and store.overrides() == {}


def test_a_rollback_takes_no_pin_for_the_controllers_selection(store: PolicyStore) -> None:
    """A version that ran a family because an operator pinned it: rolled back to while the
    pin stands, releasing the pin lets the controller's selection apply again. A family
    the controller had selected comes back as its selection."""
    store.publish_fit({"text_1": _p(0.1)}, None, "fit")  # v1, wa
    store.pin_evictor("arc")  # v2
    store.publish_fit({"text_1": _p(0.2)}, None, "fit")  # v3, arc by the pin
    assert store.rollback(3).evictor == "arc"
    assert store.pin_evictor(None).document.evictor == "wa"
    assert store.evictor().selected == "wa"
    store.select_evictor("s3fifo", "selected")  # v6
    store.select_evictor("wa", "selected")  # v7
    assert store.rollback(6).evictor == "s3fifo" and store.evictor().selected == "s3fifo"


Damage = Callable[[redis.Redis, str, bytes], object]
"""Writes a damaged value at a key, given what a store wrote there."""

# A store of max_categories 4 and max_overrides 2 holds 6 categories to a document and
# reads back at most 6 * CATEGORY_BYTES + FRAME_BYTES of one (2 * ... + ... of overrides).
_DOCUMENT_BYTES, _OVERRIDES_BYTES = 6 * 2048 + 16384, 2 * 2048 + 16384


def _as_hash(client: redis.Redis, key: str, _: bytes) -> None:
    client.delete(key)
    client.hset(key, "a", "b")


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (
            # A fit's 4 categories and 2 pinned ones at most: 7 is no document of this store.
            lambda c, key, raw: c.set(
                key,
                encode_policy(
                    decode_policy(raw).model_copy(
                        update={"categories": {f"c{i}": _p(0.1) for i in range(7)}}
                    )
                ),
            ),
            "policy: 7 categories > limit 6",
        ),
        (lambda c, key, raw: c.set(key, b"{damaged"), "policy: document: Invalid JSON"),
        (
            lambda c, key, raw: c.set(key, raw.ljust(40_000)),  # valid JSON, too large
            f"policy: document of 40000 bytes > limit {_DOCUMENT_BYTES} (not read)",
        ),
        (_as_hash, "policy: document: {key} is a hash (not read)"),
    ],
    ids=["too many categories", "not JSON", "too many bytes", "a hash"],
)
def test_a_stored_document_refused_on_reading_back_reads_as_not_stored(
    watched_small: Watched,
    caplog: pytest.LogCaptureFixture,
    damage: Damage,
    reason: str,
) -> None:
    """The store read documents back unbounded (whole, with GET: a value of hundreds of
    MB came back whole; no count checks an agent makes) and a damaged one raised from
    every read and change (the API answered 500 to all of them; a hash in the key too):
    refused within the bounds of a document it publishes (bytes before reading), logged
    once and counted, it reads as not stored, and the next change publishes over it."""
    client, store, counted = watched_small.client, watched_small.store, watched_small.counted
    doc = store.publish_fit({"text_1": _p(0.1)}, None, "fit")
    key = store.keys.policy_doc(doc.version)
    damage(client, key, encode_policy(doc))
    reason = reason.format(key=key)
    for _ in range(2):
        assert store.current() is None and store.get(1) is None
        assert store.versions() == []
    refusals = _said(caplog)
    assert len(refusals) == 1 and refusals[0].startswith(
        f"stored policy v1 refused, read as not stored: {reason}"
    )
    assert (store.refusal(1) or "").startswith(reason)
    assert counted == ["document"]
    with pytest.raises(StoreError, match=f"stored version 1 refused: {re.escape(reason)}"):
        store.rollback(1)
    after = store.set_override("text_2", {"life_s": 5.0}).document
    assert after.version == 2 and store.current() == after


def _base_damages() -> list[tuple[Damage, str]]:
    return [
        (lambda c, key, raw: c.set(key, b"{damaged"), "base: JSONDecodeError: Expecting"),
        (
            lambda c, key, raw: c.set(
                key, Base({f"c{i}": _p(0.1) for i in range(7)}, None).to_json()
            ),
            "base: 7 categories > limit 6",
        ),
        (
            lambda c, key, raw: c.set(key, raw.ljust(40_000)),
            f"base of 40000 bytes > limit {_DOCUMENT_BYTES} (not read)",
        ),
        (
            lambda c, key, raw: c.set(key, b'{"categories": {"a": {"rate": -1}}}'),
            "base: rate: Input should be greater than 0",
        ),
        (
            lambda c, key, raw: c.set(key, b'{"categories": {}, "evictor": "nope"}'),
            "base: StoreError: unknown evictor family 'nope'",
        ),
        (_as_hash, "base: {key} is a hash (not read)"),
    ]


@pytest.mark.parametrize(
    ("damage", "reason"),
    _base_damages(),
    ids=[
        "not JSON",
        "too many categories",
        "too many bytes",
        "out of range",
        "unknown family",
        "a hash",
    ],
)
def test_a_damaged_base_is_read_as_the_document_in_force_holds_it(
    watched_small: Watched,
    caplog: pytest.LogCaptureFixture,
    damage: Damage,
    reason: str,
) -> None:
    """The base was read back whole and unbounded, and a damaged one raised from every
    publication (one corrupted key stopped every refit, override and pin for good):
    refused within the bounds (logged once, counted), it is read as the document in force
    holds it (its fitted categories, default and family), so a change publishes the fleet's
    parameters unchanged, and writes it back."""
    client, store, counted = watched_small.client, watched_small.store, watched_small.counted
    store.publish_fit({"text_1": _p(0.1)}, _p(0.3), "fit")
    in_force = store.set_override("text_2", {"life_s": 5.0}).document
    stored = Base({"text_1": in_force.categories["text_1"]}, in_force.default)
    key = store.keys.policy_base
    damage(client, key, stored.to_json().encode())
    for _ in range(2):
        assert store.base() == stored
    said = _said(caplog)
    assert len(said) == 1 and said[0].startswith(
        f"stored policy base refused: {reason.format(key=key)}"
    ), said
    assert said[0].endswith("read as v2 in force holds it until a change writes it")
    assert counted == ["base"]
    after = store.set_override("text_3", {"life_s": 6.0}).document
    assert after.version == 3 and after.default == in_force.default
    assert {n: p for n, p in after.categories.items() if n != "text_3"} == in_force.categories
    assert Base.from_json(client.get(key)) == stored  # written back: no refusal any more
    assert store.base() == stored and counted == ["base"]


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (
            lambda c, key, raw: c.hset(key, "text_2", "{damaged"),
            r"overrides: 'text_2': not an override of \('rate', 'p_reuse', 'life_s'\)",
        ),
        (
            lambda c, key, raw: c.hset(key, mapping={"a": "{}", "b": "{}"}),
            "overrides: 3 categories > limit 2",
        ),
        (
            lambda c, key, raw: c.hset(key, "text_2", " " * 40_000 + '{"life_s": 5.0}'),
            rf"overrides: \d+ bytes > limit {_OVERRIDES_BYTES} \(not read\)",
        ),
        (
            lambda c, key, raw: c.hset(key, "text_2", '{"p_reuse": 5.0}'),
            "overrides: 'text_2': p_reuse: Input should be less than or equal to 1",
        ),
        (lambda c, key, raw: (c.delete(key), c.set(key, "x")), "overrides: {key} is a string"),
    ],
    ids=["not JSON", "too many", "too many bytes", "out of range", "a string"],
)
def test_damaged_overrides_are_read_as_the_document_in_force_holds_them(
    watched_small: Watched,
    caplog: pytest.LogCaptureFixture,
    damage: Damage,
    reason: str,
) -> None:
    """The overrides were read back whole and unbounded (no count: max_overrides held for
    new pins only), and a damaged one raised from every publication: refused (logged once,
    counted), they are read as the document in force holds them (never silently dropped:
    the pins agents apply now stay), the next publication keeps them and writes them back."""
    client, store, counted = watched_small.client, watched_small.store, watched_small.counted
    store.publish_fit({"text_1": _p(0.1)}, None, "fit")
    pinned = store.set_override("text_2", {"life_s": 5.0}).document.categories["text_2"]
    key = store.keys.overrides
    damage(client, key, b"")
    in_force = {"text_2": {f: getattr(pinned, f) for f in ("rate", "p_reuse", "life_s")}}
    for _ in range(2):
        assert store.overrides() == in_force
    said = _said(caplog)
    assert len(said) == 1, said
    assert re.match(
        f"stored policy overrides refused: {reason.format(key=re.escape(key))}", said[0]
    ), said
    after = store.publish_fit({"text_1": _p(0.2)}, None, "refit")
    assert after.categories["text_2"] == pinned
    assert store.overrides() == in_force and counted == ["overrides"]


def test_history_is_bounded_and_keeps_current(store: PolicyStore) -> None:
    for i in range(12):
        store.publish_fit({"x_1": _p(0.1 + i)}, None, f"v{i + 1}")
    kept = [v.version for v in store.versions()]
    assert kept == [12, 11, 10, 9, 8]
    assert store.get(1) is None
    assert store.current_version() == 12


def test_a_new_store_object_sees_everything(store: PolicyStore, redis_url: str) -> None:
    store.publish_fit({"text_1": _p(0.1)}, None, "fit")
    store.set_override("text_1", {"p_reuse": 0.9})
    again = PolicyStore(redis.Redis.from_url(redis_url), store.keys, history_size=5)
    assert again.current_version() == 2
    assert again.overrides() == {"text_1": {"p_reuse": 0.9}}
    raw = redis.Redis.from_url(redis_url).get(store.keys.policy_doc(2))
    assert raw is not None
    assert decode_policy(raw).categories["text_1"].p_reuse == 0.9


def test_racing_overrides_and_rollbacks_never_lose_an_override(
    redis_url: str, key_prefix: str
) -> None:
    """Issue 14, B4: the document was composed before the WATCH/MULTI loop and reused on a
    retry, so racing PUTs published documents missing overrides."""
    keys = Keys(key_prefix)
    base = PolicyStore(redis.Redis.from_url(redis_url), keys, history_size=500)
    base.publish_fit({"q0": _p(0.5)}, None, "fit")
    start = threading.Barrier(22)
    returned: dict[str, list[float]] = {}
    lock = threading.Lock()

    def put(i: int) -> None:
        s = PolicyStore(redis.Redis.from_url(redis_url), keys, history_size=500)
        start.wait()
        for round_ in range(3):
            life = 10.0 + i + round_ / 10
            doc = s.set_override(f"q{i}", {"life_s": life}).document
            # The document a PUT returns holds its own override.
            assert doc.categories[f"q{i}"].life_s == life
            with lock:
                returned.setdefault(f"q{i}", []).append(life)

    def roll_back() -> None:
        s = PolicyStore(redis.Redis.from_url(redis_url), keys, history_size=500)
        start.wait()
        s.rollback(1)

    with ThreadPoolExecutor(22) as pool:
        done = [pool.submit(put, i) for i in range(20)] + [pool.submit(roll_back) for _ in "ab"]
        for future in done:
            future.result()  # an assertion inside a thread fails the test here
    assert len(returned) == 20
    current = base.current()
    assert current is not None
    overrides = base.overrides()
    # The current document is exactly base + the overrides stored now: none lost.
    for name, values in overrides.items():
        assert current.categories[name].life_s == values["life_s"], name
        assert current.categories[name].source == "override"
    fitted = set(base.base().categories)
    assert set(current.categories) == fitted | set(overrides)


def test_a_fenced_publication_of_a_replica_that_no_longer_leads_writes_nothing(
    store: PolicyStore,
) -> None:
    store.publish_fit({"text_1": _p(0.1)}, None, "first")
    with pytest.raises(LeaseLost, match="no longer leads"):
        store.publish_fit({"text_1": _p(0.2)}, None, "stale", fence=lambda: False)
    with pytest.raises(LeaseLost):
        store.select_evictor("lru", "stale", fence=lambda: False)
    assert store.current_version() == 1 and store.base().categories["text_1"].rate == 0.1
    assert store.publish_fit({"text_1": _p(0.3)}, None, "led", fence=lambda: True).version == 2


def test_refused_overrides_beside_an_unreadable_document_in_force_read_as_none(
    redis_url: str, key_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """With nothing readable to take the pins from, refused overrides read as none (a
    publication must go on) and the log says the pins are lost, so an operator sets them
    again."""
    client = redis.Redis.from_url(redis_url)
    store = PolicyStore(client, Keys(key_prefix), max_categories=4, max_overrides=2)
    store.publish_fit({"text_1": _p(0.1)}, None, "fit")
    store.set_override("text_2", {"life_s": 5.0})
    client.hset(store.keys.overrides, "text_2", "{damaged")
    client.set(store.keys.policy_doc(2), b"{damaged")
    assert store.overrides() == {}
    said = _said(caplog, "overrides refused")
    assert len(said) == 1 and said[0].endswith(
        "no readable document in force: read as empty (pins lost: set them again)"
    ), said
    after = store.publish_fit({"text_1": _p(0.2)}, None, "refit")
    assert after.version == 3 and set(after.categories) == {"text_1"}
    assert client.hgetall(store.keys.overrides) == {}


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda c, key: c.set(key, "nope"), "pin: unknown evictor family 'nope'"),
        (lambda c, key: c.set(key, "lru" * 30), "pin of 90 bytes > limit 64 (not read)"),
        (lambda c, key: (c.delete(key), c.hset(key, "a", "b")), "pin: {key} is a hash"),
    ],
    ids=["unknown family", "too many bytes", "a hash"],
)
@pytest.mark.parametrize("pinned", ["lru", None])
def test_a_damaged_pin_is_read_as_the_family_in_force(
    watched: Watched,
    caplog: pytest.LogCaptureFixture,
    damage: Callable[[redis.Redis, str], object],
    reason: str,
    pinned: str | None,
) -> None:
    """A pinned family that named no family raised ``StoreError`` from every publication
    and read (one damaged key stopped every refit for good): refused (logged once,
    counted), it reads as the family in force, pinned only where the controller's
    selection is another, and the next publication writes it back."""
    client, store, counted = watched.client, watched.store, watched.counted
    store.publish_fit({"text_1": _p(0.1)}, None, "fit")
    store.select_evictor("s3fifo", "selected")
    if pinned is not None:
        store.pin_evictor(pinned)
    key = store.keys.evictor_pin
    damage(client, key)
    for _ in range(2):
        assert store.evictor().pinned == pinned
    said = _said(caplog)
    assert len(said) == 1 and said[0].startswith(
        f"stored policy pin refused: {reason.format(key=key)}"
    ), said
    after = store.set_override("text_2", {"life_s": 5.0}).document
    assert after.evictor == (pinned or "s3fifo") and counted == ["pin"]
    assert client.get(key) == (None if pinned is None else pinned.encode())


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda c, key: c.set(key, "v2"), "current is not a version number: b'v2'"),
        (lambda c, key: c.set(key, "0"), "current is not a version number: b'0'"),
        (lambda c, key: c.set(key, "9" * 40), "current of 40 bytes > limit 32 (not read)"),
        (lambda c, key: (c.delete(key), c.rpush(key, "2")), "current: {key} is a list (not read)"),
    ],
    ids=["not a number", "zero", "too many bytes", "a list"],
)
def test_a_damaged_current_pointer_reads_as_the_newest_readable_version(
    watched: Watched,
    caplog: pytest.LogCaptureFixture,
    damage: Callable[[redis.Redis, str], object],
    reason: str,
) -> None:
    """A ``current`` pointer naming no version raised ``ValueError`` from every read and
    publication (one damaged key stopped every refit and change for good): refused (logged
    once, counted), it reads as the newest readable kept version, and the next publication
    writes it back."""
    client, store, counted = watched.client, watched.store, watched.counted
    store.publish_fit({"text_1": _p(0.1)}, None, "fit")
    store.set_override("text_1", {"life_s": 5.0})
    store.publish_fit({"text_1": _p(0.2)}, None, "refit")
    client.set(store.keys.policy_doc(3), "damaged")  # the newest is unreadable
    key = store.keys.policy_current
    damage(client, key)
    for _ in range(2):
        assert store.current_version() == 2
        state = store.state()
        assert state is not None and state.version == 2
        assert store.overrides() == {"text_1": {"life_s": 5.0}}
    said = _said(caplog, "current refused")
    assert said == [
        f"stored policy current refused: {reason.format(key=key)}; read as v2, the newest "
        "readable kept version until a publication"
    ]
    assert counted == ["document", "current"]
    after = store.set_override("text_2", {"rate": 1.0}).document
    assert after.version == 4 and client.get(key) == b"4"
    assert store.current_version() == 4 and counted == ["document", "current"]


def test_a_damaged_current_pointer_with_no_readable_version_is_restored(
    redis_url: str, key_prefix: str
) -> None:
    """With no kept version readable, a damaged pointer reads as none in force: a restore
    (of what a replica remembers) publishes over it instead of finding one in force."""
    client = redis.Redis.from_url(redis_url)
    store = PolicyStore(client, Keys(key_prefix), memory=PolicyMemory(restore_wait_s=0))
    store.publish_fit({"text_1": _p(0.1)}, None, "fit")
    store.set_override("text_1", {"life_s": 5.0})
    known = store.state()
    assert known is not None
    for version in (1, 2):
        client.set(store.keys.policy_doc(version), "damaged")
    client.set(store.keys.policy_current, "nope")
    assert store.current_version() is None and store.state() is None
    with pytest.raises(PolicyLost):
        store.set_override("text_2", {"rate": 1.0})
    restored = store.restore(known, after=2)
    assert restored is not None and restored.version == 3
    assert client.get(store.keys.policy_current) == b"3"
    assert store.overrides() == {"text_1": {"life_s": 5.0}}


@pytest.mark.parametrize("rule", ["tree", "off"])
def test_each_document_carries_the_controllers_supersede_rule(
    redis_url: str, key_prefix: str, rule: SupersedeRule
) -> None:
    store = PolicyStore(redis.Redis.from_url(redis_url), Keys(key_prefix), supersede=rule)
    store.publish_fit({"text_1": _p(0.1)}, None, "fit")
    store.set_override("text_1", {"p_reuse": 0.9})
    store.rollback(1)
    raw = [redis.Redis.from_url(redis_url).get(store.keys.policy_doc(v)) for v in (1, 2, 3)]
    assert [decode_policy(r).supersede for r in raw if r is not None] == [rule] * 3

"""Policy store against a real Redis: immutable, strictly increasing versions, overrides,
rollback, bounded history, and nothing lost when the store object is recreated."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis

from agent.policy_document import CategoryParams, PolicyDocument
from agent.wire import Keys, decode_policy, encode_policy
from controlplane.service.store import LeaseLost, PolicyStore, StoreError

pytestmark = pytest.mark.integration


def _p(rate: float, p: float = 0.5, life: float = 10.0) -> CategoryParams:
    return CategoryParams(rate=rate, p_reuse=p, life_s=life, samples=1000, source="fit")


@pytest.fixture
def store(redis_url: str, key_prefix: str) -> PolicyStore:
    return PolicyStore(redis.Redis.from_url(redis_url), Keys(key_prefix), history_size=5)


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
    doc = store.delete_override("text_1")
    assert doc.categories["text_1"].life_s == 20.0
    assert doc.version == 4
    with pytest.raises(StoreError, match="no override"):
        store.delete_override("text_1")


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
    after = store.delete_override("text_2")
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


@pytest.mark.parametrize(
    ("stored", "reason"),
    [
        (
            # A fit's 4 categories and 2 pinned ones at most: 7 is no document of this store.
            lambda doc: encode_policy(
                doc.model_copy(update={"categories": {f"c{i}": _p(0.1) for i in range(7)}})
            ),
            "policy: 7 categories > limit 6",
        ),
        (lambda doc: b"{damaged", "policy: document: Invalid JSON"),
    ],
    ids=["too many categories", "not JSON"],
)
def test_a_stored_document_refused_on_reading_back_reads_as_not_stored(
    redis_url: str,
    key_prefix: str,
    caplog: pytest.LogCaptureFixture,
    stored: Callable[[PolicyDocument], bytes],
    reason: str,
) -> None:
    """The store read documents back unbounded (the count checks an agent makes did not
    apply) and a damaged one raised ``WireError`` from every read and change (the API
    answered 500 to all of them): refused within the bounds of a document it publishes,
    logged once, it reads as not stored, and the next change publishes over it."""
    client = redis.Redis.from_url(redis_url)
    store = PolicyStore(client, Keys(key_prefix), max_categories=4, max_overrides=2)
    doc = store.publish_fit({"text_1": _p(0.1)}, None, "fit")
    client.set(store.keys.policy_doc(doc.version), stored(doc))
    for _ in range(2):
        assert store.current() is None and store.get(1) is None
        assert store.versions() == []
    refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(refusals) == 1 and refusals[0].startswith(
        f"stored policy v1 refused, read as not stored: {reason}"
    )
    with pytest.raises(StoreError, match=f"version 1 is refused: {reason}"):
        store.rollback(1)
    after = store.set_override("text_2", {"life_s": 5.0}).document
    assert after.version == 2 and store.current() == after


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

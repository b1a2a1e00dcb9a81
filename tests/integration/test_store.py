"""Policy store against a real Redis: immutable, strictly increasing versions, overrides,
rollback, bounded history, and nothing lost when the store object is recreated."""

from __future__ import annotations

import threading

import pytest
import redis

from agent.policy_document import CategoryParams
from agent.wire import Keys, decode_policy
from controlplane.service.store import PolicyStore, StoreError

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
    doc = store.set_override("text_1", {"life_s": 99.0})
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

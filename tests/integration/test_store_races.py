"""Races of the policy store and the replica's memory of it, against a real Redis: a fit
racing a held rollback, numbers after Redis lost its state, a change made while the
leader waits to restore it, and a publication told to the memory late."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis

from agent.policy_document import CategoryParams
from agent.wire import Keys
from controlplane.service.agents import AgentView
from controlplane.service.policy_memory import PolicyMemory
from controlplane.service.store import PolicyStore
from controlplane.service.store_terms import PolicyLost, RefitsHeld, Remembers, StoreState
from tests.conftest import delete_prefix

pytestmark = pytest.mark.integration


def _p(rate: float) -> CategoryParams:
    return CategoryParams(rate=rate, p_reuse=0.5, life_s=10.0, samples=1000, source="fit")


def _store(redis_url: str, key_prefix: str, memory: Remembers | None = None) -> PolicyStore:
    return PolicyStore(redis.Redis.from_url(redis_url), Keys(key_prefix), memory=memory)


def test_a_fit_racing_a_held_rollback_does_not_publish_over_it(
    redis_url: str, key_prefix: str
) -> None:
    """The leader's refit found refits not held; an operator's rollback with ``hold`` lands
    before its transaction (here: inside its WATCH window, when the fence is asked). The
    transaction retries, reads the hold, and publishes the automatic fit anyway: the
    rollback is gone from ``current`` while the store says refits are held."""
    leader = _store(redis_url, key_prefix)
    operator = _store(redis_url, key_prefix)
    leader.publish_fit({"text_1": _p(0.1)}, None, "good fit")
    leader.publish_fit({"text_1": _p(0.9)}, None, "bad fit")
    assert not leader.held()  # what the refit checks before it publishes
    rolled_back: list[int] = []

    def fence() -> bool:
        if not rolled_back:
            rolled_back.append(operator.rollback(1, hold=True).version)
        return True

    with pytest.raises(RefitsHeld):
        leader.publish_fit(
            {"text_1": _p(5.0)}, None, "automatic refit", fence=fence, unless_held=True
        )
    assert leader.held()
    current = leader.current()
    assert current is not None
    assert current.version == rolled_back[0]
    assert current.categories["text_1"].rate == 0.1


def test_defaults_after_a_loss_are_numbered_after_the_versions_workers_hold(
    redis_url: str, key_prefix: str
) -> None:
    """A controller and Redis restarted together (nothing remembered, nothing stored) while
    workers hold v7: the leader's first tick publishes the defaults as v1. Workers follow
    ``current`` down to v1, and v2..v7 will each name a second document."""
    store = _store(redis_url, key_prefix)
    memory = PolicyMemory(restore_wait_s=0)
    worker = AgentView(id="w1", engine="sim", capacity=8, applied_version=7, staged_version=7)
    memory.ensure(store, lambda: [worker])
    version = store.current_version()
    assert version is not None
    assert version > 7


def test_a_fit_published_during_the_restore_wait_keeps_the_numbers_and_the_overrides(
    redis_url: str, key_prefix: str
) -> None:
    """Redis lost the policy (restarted empty) after v3 (an override on text_1). The leader
    waits ``restore_wait_s`` for heartbeats; a refit published meanwhile becomes v1 (a number
    workers applied for another document), its document lacks the override, and the restore
    is then skipped: a version is in force."""
    memory = PolicyMemory(restore_wait_s=60)
    store = _store(redis_url, key_prefix, memory)
    store.publish_fit({"text_1": _p(0.1)}, None, "fit")
    store.publish_fit({"text_1": _p(0.2)}, None, "fit")
    store.set_override("text_1", {"rate": 0.5})
    assert memory.highest_version == 3
    delete_prefix(redis_url, key_prefix)  # Redis restarted empty
    memory.ensure(store, lambda: [])  # the wait starts
    with pytest.raises(PolicyLost):
        store.publish_fit({"text_1": _p(0.3)}, None, "refit during the wait")
    with pytest.raises(PolicyLost):
        store.pin_evictor("lru")
    memory.restore_wait_s = 0
    memory.ensure(store, lambda: [])
    current = store.current()
    assert current is not None
    assert current.version == 4
    assert current.categories["text_1"].rate == 0.5
    assert store.overrides() == {"text_1": {"rate": 0.5}}


def test_a_late_told_publication_does_not_replace_a_newer_remembered_state(
    redis_url: str, key_prefix: str
) -> None:
    """Two publications of one replica on two threads: the refit's EXEC (v2), then an
    operator's override (v3) is published and remembered, then the refit's callback tells
    the memory v2's state. Redis restarts empty before the next lease tick: the restore
    publishes v2's state; the override is lost."""
    memory = PolicyMemory(restore_wait_s=0)
    operator = _store(redis_url, key_prefix, memory)
    overridden: list[int] = []

    def operator_publishes_first(state: StoreState) -> None:
        if state.version == 2:  # the refit's news comes after the operator's publication
            overridden.append(operator.set_override("text_1", {"rate": 0.5}).document.version)

    refit = _store(redis_url, key_prefix, _ToldLate(memory, operator_publishes_first))
    refit.publish_fit({"text_1": _p(0.1)}, None, "fit")
    refit.publish_fit({"text_1": _p(0.2)}, None, "refit")
    assert overridden == [3]
    delete_prefix(redis_url, key_prefix)  # Redis restarted empty before the next tick
    memory.ensure(operator, lambda: [])
    restored = operator.current()
    assert restored is not None
    assert restored.version == 4
    assert restored.categories["text_1"].rate == 0.5


class _ToldLate:
    """``memory`` as a store sees it, whose news of a publication first lets ``before`` run
    (another thread's publication, told first)."""

    def __init__(self, memory: PolicyMemory, before: Callable[[StoreState], None]) -> None:
        self.memory, self.before = memory, before

    @property
    def state(self) -> StoreState | None:
        return self.memory.state

    @property
    def highest_version(self) -> int:
        return self.memory.highest_version

    def remember(self, state: StoreState) -> None:
        self.before(state)
        self.memory.remember(state)

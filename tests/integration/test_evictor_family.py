"""The evictor family against a real Redis: the store composes it (selection, operator
pin, rollback), agents that follow the document switch on hot reload with every cached
block kept, and baseline-configured agents stay as they are."""

from __future__ import annotations

import copy
import time

import pytest
import redis

from agent.integrations.block_queue import KvwiseFreeQueue
from agent.integrations.engine_agent import EngineAgent
from agent.policies import EvictionPolicy, create
from agent.policies.lru import LRUPolicy
from agent.policies.wa import WAPolicy
from agent.policy_document import CategoryParams, PolicyDocument
from agent.runtime.agent import Agent
from agent.wire import Keys, encode_policy
from controlplane.service.agents import AgentView
from controlplane.service.controller import Controller
from controlplane.service.settings import ControllerSettings
from controlplane.service.store import PolicyStore, StoreError
from tests.agent_stream import agent_batches
from tests.integration.agent_fixtures import fast_settings
from tests.shadow_samples import KEEPS_OLDEST, QUICK_SELECTION, selection_trace
from tests.vllm_block import Blk
from tests.waiting import wait_until

pytestmark = pytest.mark.integration


def _p(rate: float) -> CategoryParams:
    return CategoryParams(rate=rate, p_reuse=0.5, life_s=10.0, samples=1000, source="fit")


@pytest.fixture
def store(redis_url: str, key_prefix: str) -> PolicyStore:
    return PolicyStore(redis.Redis.from_url(redis_url), Keys(key_prefix), history_size=10)


def test_the_family_is_selected_pinned_released_and_kept_by_refits(store: PolicyStore) -> None:
    first = store.publish_fit({"text_1": _p(0.1)}, None, "fit")
    assert first.evictor == "wa"
    assert b"evictor" not in encode_policy(first)  # older agents read wa documents as before
    assert store.select_evictor("s3fifo", "selected").evictor == "s3fifo"
    assert store.publish_fit({"text_1": _p(0.2)}, None, "refit").evictor == "s3fifo"
    pinned = store.pin_evictor("lru")
    assert (pinned.document.evictor, pinned.published) == ("lru", True)
    again = store.pin_evictor("lru")  # the same pin: no version
    assert (again.document.version, again.published) == (pinned.document.version, False)
    assert store.select_evictor("arc", "selected again").evictor == "lru"  # the pin wins
    state = store.evictor()
    assert (state.in_force, state.pinned, state.selected) == ("lru", "lru", "arc")
    released = store.pin_evictor(None)
    assert (released.document.evictor, released.published) == ("arc", True)
    nothing = store.pin_evictor(None)  # no pin left: no version
    assert (nothing.document.version, nothing.published) == (released.document.version, False)
    rolled = store.rollback(first.version)
    assert rolled.evictor == "wa"
    assert store.evictor().selected == "wa"
    with pytest.raises(StoreError, match="unknown evictor family 'mru'; known: wa, lru"):
        store.pin_evictor("mru")


def _fill(agent: Agent, requests: int) -> None:
    now = time.time()
    for r in range(requests):
        blocks = [r * 10 + j for j in range(5)]
        agent.free(blocks[::-1], range(4, -1, -1), now + r, f"text_{r % 2}")
    agent.touch([0, 1], now + requests, "text_0")


def wa_evictor_of(configured: str) -> type[WAPolicy]:
    """The ``wa`` evictor an agent configured with ``configured`` runs."""
    evictor: type[WAPolicy] = WAPolicy
    if configured == "device":
        evictor = pytest.importorskip("agent.device_evictor").DeviceEvictor
    return evictor


@pytest.mark.parametrize("configured", ["wa", "device"])
def test_a_following_agent_switches_family_on_hot_reload_and_back(
    store: PolicyStore, redis_url: str, key_prefix: str, configured: str
) -> None:
    """An agent configured with ``device`` came back from ``lru`` to the CPU ``wa``."""
    wa_evictor = wa_evictor_of(configured)
    settings = fast_settings(redis_url, key_prefix, worker_id="w-follow", evictor=configured)
    with Agent(settings, capacity=100) as agent:
        _fill(agent, 12)
        held = len(agent.policy)
        assert type(agent.policy) is wa_evictor
        expected = copy.deepcopy(agent.policy).evict(held)
        store.pin_evictor("lru")
        wait_until(agent.apply_pending, timeout=10)
        assert agent.family == "lru" and isinstance(agent.policy, LRUPolicy)
        assert len(agent.policy) == held
        assert agent.status().evictor == "lru"
        store.pin_evictor("wa")
        wait_until(agent.apply_pending, timeout=10)
        assert agent.family == "wa" and type(agent.policy) is wa_evictor
        assert len(agent.policy) == held
        # Every block that was evictable comes out in the order it had before the two
        # switches; the two in use stay.
        assert agent.evict(held, time.time()) == expected
        assert sorted(expected) == sorted(
            {r * 10 + j for r in range(12) for j in range(5)} - {0, 1}
        )


class RefusesDocuments(WAPolicy):
    """A ``wa`` evictor that takes no document (parameters its build cannot use)."""

    def set_policy(self, doc: PolicyDocument) -> None:
        raise ValueError(f"no parameters of v{doc.version} fit this evictor")


def test_an_engine_switch_whose_new_evictor_refuses_the_document_keeps_the_old_one(
    store: PolicyStore, redis_url: str, key_prefix: str
) -> None:
    """The vLLM queue had installed the new family's evictor, every block moved into it,
    when that evictor refused the document: the agent was left half-switched (``wa`` in
    force and reported, on no document of its own, the version in force still the
    ``lru`` one), and then moved every block back to a fresh ``lru``. The engine's own
    call takes the refusal: nothing raises, no block moves (the new evictor refuses the
    document before it is installed), the ``lru`` evictor keeps every block in its order,
    and the rejection is counted and reported."""
    n = 12
    settings = fast_settings(redis_url, key_prefix, worker_id="w-engine", evictor="wa")
    evictor = create("wa", n)
    engine = EngineAgent(settings, evictor, capacity=n, engine="vllm", infer=False)
    ticks = iter(range(1 << 30))
    blocks = [Blk(i) for i in range(n)]
    queue = KvwiseFreeQueue(blocks, evictor, hooks=engine, clock=lambda: float(next(ticks)))

    def build(family: str) -> EvictionPolicy:
        return RefusesDocuments(n) if family == "wa" else create(family, n)

    engine.order.enable_switch(build, queue.switch_evictor)
    agent = engine.agent
    with agent:
        got = queue.popleft_n(n)
        for block in got[:8]:
            block.block_hash = block.block_id.to_bytes(32, "big") + bytes(4)
        queue.note_stored(got[:8], 0, 0)
        queue.append_n(got[7::-1])
        lru = store.pin_evictor("lru").document
        wait_until(lambda: agent.subscriber.staged_version == lru.version, timeout=10)
        assert queue.popleft_n(1) == [got[7]]  # the engine's call applies it
        assert agent.family == "lru" and type(queue.evictor) is LRUPolicy
        in_force = queue.evictor
        expected = copy.deepcopy(in_force).evict(len(in_force))
        wa = store.pin_evictor("wa").document
        wait_until(lambda: agent.subscriber.staged_version == wa.version, timeout=10)
        assert [b.block_id for b in queue.popleft_n(2)] == expected[:2]
        assert agent.subscriber.staged_version == lru.version
        assert agent.family == "lru" and type(queue.evictor) is LRUPolicy
        # No handover either way: the evictor in force never gave its blocks up (one
        # moved there and back would be a fresh one).
        assert queue.evictor is in_force and engine.order.evictor is in_force
        status = agent.status()
        assert (status.evictor, status.applied_version, status.rejected) == ("lru", lru.version, 1)
        assert status.last_rejection == (
            f"v{wa.version}: evictor refused it: no parameters of v{wa.version} fit this evictor"
        )
        assert [b.block_id for b in queue.popleft_n(len(expected) - 2)] == expected[2:]


def test_an_agent_configured_with_a_baseline_keeps_it(
    store: PolicyStore, redis_url: str, key_prefix: str
) -> None:
    settings = fast_settings(redis_url, key_prefix, worker_id="w-control", evictor="lru")
    with Agent(settings, capacity=100) as agent:
        assert not agent.follows_family
        store.pin_evictor("s3fifo")
        wait_until(agent.apply_pending, timeout=10)
        assert agent.family == "lru" and isinstance(agent.policy, LRUPolicy)
        assert agent.applied_version == store.current_version()


def test_the_controller_publishes_the_family_its_shadow_selects(
    redis_url: str, key_prefix: str
) -> None:
    quick = QUICK_SELECTION.model_dump(exclude_unset=True)
    # Only the leader publishes its selection; the lease outlives the replay below, which
    # takes more than the default 10 s on a loaded machine (and never renews it).
    settings = ControllerSettings(
        redis_url=redis_url, key_prefix=key_prefix, select_windows=2, lease_ttl_s=600, **quick
    )
    controller = Controller(settings)
    assert controller.lease.tick()
    controller.store.publish_fit({}, KEEPS_OLDEST, "bad")
    controller.shadow.refresh([_view("w1", 300)], controller.store.current())
    chosen = []
    for batch in agent_batches(selection_trace(), 300, batch_events=500):
        controller.shadow.apply(batch)
        verdict = controller.select_family()
        if verdict is not None and verdict.switches:
            chosen.append(verdict.chosen)
    assert chosen, "a baseline beats a wa document that keeps the oldest blocks"
    doc = controller.store.current()
    assert doc is not None and doc.evictor == chosen[-1] != "wa"
    assert doc.note.startswith(f"evictor family: switch to {chosen[-1]}")
    assert controller.store.evictor().selected == chosen[-1]
    shown = controller.shadow_view().selection
    assert shown is not None and shown.window_end > 0
    counted = controller.metrics.registry.get_sample_value(
        "kvwise_evictor_family_selected_total", {"family": chosen[0]}
    )
    assert counted is not None and counted >= 1


def _view(worker: str, capacity: int) -> AgentView:
    return AgentView(id=worker, engine="sim", capacity=capacity, whole_requests=True)

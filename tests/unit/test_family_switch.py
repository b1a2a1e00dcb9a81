"""A family switch (agent.policies.handover): no block lost, the victim order kept."""

from __future__ import annotations

import copy
import random

import pytest

from agent.integrations.block_queue import KvwiseFreeQueue
from agent.integrations.engine_agent import EngineOrder
from agent.policies import EvictionPolicy, create
from agent.policies.handover import (
    Adopts,
    Handover,
    HandsOver,
    NamesCategories,
    ReloadsPolicy,
    SwitchRefused,
    hand_over,
)
from agent.policies.lru import LRUPolicy
from agent.policies.wa import WAPolicy
from agent.policy_document import EVICTOR_FAMILIES, PolicyDocument
from tests.vllm_block import Blk

FAMILIES = list(EVICTOR_FAMILIES)
CAPACITY = 60


def _warm(policy: EvictionPolicy, seed: int) -> tuple[list[int], float]:
    """Replay a small random workload through ``policy`` (capacity ``CAPACITY``); the last
    request keeps its hits in use. Returns the blocks in use and the clock."""
    rng = random.Random(seed)
    cached: set[int] = set()
    now = 0.0
    for i in range(300):
        now += rng.random()
        root = rng.randrange(12) * 100
        blocks = [root + j for j in range(rng.randrange(1, 9))]
        policy.touch([b for b in blocks if b in cached], now)
        policy.free(blocks[::-1], list(range(len(blocks)))[::-1], now, i % 3)
        cached.update(blocks)
        excess = len(policy) - CAPACITY
        if excess > 0:
            cached.difference_update(policy.evict(excess))
    in_use = rng.sample(sorted(cached), 4)
    policy.touch(in_use, now + 1)
    return in_use, now + 1


def _victim_order(policy: EvictionPolicy) -> list[int]:
    """The order ``policy`` would evict everything evictable, without touching it."""
    twin = copy.deepcopy(policy)
    return twin.evict(len(twin))


@pytest.mark.parametrize("old_name", FAMILIES)
def test_every_family_declares_both_abilities(old_name: str) -> None:
    policy = create(old_name, CAPACITY)
    assert isinstance(policy, HandsOver)
    assert isinstance(policy, Adopts)
    assert isinstance(policy, ReloadsPolicy) == (old_name == "wa")
    assert isinstance(policy, NamesCategories) == (old_name == "wa")


@pytest.mark.parametrize("new_name", FAMILIES)
@pytest.mark.parametrize("old_name", FAMILIES)
def test_a_switch_keeps_every_block_and_the_victim_order(old_name: str, new_name: str) -> None:
    old = create(old_name, CAPACITY)
    in_use, now = _warm(old, seed=len(old_name) * 31 + len(new_name))
    expected = _victim_order(old)
    held = len(old)
    new = create(new_name, CAPACITY)
    hand_over(old, new, now)
    assert len(old) == 0
    assert len(new) == held
    assert all(b in new for b in expected + in_use)
    # The in-use blocks are still in use: no eviction returns them before they are freed.
    victims = new.evict(held)
    assert victims == expected
    assert not set(victims) & set(in_use)
    new.free(in_use[::-1], list(range(len(in_use)))[::-1], now + 1, 0)
    assert sorted(new.evict(held)) == sorted(in_use)


@pytest.mark.parametrize("baseline", [f for f in FAMILIES if f != "wa"])
def test_a_switch_there_and_back_keeps_the_order(baseline: str) -> None:
    wa = create("wa", CAPACITY)
    in_use, now = _warm(wa, seed=7)
    expected = _victim_order(wa)
    there = create(baseline, CAPACITY)
    hand_over(wa, there, now)
    back = create("wa", CAPACITY)
    hand_over(there, back, now + 1)
    assert len(back) == len(expected) + len(set(in_use))
    assert back.evict(len(back)) == expected
    # The cache goes on working after the round trip: a hit, a free, an eviction.
    back.touch([in_use[0]], now + 2)
    back.free(in_use[::-1], list(range(len(in_use)))[::-1], now + 2, 1)
    assert sorted(back.evict(len(back))) == sorted(set(in_use))


def test_a_switch_into_a_policy_holding_blocks_is_refused() -> None:
    old, new = create("lru", 4), create("s3fifo", 4)
    old.free([1, 2], [1, 0], 0.0, 0)
    new.free([3], [0], 0.0, 0)
    with pytest.raises(SwitchRefused, match="already holds 1 blocks"):
        hand_over(old, new, 1.0)
    assert len(old) == 2


class FailsToAdopt(LRUPolicy):
    """Fails half-way through an adoption (it has taken a few blocks by then)."""

    def adopt(self, handover: Handover, now: float) -> None:
        super().adopt(Handover(handover.evictable[:3], handover.in_use[:1]), now)
        raise SwitchRefused("out of room")


@pytest.mark.parametrize("old_name", FAMILIES)
def test_a_failed_adoption_leaves_every_block_with_the_old_policy_in_victim_order(
    old_name: str,
) -> None:
    """The old policy had given up its blocks when the new one failed to take them: a
    switch that raised there lost every cached block."""
    old = create(old_name, CAPACITY)
    in_use, now = _warm(old, seed=len(old_name) * 17)
    expected = _victim_order(old)
    held = len(old)
    with pytest.raises(SwitchRefused, match="out of room"):
        hand_over(old, FailsToAdopt(), now)
    assert len(old) == held
    assert all(b in old for b in expected + in_use)
    assert old.evict(held) == expected
    old.free(in_use[::-1], list(range(len(in_use)))[::-1], now + 1, 0)
    assert sorted(old.evict(held)) == sorted(in_use)


def test_the_vllm_queue_switches_evictor_with_its_free_blocks_in_victim_order() -> None:
    blocks = [Blk(i) for i in range(9)]
    ticks = iter(range(1 << 30))
    queue = KvwiseFreeQueue(blocks, create("wa", 9), clock=lambda: float(next(ticks)))
    got = queue.popleft_n(9)
    for block in got[1:]:
        block.block_hash = block.block_id.to_bytes(32, "big") + bytes(4)
    queue.note_stored(got[1:5], 0, 0)
    queue.note_stored(got[5:], 0, 0)
    queue.append_n(got[4:0:-1])
    queue.append_n(got[8:4:-1])
    queue.remove(got[6])  # a hit, staged: it reaches the old evictor before the switch
    expected = _victim_order(queue.evictor)
    expected.remove(6)
    queue.switch_evictor(create("s3fifo", 9))
    assert type(queue.evictor).__name__ == "S3FIFOPolicy"
    assert queue.num_free_blocks == 7
    assert [b.block_id for b in queue.popleft_n(7)] == expected
    queue.append_n([got[6]])  # the request that hit it finishes
    assert [b.block_id for b in queue.popleft_n(1)] == [6]


def test_an_engine_order_switches_only_when_its_engine_lets_it() -> None:
    order = EngineOrder(create("wa", 4))
    assert order.add_category("chat") == 0 and order.add_category("docs") == 1
    to_lru, to_wa = PolicyDocument(version=1, evictor="lru"), PolicyDocument(version=2)
    with pytest.raises(SwitchRefused, match="cannot switch evictor family"):
        order.switch_family(to_lru)
    installed: list[EvictionPolicy] = []
    order.enable_switch(lambda family: create(family, 4), installed.append)
    order.switch_family(to_lru)
    order.switch_family(to_wa)
    assert [type(p).__name__ for p in installed] == ["LRUPolicy", "WAPolicy"]
    assert order.evictor is installed[-1]
    assert isinstance(installed[-1], WAPolicy) and installed[-1].policy is to_wa
    assert installed[-1].add_category("docs") == 1  # codes kept for the side table


class RefusesDocuments(WAPolicy):
    """A ``wa`` evictor that takes no document."""

    def set_policy(self, doc: PolicyDocument) -> None:
        raise ValueError(f"no parameters of v{doc.version} fit this evictor")


def test_an_engine_order_whose_new_evictor_refuses_the_document_moves_no_block() -> None:
    """The order installed the new evictor (every block of the vLLM queue moved into it)
    before the document reached it, so a refusal moved them all there and back. The new
    evictor now takes the document first: the refusal comes before anything moved."""
    blocks = [Blk(i) for i in range(6)]
    ticks = iter(range(1 << 30))
    lru = create("lru", 6)
    queue = KvwiseFreeQueue(blocks, lru, clock=lambda: float(next(ticks)))
    got = queue.popleft_n(6)
    for block in got:
        block.block_hash = block.block_id.to_bytes(32, "big") + bytes(4)
    queue.note_stored(got, 0, 0)
    queue.append_n(got[::-1])
    expected = _victim_order(lru)
    order = EngineOrder(lru)
    installed: list[EvictionPolicy] = []

    def install(new: EvictionPolicy) -> None:
        installed.append(new)
        queue.switch_evictor(new)

    order.enable_switch(lambda family: RefusesDocuments(6), install)
    with pytest.raises(ValueError, match="no parameters of v3"):
        order.switch_family(PolicyDocument(version=3))
    assert installed == []
    assert queue.evictor is lru and order.evictor is lru
    assert [b.block_id for b in queue.popleft_n(6)] == expected


def test_the_device_evictor_hands_over_to_a_cpu_baseline_and_back() -> None:
    pytest.importorskip("torch")
    from agent.device_evictor import DeviceEvictor

    device = DeviceEvictor.simulated(CAPACITY)
    in_use, now = _warm(device, seed=11)
    expected = _victim_order(device)
    baseline = create("arc", CAPACITY)
    hand_over(device, baseline, now)
    back = DeviceEvictor.simulated(CAPACITY)
    hand_over(baseline, back, now + 1)
    assert len(back) == len(expected) + len(in_use)
    assert back.evict(len(back)) == expected

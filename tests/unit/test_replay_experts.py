"""Kept experts (``auto``'s kept-families switch) and ``wa-regret``'s regret mix."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest

from agent.policies.fifo import FIFOPolicy
from agent.policies.lfu import LFUPolicy
from agent.policies.lru import LRUPolicy
from controlplane.replay import catalog
from controlplane.replay.engine import replay_hits
from controlplane.replay.experts import (
    FORGET_AT,
    LEARNING_RATE,
    KeptExperts,
    RegretMix,
    regret_wa,
)
from controlplane.replay.online import FittedReplayPolicy
from controlplane.replay.options import ReplayOptions
from controlplane.shadow.auto_replay import AutoReplayPolicy
from controlplane.traces.model import Trace
from controlplane.traces.synth import synthesize
from tests.unit.test_replay_auto import EAGER


class _Cache:
    """A cache of ``capacity`` blocks over ``policy``: one block per request, a hit when
    it is cached; released at once, evicted down to capacity."""

    def __init__(self, policy: object, capacity: int) -> None:
        self.policy = policy
        self.capacity = capacity
        self.hits = 0

    def access(self, block: int, now: float) -> None:
        policy = self.policy
        assert isinstance(policy, LRUPolicy | LFUPolicy | FIFOPolicy | KeptExperts)
        if block in policy:
            self.hits += 1
            policy.touch([block], now)
        policy.free([block], [0], now, 0)
        over = len(policy) - self.capacity
        if over > 0:
            policy.evict(over)


def _hot_and_scans(n: int, seed: int) -> list[int]:
    """A hot set of 20 blocks read every other access, between one-time scan blocks: a
    frequency policy keeps the hot set, recency lets the scans push it out."""
    draw = random.Random(seed)
    scan = 1000
    out = []
    for i in range(n):
        if i % 2:
            out.append(draw.randrange(20))
        else:
            out.append(scan)
            scan += 1
    return out


def _replay(policy: object, capacity: int, accesses: list[int]) -> int:
    cache = _Cache(policy, capacity)
    for t, block in enumerate(accesses):
        cache.access(block, float(t))
    return cache.hits


def test_kept_experts_evict_as_the_chosen_expert_alone() -> None:
    draw = random.Random(1)
    accesses = [draw.randrange(300) for _ in range(5000)]
    alone = LRUPolicy()
    kept = KeptExperts([LRUPolicy(), LFUPolicy(), FIFOPolicy()])
    solo, mixed = _Cache(alone, 50), _Cache(kept, 50)
    for t, block in enumerate(accesses):
        solo.access(block, float(t))
        mixed.access(block, float(t))
        held = {b for b in range(300) if b in alone}
        assert all({b for b in range(300) if b in e} == held for e in kept.experts)
    assert solo.hits == mixed.hits
    assert kept.evictions_by[1:] == [0, 0] and kept.evictions_by[0] > 0


def _second_half_hits(policy: object, capacity: int, accesses: list[int]) -> int:
    cache = _Cache(policy, capacity)
    half = len(accesses) // 2
    for t, block in enumerate(accesses):
        if t == half:
            first = cache.hits
            if isinstance(policy, KeptExperts):
                policy.chosen = 1  # from here on expert 1 decides
        cache.access(block, float(t))
    return cache.hits - first


def test_choosing_another_expert_takes_its_victims_and_keeps_its_history() -> None:
    accesses = _hot_and_scans(4000, seed=2)
    lfu = _second_half_hits(LFUPolicy(), 40, accesses)
    lru = _second_half_hits(LRUPolicy(), 40, accesses)
    assert lfu > 1.3 * lru  # the workload separates the two
    kept = KeptExperts([LRUPolicy(), LFUPolicy()])
    switched = _second_half_hits(kept, 40, accesses)
    assert kept.evictions_by[0] > 0 and kept.evictions_by[1] > 0
    # lfu counted every access while lru chose: it finds the hot set at once.
    assert switched > lru + 0.9 * (lfu - lru)


def test_a_regret_mix_learns_which_expert_to_follow() -> None:
    accesses = _hot_and_scans(20000, seed=3)
    lfu_hits = _replay(LFUPolicy(), 40, accesses)
    lru_hits = _replay(LRUPolicy(), 40, accesses)
    mix = RegretMix([LRUPolicy(), LFUPolicy()], 40, seed=0)
    mixed = _replay(mix, 40, accesses)
    assert mix.weights[1] > 0.9, "lru's victims (the hot set) come back; lfu's do not"
    assert mixed > lru_hits + 0.8 * (lfu_hits - lru_hits)
    again = RegretMix([LRUPolicy(), LFUPolicy()], 40, seed=0)
    assert _replay(again, 40, accesses) == mixed, "a seeded mix replays the same"


def _evicted_by_the_first(mix: RegretMix, n: int) -> list[int]:
    """``n`` evictions taken by expert 0 (its weight made certain for them)."""
    weights, mix.weights = mix.weights, [1.0, 0.0]
    victims = [block for _ in range(n) for block in mix.evict(1)]
    mix.weights = weights
    return victims


@pytest.mark.parametrize("age", [0, 5])
def test_a_victim_computed_again_cuts_its_experts_weight_by_its_age(age: int) -> None:
    capacity = 10
    mix = RegretMix([LRUPolicy(), FIFOPolicy()], capacity)
    mix.free(list(range(40)), [0] * 40, 0.0, 0)
    (victim,) = _evicted_by_the_first(mix, 1)
    _evicted_by_the_first(mix, age)
    mix.free([victim], [0], 1.0, 0)
    # Its age counts its own eviction (one block) and the ``age`` after it.
    loss = math.exp(-LEARNING_RATE * FORGET_AT ** ((1 + age) / capacity))
    assert mix.weights[0] == pytest.approx(loss / (1 + loss))
    assert sum(mix.weights) == pytest.approx(1.0)


def test_a_victim_older_than_a_cache_of_evictions_is_forgotten() -> None:
    mix = RegretMix([LRUPolicy(), FIFOPolicy()], 10)
    mix.free(list(range(40)), [0] * 40, 0.0, 0)
    (victim,) = _evicted_by_the_first(mix, 1)
    _evicted_by_the_first(mix, 10)
    mix.free([victim], [0], 1.0, 0)
    assert mix.weights == [0.5, 0.5]


def test_experts_that_cannot_discard_or_a_single_expert_are_refused() -> None:
    class NoDiscard(LRUPolicy):
        discard = None  # type: ignore[assignment]

    with pytest.raises(TypeError, match="discard"):
        KeptExperts([LRUPolicy(), NoDiscard()])
    with pytest.raises(ValueError, match="two experts"):
        RegretMix([LRUPolicy()], 10)
    with pytest.raises(ValueError, match="baselines among"):
        regret_wa("belady")


@pytest.fixture(scope="module")
def trace() -> Trace:
    """``test_replay_auto``'s trace: its eager selector switches there."""
    return synthesize("to-b", duration_s=600, qps=4, seed=3)


def test_auto_with_kept_families_switches_without_moving_blocks(trace: Trace) -> None:
    capacity = trace.n_unique // 50
    kept = replace(EAGER, auto_switch="kept")
    policy = catalog.create("auto", capacity, trace, kept)
    assert isinstance(policy, AutoReplayPolicy)
    mix = policy.wa.in_force
    assert isinstance(mix, KeptExperts)
    experts = list(mix.experts)
    hits = replay_hits(trace, policy, capacity, check=True)
    assert len(policy.switches) >= 2
    assert policy.wa.in_force is mix and mix.experts == experts, "a switch moved nothing"
    assert mix.experts[0] is policy.wa.inner
    assert sum(1 for n in mix.evictions_by if n) >= 2, "more than one family evicted"
    assert 0 < hits.sum() <= trace.n_accesses
    never = replace(kept, auto_min_accesses=10**12)
    auto = catalog.create("auto", capacity, trace, never)
    wa = catalog.create("wa", capacity, trace, never)
    assert (replay_hits(trace, auto, capacity) == replay_hits(trace, wa, capacity)).all()


def test_kept_families_refuse_the_superseded_rule() -> None:
    with pytest.raises(ValueError, match="kept families"):
        ReplayOptions(auto_switch="kept", auto_supersede="tree")
    with pytest.raises(ValueError, match="auto_switch"):
        ReplayOptions(auto_switch="swap")  # type: ignore[arg-type]


def test_wa_regret_mixes_wa_shared_and_lru_in_every_cache_of_a_fleet(trace: Trace) -> None:
    capacity = trace.n_unique // 50
    policy = catalog.create("wa-regret", capacity, trace, ReplayOptions())
    assert isinstance(policy, FittedReplayPolicy)
    mix = policy.in_force
    assert isinstance(mix, RegretMix)
    assert mix.experts[0] is policy.inner and isinstance(mix.experts[1], LRUPolicy)
    hits = replay_hits(trace, policy, capacity, check=True)
    assert 0 < hits.sum() <= trace.n_accesses
    assert all(mix.evictions_by), "both experts evicted"
    assert mix.weights != [0.5, 0.5], "victims came back and moved the weights"
    mate = policy.fleet_mate()
    assert isinstance(mate.in_force, RegretMix) and mate.in_force is not mix
    three = regret_wa("lru", "arc")(capacity, trace, ReplayOptions())
    assert isinstance(three.in_force, RegretMix) and len(three.in_force.experts) == 3

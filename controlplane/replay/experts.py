"""Several evictors kept over one cache's blocks, and ``wa-regret`` (replay only), which
evicts by an expert drawn by weight: the more of its recent victims come back, the less
it is drawn.

Owns ``KeptExperts`` (every expert told every touch and release, the chosen one's
victims taken: ``auto``'s kept-families switch, ``controlplane.shadow.auto_replay``),
``RegretMix`` (the chosen expert drawn per eviction by regret weights) and
``RegretSetup``, which puts a mix under a fitted ``wa-shared``.

Why: ``auto`` switches the whole cache to a baseline when the shadow shows one ahead over
a window, and docs/policy.md found its misses in the switches themselves: a lead that does
not last, and the history a switch loses. Here no switch loses anything. Every expert
sees every touch and release, so each keeps its own order over the same blocks; an
eviction asks one of them, drawn by weight, and the others let its victims go (``discard``).
Each expert remembers its own last victims (as many as the cache holds). A block computed
again while in an expert's memory was a mistake of that expert, and its weight is cut by
``exp(-learning_rate * discount ** age)``, ``age`` the blocks evicted since the call that
evicted it began (that call's own included), ``discount`` such that a mistake a whole
cache ago weighs ``FORGET_AT`` of a fresh one; the weights are then normalised. The idea
is LeCaR's (Vietri et al., HotStorage 2018: regret-weighted choice between LRU and LFU),
here over a fitted policy and baselines; its published defaults were the starting point,
``learning_rate`` 0.45 and a discount to 0.005 over a cache.

Draws come from a generator with a fixed seed, so a replay is deterministic. The agent,
the device evictor and the shadow do not run this. It must never do I/O.
"""

from __future__ import annotations

import math
import random
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from agent.policies.arc import ARCPolicy
from agent.policies.base import Discards, EvictionPolicy
from agent.policies.lru import LRUPolicy
from agent.policies.wa import WAPolicy
from controlplane.replay.accesses import HitClasses
from controlplane.replay.online import FittedReplayPolicy, Refits
from controlplane.replay.options import ReplayOptions
from controlplane.replay.reference.wa_ref import WARefPolicy
from controlplane.replay.shared_rate import (
    SharedRateReplayPolicy,
    SharedRateSetup,
    wa_shared_options,
)
from controlplane.traces.model import Trace

LEARNING_RATE = 0.45
FORGET_AT = 0.005
"""What a mistake found a whole cache of evictions late weighs, against a fresh one."""
MIN_WEIGHT = 1e-6
"""No expert's weight falls below this share: one that was wrong for a while can still
be drawn, and so be judged again."""


class KeptExperts:
    """Several evictors over the same cached blocks; ``chosen`` decides the victims.

    Every expert is told every touch and release, so each keeps its own order (and its
    own history) over the blocks cached; an eviction takes the chosen expert's victims
    and the others let them go (``discard``: an expert remembers no ghost of a block it
    did not choose). Choosing another expert moves nothing and loses nothing, unlike a
    hand-over (``agent.policies.handover``)."""

    def __init__(self, experts: Sequence[EvictionPolicy]) -> None:
        discarding: list[Discards] = [e for e in experts if isinstance(e, Discards)]
        if len(discarding) != len(experts) or not experts:
            raise TypeError("every expert must be able to discard another's victims")
        self.experts = list(experts)
        self._discarding: list[Discards] = discarding
        self.chosen = 0
        """The index of the expert whose victims the next eviction takes."""
        self.evictions_by = [0] * len(experts)
        """Blocks evicted by each expert so far."""

    def touch(self, blocks: Sequence[int], now: float) -> None:
        for expert in self.experts:
            expert.touch(blocks, now)

    def free(
        self, blocks: Sequence[int], offsets: Sequence[int], now: float, category: int
    ) -> None:
        for expert in self.experts:
            expert.free(blocks, offsets, now, category)

    def evict(self, n: int) -> list[int]:
        chosen = self.chosen
        victims = self.experts[chosen].evict(n)
        for i, expert in enumerate(self._discarding):
            if i != chosen:
                expert.discard(victims)
        self.evictions_by[chosen] += len(victims)
        return victims

    def discard(self, blocks: Sequence[int]) -> None:
        """``Discards``: every expert lets ``blocks`` go."""
        for expert in self._discarding:
            expert.discard(blocks)

    def __len__(self) -> int:
        return len(self.experts[0])

    def __contains__(self, block: object) -> bool:
        return block in self.experts[0]


class RegretMix(KeptExperts):
    """Kept experts, each eviction by one drawn by its regret weight (module docstring)."""

    def __init__(
        self,
        experts: Sequence[EvictionPolicy],
        capacity: int,
        *,
        learning_rate: float = LEARNING_RATE,
        seed: int = 0,
    ) -> None:
        if len(experts) < 2:
            raise ValueError(f"a regret mix needs two experts or more, got {len(experts)}")
        super().__init__(experts)
        self.weights = [1.0 / len(experts)] * len(experts)
        self._memory: list[OrderedDict[int, int]] = [OrderedDict() for _ in experts]
        self._memory_size = max(capacity, 1)
        self._discount = FORGET_AT ** (1.0 / self._memory_size)
        self._learning_rate = learning_rate
        self._evicted = 0
        self._draw = random.Random(seed)

    def free(
        self, blocks: Sequence[int], offsets: Sequence[int], now: float, category: int
    ) -> None:
        self._regret(blocks)
        super().free(blocks, offsets, now, category)

    def _regret(self, blocks: Sequence[int]) -> None:
        """Cut the weight of each expert whose remembered victim is among ``blocks``."""
        changed = False
        for i, memory in enumerate(self._memory):
            for block in blocks:
                evicted_at = memory.pop(block, None)
                if evicted_at is None:
                    continue
                loss = self._discount ** (self._evicted - evicted_at)
                self.weights[i] *= math.exp(-self._learning_rate * loss)
                changed = True
        if changed:
            total = sum(self.weights)
            self.weights = [max(w / total, MIN_WEIGHT) for w in self.weights]

    def evict(self, n: int) -> list[int]:
        (self.chosen,) = self._draw.choices(range(len(self.experts)), weights=self.weights)
        victims = super().evict(n)
        memory = self._memory[self.chosen]
        for block in victims:
            memory[block] = self._evicted
        while len(memory) > self._memory_size:
            memory.popitem(last=False)
        self._evicted += len(victims)
        return victims


Baseline = Callable[[int], EvictionPolicy]
BASELINES: dict[str, Baseline] = {"lru": LRUPolicy, "arc": ARCPolicy}
"""The baselines a mix may hold beside ``wa-shared``, by name."""


@dataclass(frozen=True, eq=False)
class RegretSetup(SharedRateSetup):
    """``wa-shared``'s setup whose every cache (a fleet's too: ``fleet_mate``) evicts by a
    ``RegretMix`` of its ``wa-shared`` and ``baselines``."""

    baselines: tuple[str, ...] = ("lru",)

    def driver(
        self, evictor: WAPolicy | WARefPolicy, refits: Refits, classes: HitClasses | None
    ) -> SharedRateReplayPolicy:
        policy = super().driver(evictor, refits, classes)
        others = [BASELINES[name](self.capacity) for name in self.baselines]
        policy.in_force = RegretMix([policy.inner, *others], self.capacity)
        return policy


def regret_wa(*baselines: str) -> Callable[[int, Trace, ReplayOptions], FittedReplayPolicy]:
    """A factory of ``wa-shared`` (fitted as ``-p wa-shared`` fits it) mixed with
    ``baselines``; ``wa-regret`` is ``regret_wa("lru")``."""
    unknown = [name for name in baselines if name not in BASELINES]
    if unknown or not baselines:
        raise ValueError(f"a regret mix takes baselines among {sorted(BASELINES)}: {baselines}")

    def fitted(capacity: int, trace: Trace, options: ReplayOptions) -> FittedReplayPolicy:
        setup = RegretSetup.of("wa", trace, wa_shared_options(options), None, capacity)
        return replace(setup, baselines=baselines).policy()

    return fitted


fitted_wa_regret = regret_wa("lru")
"""``wa-regret``: ``wa-shared`` and ``lru``."""

"""The discrete-event loop: requests arrive, are routed, and instances step.

Owns ``SimOptions`` (everything of one simulation but the policy and the capacity) and
``simulate``: one policy at one capacity on one trace. Every instance gets its own cache
of ``capacity`` blocks and its own policy (``fleet_policies``): the replay catalogue's
(``controlplane.replay.catalog``), or one made by the first instance's where that can
share what does not depend on the cache (``FleetShared``). Fitted policies (``wa``) are
fitted online exactly as in ``kvwise replay``, from every request that has arrived at the
fleet: one refitter for the whole fleet, each refit made once and its document applied
by every instance (the controller pools all workers' events and publishes one document),
unless reuse classes by hit make each cache's fit its own. Events are taken in time
order: the end of an instance's step before an arrival at the same time; arrivals in
trace order.

It must never print, read files or summarise (``controlplane.simulate.report``).
"""

from __future__ import annotations

import heapq
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from agent.policies.base import EvictionPolicy
from controlplane.replay import catalog
from controlplane.replay.options import DEFAULT_OPTIONS, ReplayOptions
from controlplane.simulate import router as routers
from controlplane.simulate.cost import CostModel
from controlplane.simulate.instance import Instance
from controlplane.simulate.kv import InstanceCache
from controlplane.simulate.profiles import BUILTIN, DEFAULT_PROFILE, Profile
from controlplane.simulate.requests import DEFAULT_OUTPUT_TOKENS, Outcomes, Workload, workload
from controlplane.traces.model import Trace

UNBOUNDED = ("inf",)
"""Policies whose cache has no size: no capacity limits their instances at all."""

ProgressFn = Callable[[int], None]
"""Called with the number of requests that have arrived so far."""


@dataclass(frozen=True)
class SimOptions:
    """One simulation's setting, apart from the policy and the capacity."""

    profile: Profile = field(default_factory=lambda: BUILTIN[DEFAULT_PROFILE])
    instances: int = 1
    router: str = "round-robin"
    speed: float = 1.0
    block_tokens: int | None = None
    """Tokens per block; None: the trace format's (docs/traces.md)."""
    output_tokens: int = DEFAULT_OUTPUT_TOKENS
    """Output tokens of requests whose trace gives none."""
    slack: int = routers.DEFAULT_SLACK
    replay: ReplayOptions = DEFAULT_OPTIONS
    """How fitted policies are fitted (as in ``kvwise replay``)."""

    def __post_init__(self) -> None:
        if self.instances < 1:
            raise ValueError(f"instances must be >= 1, got {self.instances}")
        if self.router not in routers.names():
            raise routers.UnknownRouterError(self.router)
        if self.slack < 0:
            raise ValueError(f"slack must be >= 0, got {self.slack}")


@runtime_checkable
class FleetShared(Protocol):
    """A policy that makes the policy of another instance of its fleet, sharing with it
    what does not depend on the cache (a fitted ``wa``: the trace's category codes,
    access columns and refits)."""

    def fleet_mate(self) -> EvictionPolicy:
        """Another instance's policy, made before the run."""


def fleet_policies(
    policy: str, capacity: int, trace: Trace, options: SimOptions
) -> list[EvictionPolicy]:
    """One ``policy`` per instance, in a cache of ``capacity`` blocks, serving ``trace``."""
    first = catalog.create(policy, capacity, trace, options.replay)
    made = [first]
    for _ in range(1, options.instances):
        made.append(
            first.fleet_mate()
            if isinstance(first, FleetShared)
            else catalog.create(policy, capacity, trace, options.replay)
        )
    return made


class _Fleet:
    def __init__(self, instances: list[Instance]) -> None:
        self._instances = instances

    def loads(self) -> list[int]:
        return [inst.load for inst in self._instances]

    def matched(self, instance: int, request: int) -> int:
        return self._instances[instance].cache.matched(request)


def simulate(
    trace: Trace,
    policy: str,
    capacity: int,
    options: SimOptions,
    *,
    progress: ProgressFn | None = None,
    progress_every: int = 1000,
) -> tuple[Workload, Outcomes]:
    """Serve ``trace`` with ``options.instances`` instances, each with a ``policy`` cache
    of ``capacity`` blocks; what each request asked and what happened to it."""
    if capacity < 0:
        raise ValueError(f"capacity must be >= 0, got {capacity}")
    work = workload(
        trace,
        speed=options.speed,
        block_tokens=options.block_tokens,
        output_tokens=options.output_tokens,
    )
    out = Outcomes.empty(work)
    cost = CostModel(options.profile)
    limit = sys.maxsize if policy in UNBOUNDED else capacity
    # Read-only per-request lists, built once and shared by every instance's cache.
    categories, offsets = trace.categories.tolist(), trace.offsets.tolist()
    instances = []
    for i, evictor in enumerate(fleet_policies(policy, capacity, trace, options)):
        cache = InstanceCache(evictor, limit, trace.blocks, offsets, trace.n_unique, categories)
        instances.append(Instance(i, cache, cost, options.profile, work, out))
    router = routers.create(options.router, trace, _Fleet(instances), len(instances), options.slack)
    _run(instances, router, work, progress, progress_every)
    out.evicted_blocks = sum(inst.cache.evicted for inst in instances)
    return work, out


def _run(
    instances: list[Instance],
    router: routers.Router,
    work: Workload,
    progress: ProgressFn | None,
    progress_every: int,
) -> None:
    indexed = [inst.cache.indexed for inst in instances if inst.cache.indexed is not None]
    events: list[tuple[float, int, int, int]] = []  # (time, order, instance, version)
    order = 0
    arrivals = work.arrival
    n = len(arrivals)
    a = 0
    while a < n or events:
        next_arrival = arrivals[a] if a < n else math.inf
        if events and events[0][0] <= next_arrival:
            now, _, i, version = heapq.heappop(events)
            inst = instances[i]
            if version != inst.version:
                continue  # replaced by an earlier end (interrupted decode stretch)
            inst.finish_step(now)
        else:
            now, r = next_arrival, a
            a += 1
            for policy in indexed:
                policy.arrive(r)
            inst = instances[router.route(r)]
            inst.waiting.append(r)
            if progress is not None and r % progress_every == 0:
                progress(r)
            if inst.busy:
                end = inst.interrupt(now)
                if end is not None:
                    order += 1
                    heapq.heappush(events, (end, order, inst.index, inst.version))
                continue
        duration = inst.step(now)
        if duration is not None:
            order += 1
            heapq.heappush(events, (now + duration, order, inst.index, inst.version))
    if progress is not None:
        progress(n)

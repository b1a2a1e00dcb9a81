"""One policy, one capacity, one trace: the replay loop that defines every hit ratio here.

Owns the replay semantics of DESIGN.md, to the block:

- requests in timestamp order (file order breaks ties; ``Trace`` is already in that order);
- a request's hits are the longest prefix of its blocks cached on arrival;
- then every block is accessed at the request's timestamp: cached blocks are touched (a
  cached block after the prefix breaks is recomputed, so it is a miss, but it is accessed
  and stays cached), the rest inserted; all are freed tail first;
- after each request the cache evicts until it holds at most ``capacity`` blocks.

It must never do I/O, print, or pick policies by name (``controlplane.replay.catalog``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import compress

import numpy as np
from numpy.typing import NDArray

from agent.policies.base import EvictionPolicy
from controlplane.traces.model import Trace

ProgressFn = Callable[[int], None]
"""Called with the number of requests replayed so far."""


@dataclass(frozen=True)
class CategoryResult:
    hits: int
    accesses: int

    @property
    def hit_ratio(self) -> float:
        return self.hits / self.accesses if self.accesses else 0.0


@dataclass(frozen=True)
class ReplayResult:
    """Block hit ratio of one policy at one capacity on one trace."""

    trace: str
    policy: str
    capacity: int
    hits: int
    accesses: int
    per_category: dict[str, CategoryResult] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def hit_ratio(self) -> float:
        return self.hits / self.accesses if self.accesses else 0.0

    def to_json(self) -> dict[str, object]:
        return {
            "policy": self.policy,
            "capacity": self.capacity,
            "hit_ratio": self.hit_ratio,
            "hits": self.hits,
            "accesses": self.accesses,
            "seconds": round(self.seconds, 3),
            "per_category": {
                name: {"hit_ratio": c.hit_ratio, "hits": c.hits, "accesses": c.accesses}
                for name, c in self.per_category.items()
            },
        }


def replay_hits(
    trace: Trace,
    policy: EvictionPolicy,
    capacity: int,
    *,
    progress: ProgressFn | None = None,
    progress_every: int = 2000,
) -> NDArray[np.int64]:
    """Replay ``trace`` through ``policy``; return the prefix-hit block count per request."""
    if capacity < 0:
        raise ValueError(f"capacity must be >= 0, got {capacity}")
    n = trace.n_requests
    offsets = trace.offsets.tolist()
    timestamps = trace.timestamps.tolist()
    categories = trace.categories.tolist()
    blocks = trace.blocks
    hits = np.zeros(n, dtype=np.int64)
    # Bound methods once: the loop runs millions of times.
    contains = policy.__contains__
    touch, free, evict = policy.touch, policy.free, policy.evict
    size = policy.__len__
    for r in range(n):
        lo, hi = offsets[r], offsets[r + 1]
        req = blocks[lo:hi].tolist()
        now = timestamps[r]
        cached = list(map(contains, req))
        try:
            h = cached.index(False)
        except ValueError:
            h = hi - lo
        if h:
            hits[r] = h
        if h or any(cached):
            touch(list(compress(req, cached)), now)
        req.reverse()
        free(req, range(hi - lo - 1, -1, -1), now, categories[r])
        excess = size() - capacity
        if excess > 0:
            evict(excess)
        if progress is not None and r % progress_every == 0:
            progress(r)
    if progress is not None:
        progress(n)
    return hits


def summarize(
    trace: Trace, policy_name: str, capacity: int, hits: NDArray[np.int64], seconds: float = 0.0
) -> ReplayResult:
    """Totals and per-category hit ratios from per-request hit counts."""
    lengths = trace.lengths
    k = len(trace.category_names)
    cat_hits = np.bincount(trace.categories, weights=hits, minlength=k)
    cat_acc = np.bincount(trace.categories, weights=lengths, minlength=k)
    per_category = {
        name: CategoryResult(int(cat_hits[i]), int(cat_acc[i]))
        for i, name in enumerate(trace.category_names)
        if cat_acc[i] > 0
    }
    return ReplayResult(
        trace=trace.name,
        policy=policy_name,
        capacity=capacity,
        hits=int(hits.sum()),
        accesses=int(lengths.sum()),
        per_category=per_category,
        seconds=seconds,
    )

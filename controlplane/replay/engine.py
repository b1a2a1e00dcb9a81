"""One policy, one capacity, one trace: the replay loop that defines every hit ratio here.

Owns the replay semantics (docs/replay.md), to the block:

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
from typing import Final, Protocol, runtime_checkable

import numpy as np
from numpy.typing import NDArray

from agent.policies.base import EvictionPolicy
from controlplane.traces.model import Trace

ProgressFn = Callable[[int], None]
"""Called with the number of requests replayed so far."""
PROGRESS_EVERY: Final = 2000
"""Requests replayed between two calls of a replay's ``progress``."""


class HitCounts:
    """Hits among block accesses: what every result of a replay or a simulation counts
    (``hits`` and ``accesses`` are the subclass's fields)."""

    hits: int
    accesses: int

    @property
    def hit_ratio(self) -> float:
        """Hits over accesses (no access: 0)."""
        return self.hits / self.accesses if self.accesses else 0.0

    def counts_json(self) -> dict[str, float]:
        """The counts and their ratio, as every ``--json`` gives them."""
        return {"hit_ratio": self.hit_ratio, "hits": self.hits, "accesses": self.accesses}


@dataclass(frozen=True)
class CategoryResult(HitCounts):
    hits: int
    accesses: int


@dataclass(frozen=True)
class ReplayResult(HitCounts):
    """Block hit ratio of one policy at one capacity on one trace."""

    trace: str
    policy: str
    capacity: int
    hits: int
    accesses: int
    per_category: dict[str, CategoryResult] = field(default_factory=dict)
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    """What the policy says of its run (``auto``: each switch of family)."""

    def to_json(self) -> dict[str, object]:
        return {
            "policy": self.policy,
            "capacity": self.capacity,
            **self.counts_json(),
            "seconds": round(self.seconds, 3),
            "per_category": {name: c.counts_json() for name, c in self.per_category.items()},
            **({"notes": self.notes} if self.notes else {}),
        }


@runtime_checkable
class ExplainsRun(Protocol):
    """A policy with something to say of its replay (``auto``: when it switched family)."""

    def run_notes(self) -> list[str]:
        """One line per thing worth knowing, in the order it happened."""


class ReplayCheckError(AssertionError):
    """A policy broke the Protocol during a checked replay (``replay_hits(check=True)``)."""


def replay_hits(
    trace: Trace,
    policy: EvictionPolicy,
    capacity: int,
    *,
    progress: ProgressFn | None = None,
    check: bool = False,
) -> NDArray[np.int64]:
    """Replay ``trace`` through ``policy``; return the prefix-hit block count per request.
    ``progress`` is told the requests replayed every ``PROGRESS_EVERY`` and at the end.

    With ``check`` (tests: slow) it verifies after every request that the policy evicted
    only cached blocks, no more than asked, and enough to fit ``capacity``, and that its
    ``__contains__`` agrees with what the replay inserted and evicted.
    """
    if capacity < 0:
        raise ValueError(f"capacity must be >= 0, got {capacity}")
    n = trace.n_requests
    offsets = trace.offsets.tolist()
    timestamps = trace.timestamps.tolist()
    categories = trace.categories.tolist()
    blocks = trace.blocks
    hits = [0] * n
    # What is cached, block by block. The policy changes it only by inserting in ``free``
    # (every block of a request is cached once it is freed) and by the victims ``evict``
    # returns, so this mirror answers each request's lookups in one vectorised gather
    # instead of one ``__contains__`` call per block (``check`` verifies the two agree).
    cached = np.zeros(int(blocks.max()) + 1 if len(blocks) else 0, dtype=np.bool_)
    # Bound methods once: the loop runs millions of times.
    touch, free, evict = policy.touch, policy.free, policy.evict
    size = policy.__len__
    for r in range(n):
        lo, hi = offsets[r], offsets[r + 1]
        req = blocks[lo:hi]
        now = timestamps[r]
        flags = cached[req].tobytes()
        ids = req.tolist()
        h = flags.find(0)
        if h < 0:
            h = hi - lo
        if h:
            hits[r] = h
        if h or 1 in flags:
            touch(list(compress(ids, flags)), now)
        ids.reverse()
        free(ids, range(hi - lo - 1, -1, -1), now, categories[r])
        cached[req] = True
        excess = size() - capacity
        victims = evict(excess) if excess > 0 else []
        if check:
            _check_request(r, policy, capacity, excess, victims, req, cached)
        if victims:
            cached[victims] = False
        if progress is not None and r % PROGRESS_EVERY == 0:
            progress(r)
    if progress is not None:
        progress(n)
    return np.array(hits, dtype=np.int64)


def _check_request(
    r: int,
    policy: EvictionPolicy,
    capacity: int,
    excess: int,
    victims: list[int],
    req: NDArray[np.int64],
    cached: NDArray[np.bool_],
) -> None:
    """The Protocol after request ``r``; ``cached`` does not reflect its victims yet."""

    def fail(what: str) -> None:
        raise ReplayCheckError(f"request {r}: {what}")

    if len(victims) > max(excess, 0):
        fail(f"evict({excess}) returned {len(victims)} blocks")
    if len(set(victims)) != len(victims):
        fail(f"evict returned a block twice: {victims}")
    if len(policy) > capacity:
        fail(f"{len(policy)} blocks cached after eviction, capacity {capacity}")
    gone = set(victims)
    for b in victims:
        if not cached[b]:
            fail(f"evict returned block {b}, which was not cached")
    for b in gone.union(req.tolist()):
        if (b in policy) != (b not in gone):
            fail(f"block {b}: in policy = {b in policy}, evicted = {b in gone}")


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

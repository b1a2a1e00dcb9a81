"""Miniature caches and the sliding-window hit ratios they score.

Owns ``MiniCache`` (one policy at one capacity, replaying sampled requests with exactly
the semantics of ``controlplane.replay.engine``: the longest cached prefix is the
request's hits, cached blocks are touched, every block is freed tail first, then the cache
evicts down to capacity) and ``WindowCounts`` (hits and accesses per time bucket, with
what the confidence interval needs). The interval treats each sampled request as one
cluster of accesses (a ratio estimator's variance, normal approximation, 95 %); it does
not count the correlation between requests of one prefix tree, so it is narrower than the
whole sampling error when a few trees carry most of the traffic (docs/shadow.md). It must
never rebuild requests or know about workers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import compress

import numpy as np
from numpy.typing import NDArray

from agent.policies.base import EvictionPolicy
from controlplane.shadow.rebuild import Request

Z95 = 1.959964
"""Two-sided 95 % normal quantile."""


class MiniCache:
    """``policy`` holding at most ``capacity`` blocks, fed one request at a time."""

    def __init__(self, policy: EvictionPolicy, capacity: int) -> None:
        self.policy = policy
        self.capacity = capacity
        self._cached: set[int] = set()

    def serve(self, request: Request) -> int:
        """Replay ``request``; returns its prefix hits."""
        ids = request.blocks
        n = len(ids)
        cached = self._cached
        flags = [b in cached for b in ids]
        try:
            hits = flags.index(False)
        except ValueError:
            hits = n
        if hits or any(flags):
            self.policy.touch(list(compress(ids, flags)), request.ts)
        self.policy.free(ids[::-1], range(n - 1, -1, -1), request.ts, request.category)
        cached.update(ids)
        excess = len(self.policy) - self.capacity
        if excess > 0:
            cached.difference_update(self.policy.evict(excess))
        return hits


@dataclass(frozen=True)
class Estimate:
    """A hit ratio over the window with its 95 % interval (0 accesses: all zero)."""

    hit_ratio: float
    ci_low: float
    ci_high: float
    hits: int
    accesses: int
    requests: int


class WindowCounts:
    """Per time bucket: requests, hits, accesses and the sums of squares the interval
    needs; buckets older than the window are forgotten as time moves on."""

    def __init__(self, window_s: float, buckets: int) -> None:
        self.bucket_s = window_s / buckets
        self.buckets = buckets
        self._id = np.full(buckets, -1, dtype=np.int64)
        self._sums = np.zeros((buckets, 6))  # requests, hits, accesses, h^2, a^2, h*a

    def add(self, ts: float, hits: int, accesses: int) -> None:
        row = (1.0, hits, accesses, hits * hits, accesses * accesses, hits * accesses)
        self._add_sums(int(ts // self.bucket_s), row)

    def add_many(
        self, ts: NDArray[np.float64], hits: NDArray[np.int64], accesses: NDArray[np.int64]
    ) -> None:
        """Many requests at once: their counts only (no squares: no interval is drawn)."""
        buckets = (ts // self.bucket_s).astype(np.int64)
        for bucket in np.unique(buckets).tolist():
            mine = buckets == bucket
            row = (float(mine.sum()), float(hits[mine].sum()), float(accesses[mine].sum()))
            self._add_sums(bucket, (*row, 0.0, 0.0, 0.0))

    def _add_sums(self, bucket: int, row: tuple[float, ...]) -> None:
        slot = bucket % self.buckets
        sums = self._sums[slot]
        if self._id[slot] != bucket:
            if self._id[slot] > bucket:
                return  # older than the window this slot now holds
            self._id[slot] = bucket
            sums[:] = 0.0
        sums += row

    def totals(self, now: float) -> Totals:
        """The sums of the window ending at ``now`` (add several workers' with ``+``)."""
        newest = int(now // self.bucket_s)
        live = (self._id > newest - self.buckets) & (self._id <= newest)
        return Totals(*self._sums[live].sum(axis=0).tolist())


@dataclass(frozen=True)
class Totals:
    """Sums over sampled requests: count, hits, accesses, and the squares."""

    requests: float = 0.0
    hits: float = 0.0
    accesses: float = 0.0
    hits2: float = 0.0
    accesses2: float = 0.0
    cross: float = 0.0

    def __add__(self, other: Totals) -> Totals:
        pairs = zip(vars(self).values(), vars(other).values(), strict=True)
        return Totals(*(a + b for a, b in pairs))

    def estimate(self) -> Estimate:
        """The hit ratio and its 95 % interval (no accesses: all zero)."""
        n, h, a = self.requests, self.hits, self.accesses
        if a <= 0:
            return Estimate(0.0, 0.0, 0.0, 0, 0, int(n))
        ratio = h / a
        spread = max(self.hits2 - 2 * ratio * self.cross + ratio * ratio * self.accesses2, 0.0)
        half = Z95 * math.sqrt(spread * n / max(n - 1, 1.0)) / a
        low, high = max(ratio - half, 0.0), min(ratio + half, 1.0)
        return Estimate(ratio, low, high, int(h), int(a), int(n))

"""Miniature caches and the sliding-window hit ratios they score.

Owns ``MiniCache`` (one policy at one capacity, replaying sampled requests with exactly
the semantics of ``controlplane.replay.engine``: the longest cached prefix is the
request's hits, cached blocks are touched, every block is freed tail first, then the cache
evicts down to capacity; with ``ReuseClassing``, releases are filed by reuse class as the
agent files them, decided on the miniature's own hits and evictions) and
``WindowCounts`` (hits and accesses per time bucket, with what the confidence interval
needs). The interval treats each sampled request as one cluster of accesses (a ratio
estimator's variance, normal approximation, 95 %); it does not count the correlation
between requests of one prefix tree, so it is narrower than the whole sampling error when
a few trees carry most of the traffic (docs/shadow.md). It must
never rebuild requests or know about workers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import compress

import numpy as np
from numpy.typing import NDArray

from agent.policies.base import EvictionPolicy
from agent.policies.wa_core import runs
from agent.reuse_classes import ReturnTracker
from controlplane.shadow.rebuild import Request

Z95 = 1.959964
"""Two-sided 95 % normal quantile."""


@dataclass(frozen=True)
class ReuseClassing:
    """Reuse classes in a miniature cache, decided as the agent decides them
    (``agent.reuse_classes``) but on the miniature cache's own hits and evictions: a
    released block that was found cached, or is in the ghost of recent evictions, is filed
    under its category's ``w/re`` code, ``return_code(w)``."""

    tracker: ReturnTracker
    return_code: Callable[[int], int]

    def codes(self, category: int, released: Sequence[int]) -> list[int]:
        again = self.return_code(category)
        return [again if back else category for back in self.tracker.returns(released)]


class MiniCache:
    """``policy`` holding at most ``capacity`` blocks, fed one request at a time (with
    ``classing``, releases are filed by reuse class)."""

    def __init__(
        self, policy: EvictionPolicy, capacity: int, classing: ReuseClassing | None = None
    ) -> None:
        self.policy = policy
        self.capacity = capacity
        self.classing = classing
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
            found = list(compress(ids, flags))
            self.policy.touch(found, request.ts)
            if self.classing is not None:
                self.classing.tracker.touched(found)
        self._release(ids[::-1], n, request)
        cached.update(ids)
        excess = len(self.policy) - self.capacity
        if excess > 0:
            victims = self.policy.evict(excess)
            cached.difference_update(victims)
            if self.classing is not None:
                self.classing.tracker.evicted(victims)
        return hits

    def _release(self, released: list[int], n: int, request: Request) -> None:
        """Every block, tail first, under its category (or its reuse class)."""
        offsets = range(n - 1, -1, -1)
        if self.classing is None or not n:
            self.policy.free(released, offsets, request.ts, request.category)
            return
        for code, lo, hi in runs(self.classing.codes(request.category, released)):
            self.policy.free(released[lo:hi], offsets[lo:hi], request.ts, code)


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

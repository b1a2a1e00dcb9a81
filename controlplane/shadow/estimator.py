"""Miniature caches and the sliding-window hit ratios they score.

Owns ``MiniCache`` (one policy at one capacity, replaying sampled requests with exactly
the semantics of ``controlplane.replay.engine``: the longest cached prefix is the
request's hits, cached blocks are touched, every block is freed tail first, then the cache
evicts down to capacity; with ``ReuseClassing``, releases are filed by reuse class as the
agent files them, decided on the miniature's own hits and evictions), ``WindowCounts``
(per time bucket and per sampled subtree: hits, accesses and the worker's own hits) and
``Totals`` (the estimate: the regression of the miniature's figure on the worker's own
hit ratio, known over every request, with a 95 % interval that takes each sampled subtree
as one draw, normal approximation; docs/shadow.md). The interval covers the draw of
subtrees, not the miniature's own error, so it is narrower than the whole error. It must
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
    sampled_ratio: float = 0.0
    """The sample's own hit ratio, before the regression moves it."""


class WindowCounts:
    """Per time bucket: requests, hits, accesses and the worker's own hits, and the same
    per sampled subtree (the key block that decided its requests), which the estimate and
    its interval need; buckets older than the window are forgotten as time moves on."""

    def __init__(self, window_s: float, buckets: int) -> None:
        self.bucket_s = window_s / buckets
        self.buckets = buckets
        self._id = np.full(buckets, -1, dtype=np.int64)
        self._sums = np.zeros((buckets, 4))  # requests, hits, accesses, seen
        self._subtrees: list[dict[int, list[float]]] = [{} for _ in range(buckets)]

    def add(self, ts: float, hits: int, accesses: int, seen: int, subtree: int) -> None:
        """One sampled request: its hits and accesses here, its prefix hits in the worker's
        own cache (``seen``), and the key block of its subtree."""
        slot = self._slot(int(ts // self.bucket_s))
        if slot is None:
            return
        self._sums[slot] += (1.0, hits, accesses, seen)
        sums = self._subtrees[slot].get(subtree)
        if sums is None:
            self._subtrees[slot][subtree] = [hits, accesses, seen]
        else:
            sums[0] += hits
            sums[1] += accesses
            sums[2] += seen

    def add_many(
        self, ts: NDArray[np.float64], hits: NDArray[np.int64], accesses: NDArray[np.int64]
    ) -> None:
        """Many requests at once: their counts only (no subtrees: no interval is drawn)."""
        buckets = (ts // self.bucket_s).astype(np.int64)
        for bucket in np.unique(buckets).tolist():
            slot = self._slot(bucket)
            if slot is not None:
                mine = buckets == bucket
                self._sums[slot, :3] += (mine.sum(), hits[mine].sum(), accesses[mine].sum())

    def _slot(self, bucket: int) -> int | None:
        """``bucket``'s slot, emptied if it held an older bucket (None: ``bucket`` is older
        than the window the slot now holds)."""
        slot = bucket % self.buckets
        if self._id[slot] != bucket:
            if self._id[slot] > bucket:
                return None
            self._id[slot] = bucket
            self._sums[slot] = 0.0
            self._subtrees[slot] = {}
        return slot

    def totals(self, now: float) -> Totals:
        """The sums of the window ending at ``now`` (add several workers' with ``+``)."""
        newest = int(now // self.bucket_s)
        live = np.flatnonzero((self._id > newest - self.buckets) & (self._id <= newest))
        requests, hits, accesses, seen = self._sums[live].sum(axis=0).tolist()
        merged: dict[int, NDArray[np.float64]] = {}
        for slot in live.tolist():
            for subtree, sums in self._subtrees[slot].items():
                row = merged.get(subtree)
                merged[subtree] = np.array(sums) if row is None else row + sums
        if not merged:
            return Totals(requests, hits, accesses, seen)
        per = np.array(list(merged.values()))  # subtrees x (hits, accesses, seen)
        products = per.T @ per
        return Totals(requests, hits, accesses, seen, len(merged), tuple(products.ravel()))


@dataclass(frozen=True)
class Totals:
    """Sums over sampled requests (count, hits, accesses, the worker's own hits) and over
    their subtrees (how many, and the 3 x 3 products of each subtree's hits, accesses and
    own hits, row-major)."""

    requests: float = 0.0
    hits: float = 0.0
    accesses: float = 0.0
    seen: float = 0.0
    subtrees: float = 0.0
    products: tuple[float, ...] = (0.0,) * 9

    def __add__(self, other: Totals) -> Totals:
        products = tuple(a + b for a, b in zip(self.products, other.products, strict=True))
        return Totals(
            self.requests + other.requests,
            self.hits + other.hits,
            self.accesses + other.accesses,
            self.seen + other.seen,
            self.subtrees + other.subtrees,
            products,
        )

    def estimate(self, seen_ratio: float | None = None) -> Estimate:
        """The hit ratio and its 95 % interval (no accesses: all zero).

        With ``seen_ratio``, the worker's own hit ratio over *all* its requests, it is the
        regression estimate: the sample's figure moved by ``beta`` times what the sample
        misses of the worker's own figure, ``beta`` fitted over the sampled subtrees
        (how this cache's hits per subtree follow the worker's). Which subtrees were
        drawn moves both figures together, so most of that error cancels.
        """
        n, h, a = self.subtrees, self.hits, self.accesses
        if a <= 0:
            return Estimate(0.0, 0.0, 0.0, 0, 0, int(self.requests))
        ratio, own = h / a, self.seen / a
        hh, ha, hs, _, aa, as_, _, _, ss = self.products
        # Per subtree, u = hits - ratio * accesses and v = seen - own * accesses.
        uu = hh - 2 * ratio * ha + ratio * ratio * aa
        vv = ss - 2 * own * as_ + own * own * aa
        uv = hs - ratio * as_ - own * ha + ratio * own * aa
        beta = uv / vv if seen_ratio is not None and vv > 1e-9 * max(ss, 1.0) else 0.0
        estimate = ratio + beta * ((seen_ratio or 0.0) - own)
        spread = max(uu - 2 * beta * uv + beta * beta * vv, 0.0)
        half = Z95 * math.sqrt(spread * n / max(n - 1, 1.0)) / a
        value = min(max(estimate, 0.0), 1.0)
        low = min(max(estimate - half, 0.0), value)
        high = max(min(estimate + half, 1.0), value)
        return Estimate(value, low, high, int(h), int(a), int(self.requests), ratio)

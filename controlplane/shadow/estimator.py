"""Miniature caches and the sliding-window hit ratios they score.

Owns ``MiniCache`` (one policy at one capacity, replaying sampled requests with exactly
the semantics of ``controlplane.replay.engine``: the longest cached prefix is the
request's hits, cached blocks are touched, every block is freed tail first, then the cache
evicts down to capacity; with ``ReuseClassing``, releases are filed by reuse class as the
agent files them, decided on the miniature's own hits and evictions; running the
document's ``supersede`` rule, superseded branches are evicted first, as a vLLM or SGLang
worker under ``wa`` evicts them: ``agent.branches``), ``WindowCounts``
(per time bucket and per sampled subtree: hits, accesses and the worker's own hits),
``RunCounts`` (a worker's whole and incomplete runs of events), the ``BucketRing`` of
time buckets both keep, and ``Totals`` (the estimate: the regression of the miniature's
figure on the worker's own hit ratio, known over every request, with a 95 % interval that
takes each sampled subtree as one draw, normal approximation; docs/shadow.md). The
interval covers the draw of subtrees, not the miniature's own error, so it is narrower
than the whole error. It must never rebuild requests or know about workers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import compress
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from agent.branches import CachedBranches
from agent.policies.base import Discards, EvictionPolicy, Resizable
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
    ghost_per_block: float | None = None
    """The ghost's blocks per block of the miniature, when it is resized (None: the
    tracker's ghost over the miniature's first capacity)."""

    def codes(self, category: int, released: Sequence[int]) -> list[int]:
        again = self.return_code(category)
        return [again if back else category for back in self.tracker.returns(released)]


class ReleaseFiling(Protocol):
    """Files a miniature's released blocks under other codes than their categories' (or
    reuse classes'), on what the miniature itself read and evicted: replay's
    ``wa-shared`` (``controlplane.replay.shared_rate.SharedRateFiling``)."""

    def codes(
        self, blocks: Sequence[int], offsets: Sequence[int], codes: list[int], now: float
    ) -> list[int]: ...

    def evicted(self, victims: Sequence[int]) -> None: ...

    def resize(self, capacity: int) -> None: ...


class MiniCache:
    """``policy`` holding at most ``capacity`` blocks, fed one request at a time (with
    ``classing``, releases are filed by reuse class; with ``filing``, then by it)."""

    def __init__(
        self,
        policy: EvictionPolicy,
        capacity: int,
        classing: ReuseClassing | None = None,
        filing: ReleaseFiling | None = None,
    ) -> None:
        self.policy = policy
        self.capacity = capacity
        self.classing = classing
        self.filing = filing
        self._resizable = policy if isinstance(policy, Resizable) else None
        """The policy, when it resizes its own bookkeeping (checked once: a Protocol's
        ``isinstance`` is slow)."""
        self._cached: set[int] = set()
        self.branches: CachedBranches | None = None
        """The ``supersede`` rule's links and marks while the cache runs it
        (``run_branch_rule``)."""
        self._discard: Callable[[Sequence[int]], None] = _no_discard
        self._ghost_per_block = 0.0
        if classing is not None:
            self._ghost_per_block = classing.ghost_per_block or (
                classing.tracker.ghost_size / capacity if capacity else 0.0
            )

    def resize(self, capacity: int) -> None:
        """Evict down to ``capacity`` from the next request on; the policy's own
        bookkeeping (``Resizable``) and the reuse classes' ghost follow it."""
        if capacity == self.capacity:
            return
        self.capacity = capacity
        if self._resizable is not None:
            self._resizable.resize(capacity)
        if self.classing is not None:
            self.classing.tracker.ghost_size = round(capacity * self._ghost_per_block)
        if self.filing is not None:
            self.filing.resize(capacity)

    def run_branch_rule(self, on: bool) -> None:
        """Evict superseded branches first from the next request on, tracked afresh from
        there (``on``, the document's ``supersede: tree``), or no longer; as a worker's
        free queue does on a change of document."""
        if not on:
            self.branches = None
        elif self.branches is None:
            policy = self.policy
            if not isinstance(policy, Discards):
                raise TypeError(f"{type(policy).__name__} cannot drop superseded blocks")
            self._discard = policy.discard
            self.branches = CachedBranches()

    def serve(self, request: Request) -> int:
        """Replay ``request``; returns its prefix hits."""
        ids = request.blocks
        n = len(ids)
        cached = self._cached
        flags = list(map(cached.__contains__, ids))
        try:
            hits = flags.index(False)
        except ValueError:
            hits = n
        if hits or any(flags):
            found = list(compress(ids, flags))
            self.policy.touch(found, request.ts)
            if self.classing is not None:
                self.classing.tracker.touched(found)
        if self.branches is not None:
            _tell_branches(self.branches, ids, hits)
        self._release(ids[::-1], n, request)
        cached.update(ids)
        excess = len(self.policy) - self.capacity
        if excess > 0:
            victims = self._evict(excess)
            cached.difference_update(victims)
            if self.classing is not None:
                self.classing.tracker.evicted(victims)
            if self.filing is not None:
                self.filing.evicted(victims)
        return hits

    def _evict(self, n: int) -> list[int]:
        """``n`` victims: the oldest superseded blocks first while the rule runs, then the
        policy's own."""
        branches = self.branches
        if branches is None:
            return self.policy.evict(n)
        victims = branches.victims(n, self.policy)
        if victims:
            self._discard(victims)
        if len(victims) < n:
            victims += self.policy.evict(n - len(victims))
        branches.forget(victims)
        return victims

    def _release(self, released: list[int], n: int, request: Request) -> None:
        """Every block, tail first, under its category (or its reuse class, then the
        code ``filing`` gives)."""
        offsets = range(n - 1, -1, -1)
        if (self.classing is None and self.filing is None) or not n:
            self.policy.free(released, offsets, request.ts, request.category)
            return
        codes = (
            [request.category] * n
            if self.classing is None
            else self.classing.codes(request.category, released)
        )
        if self.filing is not None:
            codes = self.filing.codes(released, offsets, codes, request.ts)
        for code, lo, hi in runs(codes):
            self.policy.free(released[lo:hi], offsets[lo:hi], request.ts, code)


def _no_discard(blocks: Sequence[int]) -> None:
    raise RuntimeError("superseded blocks dropped while the rule does not run")


def _tell_branches(branches: CachedBranches, ids: list[int], hits: int) -> None:
    """A request of ``ids`` whose first ``hits`` were cached: its hits, then its stores
    after them, leaving its last hit (as an engine reports them)."""
    if hits:
        branches.touched(ids[:hits])
    if hits < len(ids):
        parent = ids[hits - 1] if hits else branches.root
        branches.stored(parent, ids[hits:], parting=True)


@dataclass(frozen=True)
class Estimate:
    """A hit ratio over the window with its 95 % interval (0 accesses: 0.0 in [0, 1])."""

    hit_ratio: float
    ci_low: float
    ci_high: float
    hits: int
    accesses: int
    requests: int
    sampled_ratio: float = 0.0
    """The sample's own hit ratio, before the regression moves it."""


class BucketRing:
    """The time buckets of a sliding window, held in a ring of ``buckets`` slots: which
    bucket each slot holds now. What a slot counts is its owner's; the ring says when a
    slot is taken over by a newer bucket, so the owner empties it first."""

    def __init__(self, window_s: float, buckets: int) -> None:
        self.bucket_s = window_s / buckets
        self.buckets = buckets
        self._bucket_of_slot = np.full(buckets, _EMPTY, dtype=np.int64)

    def bucket(self, ts: float) -> int:
        return int(ts // self.bucket_s)

    def slot(self, bucket: int, forget: Callable[[int], None]) -> int | None:
        """``bucket``'s slot, handed to ``forget`` first if it held an older bucket (None:
        ``bucket`` is older than the window the slot now holds)."""
        slot = bucket % self.buckets
        held = self._bucket_of_slot[slot]
        if held != bucket:
            if held > bucket:
                return None
            forget(slot)
            self._bucket_of_slot[slot] = bucket
        return slot

    def expire(self, now: float, forget: Callable[[int], None]) -> None:
        """Hand every slot whose bucket has left the window ending at ``now`` to
        ``forget``, and mark it empty."""
        held = self._bucket_of_slot
        for slot in np.flatnonzero((held != _EMPTY) & (held <= self.bucket(now) - self.buckets)):
            forget(int(slot))
            held[slot] = _EMPTY

    def live(self, now: float, since: float | None = None) -> NDArray[np.bool_]:
        """Which slots hold a bucket of the window ending at ``now`` (with ``since``, only
        from that time on)."""
        newest = self.bucket(now)
        oldest = newest - self.buckets + 1
        if since is not None:
            oldest = max(oldest, self.bucket(since))
        held = self._bucket_of_slot
        return (held >= oldest) & (held <= newest)


class WindowCounts:
    """Per time bucket: requests, hits, accesses and the worker's own hits; per sampled
    subtree (the key block that decided its requests) the same over the window, with the
    sums of their products kept up to date as requests come and buckets leave, so that
    reading the window costs the same however many subtrees it holds.

    With ``max_subtrees``, more subtrees than that in the window (the traffic's volume
    decides how many) make it forget those of fewest accesses (the oldest first among
    equals) down to seven eighths of it, counted in ``forgotten_subtrees``: the window's
    sums keep their requests, the interval and the regression are drawn over the
    subtrees kept. Up to the cap nothing is forgotten."""

    def __init__(self, window_s: float, buckets: int, max_subtrees: int | None = None) -> None:
        self.max_subtrees = max_subtrees
        self.forgotten_subtrees = 0
        self._ring = BucketRing(window_s, buckets)
        self._sums = np.zeros((buckets, 4))  # requests, hits, accesses, seen
        self._added: list[dict[int, list[int]]] = [{} for _ in range(buckets)]
        """Per bucket: each subtree's hits, accesses and seen added in it."""
        self._subtrees: dict[int, tuple[int, int, int]] = {}
        """Each subtree's hits, accesses and seen over the live buckets."""
        self._products = [0] * 6

    def add(self, ts: float, hits: int, accesses: int, seen: int, subtree: int) -> None:
        """One sampled request: its hits and accesses here, its prefix hits in the worker's
        own cache (``seen``), and the key block of its subtree."""
        slot = self._ring.slot(self._ring.bucket(ts), self._forget)
        if slot is None:
            return
        self._sums[slot] += (1.0, hits, accesses, seen)
        added = self._added[slot].get(subtree)
        if added is None:
            self._added[slot][subtree] = [hits, accesses, seen]
        else:
            added[0] += hits
            added[1] += accesses
            added[2] += seen
        self._move(subtree, hits, accesses, seen)
        if self.max_subtrees is not None and len(self._subtrees) > self.max_subtrees:
            self._forget_least_used(self.max_subtrees - self.max_subtrees // 8)

    def _forget_least_used(self, keep: int) -> None:
        """Forget all but the ``keep`` subtrees of most accesses in the window (among
        equals, the newest stay: the dict holds them in the order they came)."""
        ranked = sorted(self._subtrees, key=lambda subtree: self._subtrees[subtree][1])
        gone = ranked[: len(ranked) - keep]
        for subtree in gone:
            h, a, s = self._subtrees[subtree]
            self._move(subtree, -h, -a, -s)
            for added in self._added:
                added.pop(subtree, None)
        self.forgotten_subtrees += len(gone)

    def _move(self, subtree: int, hits: int, accesses: int, seen: int) -> None:
        """Add to ``subtree``'s sums over the window, and to the sums of their products."""
        h0, a0, s0 = self._subtrees.get(subtree, _NOTHING)
        h1, a1, s1 = h0 + hits, a0 + accesses, s0 + seen
        p = self._products  # hh, ha, hs, aa, as, ss
        p[0] += h1 * h1 - h0 * h0
        p[1] += h1 * a1 - h0 * a0
        p[2] += h1 * s1 - h0 * s0
        p[3] += a1 * a1 - a0 * a0
        p[4] += a1 * s1 - a0 * s0
        p[5] += s1 * s1 - s0 * s0
        if a1 > 0:
            self._subtrees[subtree] = (h1, a1, s1)
        else:
            self._subtrees.pop(subtree, None)

    def add_many(
        self, ts: NDArray[np.float64], hits: NDArray[np.int64], accesses: NDArray[np.int64]
    ) -> None:
        """Many requests at once: their counts only (no subtrees: no interval is drawn)."""
        buckets = (ts // self._ring.bucket_s).astype(np.int64)
        for bucket in np.unique(buckets).tolist():
            slot = self._ring.slot(bucket, self._forget)
            if slot is not None:
                mine = buckets == bucket
                self._sums[slot, :3] += (mine.sum(), hits[mine].sum(), accesses[mine].sum())

    def _forget(self, slot: int) -> None:
        """Take what ``slot``'s bucket added out of the window's sums."""
        for subtree, (h, a, s) in self._added[slot].items():
            self._move(subtree, -h, -a, -s)
        self._added[slot] = {}
        self._sums[slot] = 0.0

    def totals(self, now: float, since: float | None = None) -> Totals:
        """The sums of the window ending at ``now`` (add several workers' with ``+``);
        with ``since``, the requests' counts only from that time on (no subtrees)."""
        self._ring.expire(now, self._forget)
        live = self._ring.live(now, since)
        requests, hits, accesses, seen = self._sums[live].sum(axis=0).tolist()
        if since is not None:
            return Totals(requests, hits, accesses, seen)
        products = tuple(float(p) for p in self._products)
        return Totals(requests, hits, accesses, seen, len(self._subtrees), products)


class RunCounts:
    """A worker's runs of events over the sliding window, per time bucket: those that
    rebuilt into whole requests and those that did not (events lost on the way)."""

    def __init__(self, window_s: float, buckets: int) -> None:
        self._ring = BucketRing(window_s, buckets)
        self._counts = np.zeros((buckets, 2), dtype=np.int64)  # whole, incomplete

    def add(self, ts: float, whole: int, incomplete: int) -> None:
        slot = self._ring.slot(self._ring.bucket(ts), self._forget)
        if slot is not None:
            self._counts[slot] += (whole, incomplete)

    def _forget(self, slot: int) -> None:
        self._counts[slot] = 0

    def totals(self, now: float) -> tuple[int, int]:
        """Whole and incomplete runs of the window ending at ``now``."""
        whole, incomplete = self._counts[self._ring.live(now)].sum(axis=0).tolist()
        return int(whole), int(incomplete)


@dataclass(frozen=True)
class Totals:
    """Sums over sampled requests (count, hits, accesses, the worker's own hits) and over
    their subtrees (how many, and the sums of the products of each subtree's hits ``h``,
    accesses ``a`` and own hits ``s``: ``hh, ha, hs, aa, as, ss``)."""

    requests: float = 0.0
    hits: float = 0.0
    accesses: float = 0.0
    seen: float = 0.0
    subtrees: float = 0.0
    products: tuple[float, ...] = (0.0,) * 6

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

    @property
    def hit_ratio(self) -> float | None:
        """Hits over accesses (None: no access)."""
        return self.hits / self.accesses if self.accesses else None

    @property
    def seen_ratio(self) -> float | None:
        """The worker's own hits over these accesses (None: no access)."""
        return self.seen / self.accesses if self.accesses else None

    def estimate(self, seen_ratio: float | None = None) -> Estimate:
        """The hit ratio and its 95 % interval (no accesses: 0.0, with all of [0, 1]: no
        sample says nothing, not that nothing hits).

        With ``seen_ratio``, the worker's own hit ratio over *all* its requests, and at
        least ``MIN_REGRESSION_SUBTREES`` subtrees, it is the regression estimate: the
        sample's figure moved by ``beta`` times what the sample misses of the worker's own
        figure, ``beta`` fitted over the sampled subtrees (how this cache's hits per
        subtree follow the worker's). Which subtrees were drawn moves both figures
        together, so most of that error cancels. A move that would leave [0, 1] is not
        made. With fewer than two subtrees the interval is all of [0, 1].
        """
        n, h, a = self.subtrees, self.hits, self.accesses
        if a <= 0:
            return Estimate(0.0, 0.0, 1.0, 0, 0, int(self.requests))
        ratio, own = h / a, self.seen / a
        hh, ha, hs, aa, as_, ss = self.products
        # Per subtree, u = hits - ratio * accesses and v = seen - own * accesses.
        uu = hh - 2 * ratio * ha + ratio * ratio * aa
        vv = ss - 2 * own * as_ + own * own * aa
        uv = hs - ratio * as_ - own * ha + ratio * own * aa
        beta = 0.0
        if seen_ratio is not None and n >= MIN_REGRESSION_SUBTREES and vv > 1e-9 * max(ss, 1.0):
            beta = uv / vv
            if not 0.0 <= ratio + beta * (seen_ratio - own) <= 1.0:
                beta = 0.0
        value = ratio + beta * ((seen_ratio or 0.0) - own)
        fitted = 2 if beta else 1  # degrees of freedom the estimate takes
        if n <= fitted:
            return Estimate(value, 0.0, 1.0, int(h), int(a), int(self.requests), ratio)
        spread = max(uu - 2 * beta * uv + beta * beta * vv, 0.0)
        half = Z95 * math.sqrt(spread * n / (n - fitted)) / a
        low, high = max(value - half, 0.0), min(value + half, 1.0)
        return Estimate(value, low, high, int(h), int(a), int(self.requests), ratio)


MAX_SUBTREES = 4096
"""Sampled subtrees a shadow miniature's counts keep over the window, at most (about
375 bytes each, 20 miniatures a worker with the defaults: about 30 MB); far more than
the interval needs. Offline replay keeps all: its input is a local trace."""

_NOTHING = (0, 0, 0)
_EMPTY = np.iinfo(np.int64).min
"""A slot that holds no bucket (any real bucket, negative times' too, is above it)."""

MIN_REGRESSION_SUBTREES = 20
"""Fewer sampled subtrees than this fit ``beta`` too loosely: the sample's own figure is
served."""

"""Per-category reuse statistics over a sliding window: the fitter's input.

Owns ``ReuseStats`` (ingest of columnar access events) and ``StatsSnapshot`` (its frozen
summary at one instant). It must never do I/O, fit anything, or keep one entry per block or
per event: memory is ``buckets x categories x gap bins`` counters, whatever the traffic.

Every access opens an *exposure*: the block may be reused later. An event that names the
block's previous access (``prev_ts``, ``prev_category``) closes the exposure opened then and
is an observed reuse gap ``ts - prev_ts`` of ``prev_category``. Exposures still open at
snapshot time are right-censored at their age ``now - open time``.

Window: a ring of ``n_buckets`` time buckets by *open time*. Everything an access leads
to (its reuse, or its censoring) is booked in the bucket it was opened in, so when that
bucket leaves the window the access, its reuse and its censored exposure leave together
and the counts stay consistent (each in-window access is exactly one of: reused,
near-concurrent, open). A decayed (exponentially weighted) alternative was rejected: a
reuse would close a fractionally weighted exposure, and "what the fit saw" would have no
exact count to test.

Near-concurrent reuses (gap below ``near_concurrent_s``, e.g. many requests sharing a
system prompt in the same instant) are not reuse observations. They *merge* the earlier
access into the later one: the earlier exposure is closed without an observation and
counted in ``near_concurrent``; the later access opens the exposure that continues. So
the fitter sees access *episodes* whose reuse gaps are all ``>= near_concurrent_s``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from agent.wire import EventBatch, EventKind
from controlplane.traces.arrays import F64, I32, I64

_ACCESS_KINDS = np.array([EventKind.HIT, EventKind.INSERT], dtype=np.uint8)
_INT32_TOP = int(np.iinfo(np.int32).max)
_ONE32 = np.int32(1)
"""A typed increment: ``np.add.at`` into int32 with a Python int takes a slow casting
path (about 30 times slower)."""


def gap_edges(max_s: float, *, min_s: float = 1e-3, per_decade: int = 20) -> F64:
    """Bin edges of reuse gaps and exposure ages: ``0``, then log-spaced from ``min_s`` to
    at least ``max_s`` (``per_decade`` bins per factor of 10), then ``inf``.

    20 bins per decade keeps neighbouring edges 12 % apart, finer than the fit can tell.
    """
    if not (0 < min_s < max_s) or per_decade < 1:
        raise ValueError("need 0 < min_s < max_s and per_decade >= 1")
    n = int(np.ceil(np.log10(max_s / min_s) * per_decade - 1e-9))
    inner = min_s * 10.0 ** (np.arange(n + 1) / per_decade)
    return np.concatenate(([0.0], inner, [np.inf]))


def window_edges(window_s: float, n_buckets: int, min_gap_s: float, bins_per_decade: int) -> F64:
    """Gap edges of a window: from ``min_gap_s`` to its length plus one bucket (the oldest
    open exposure's age)."""
    reach = window_s + window_s / n_buckets
    return gap_edges(max(reach, min_gap_s * 10), min_s=min_gap_s, per_decade=bins_per_decade)


def category_capacity(categories: int) -> int:
    """Categories a window's counters have room for when it holds ``categories``: the next
    power of two, at least 8 (grown by doubling, so a window bounded to ``n`` categories
    never holds room for more than this, whatever order they came and left in)."""
    return max(8, 1 << max(categories - 1, 0).bit_length())


def counter_bytes(
    window_s: float,
    n_buckets: int,
    categories: int,
    *,
    min_gap_s: float = 1e-3,
    bins_per_decade: int = 20,
) -> int:
    """Bytes the counters of a ``ReuseStats`` of this shape hold once it holds
    ``categories`` categories (``ReuseStats.nbytes`` then): per bucket and category room,
    two int64 counts and one int32 per gap bin; per bucket two int64. A snapshot or a
    checkpoint copies the buckets it reads, briefly about as much again. The Helm chart
    repeats this arithmetic (helm/kvwise/templates/_window.tpl) to refuse at install what
    the controller's settings refuse; tests/integration/test_helm_window_bound.py holds
    the two equal."""
    edges = window_edges(window_s, n_buckets, min_gap_s, bins_per_decade)
    per_cell = 2 * 8 + 4 * (len(edges) - 1)
    return n_buckets * (category_capacity(categories) * per_cell + 2 * 8)


def _frozen(a: NDArray[np.generic]) -> NDArray[np.generic]:
    a.flags.writeable = False
    return a


def _check_columns(
    ts: F64, cat: I64, pts: F64, pcat: I64, n_names: int, *, batch: str = ""
) -> None:
    """``ValueError`` naming the column, the first bad row and its value (after ``batch``,
    which names the batch), if any column of a batch is malformed: lengths differ, a
    timestamp is not finite (a previous one may be NaN, unknown, not infinite), a code is
    outside the ``n_names`` names."""
    for column, values in (("category", cat), ("prev_ts", pts), ("prev_category", pcat)):
        if len(values) != len(ts):
            raise ValueError(f"{batch}{column} has {len(values)} rows, ts {len(ts)}")
    checks = (
        ("ts", ts, ~np.isfinite(ts), "is not finite"),
        ("prev_ts", pts, np.isinf(pts), "is infinite (NaN means unknown)"),
        ("category", cat, (cat < 0) | (cat >= n_names), f"is out of range [0, {n_names})"),
        (
            "prev_category",
            pcat,
            (pcat < -1) | (pcat >= n_names),
            f"is out of range [-1, {n_names})",
        ),
    )
    for column, values, bad, what in checks:
        if bad.any():
            row = int(np.argmax(bad))
            shown = f"code {values[row]}" if values.dtype.kind == "i" else f"{values[row]}"
            raise ValueError(
                f"{batch}{column}: row {row} ({shown}) {what}; the batch is refused whole"
            )


@dataclass(frozen=True, eq=False)
class CategoryStats:
    """One category's row of a snapshot."""

    name: str
    observed: I64
    censored: F64
    accesses: int
    reuses: int
    near_concurrent: int

    @property
    def exposures(self) -> int:
        """Access episodes the fit sees: reused or still open."""
        return self.accesses - self.near_concurrent


@dataclass(frozen=True, eq=False)
class StatsSnapshot:
    """Reuse statistics of the accesses opened in ``[now - window_s, now]``, per category.

    Row ``c`` of each ``[C, B]`` array is category ``categories[c]``; column ``j`` is the
    gap (or age) interval ``[edges[j], edges[j + 1])``. ``observed`` counts reuse gaps,
    ``censored`` the still-open exposures by age (fractional: a bucket's open exposures are
    spread uniformly over its age range). ``accesses = reuses + near_concurrent + open``.
    Arrays are read-only.
    """

    now: float
    window_s: float
    near_concurrent_s: float
    categories: tuple[str, ...]
    edges: F64
    observed: I64
    censored: F64
    accesses: I64
    reuses: I64
    near_concurrent: I64
    dropped: int = 0
    """Events ignored since the stats began: opened outside the window, reuses of an
    access this window never saw, reuses dated before the access they reuse, or past a
    full gap counter (2**31 - 1 in one bucket, category and bin)."""

    def __post_init__(self) -> None:
        for a in (self.edges, self.observed, self.censored):
            _frozen(a)
        for a in (self.accesses, self.reuses, self.near_concurrent):
            _frozen(a)

    @property
    def total_accesses(self) -> int:
        return int(self.accesses.sum())

    def index(self, name: str) -> int:
        return self.categories.index(name)

    def of(self, name: str) -> CategoryStats:
        """The row of category ``name`` (``ValueError`` if unknown)."""
        c = self.index(name)
        return CategoryStats(
            name=name,
            observed=self.observed[c],
            censored=self.censored[c],
            accesses=int(self.accesses[c]),
            reuses=int(self.reuses[c]),
            near_concurrent=int(self.near_concurrent[c]),
        )


@dataclass(frozen=True, eq=False)
class WindowState:
    """Everything a ``ReuseStats`` counts, compactly: only the buckets inside the window and
    the categories that hold a count (for checkpoints; ``ReuseStats.restore`` restores).

    ``accesses``/``near_concurrent`` are ``[S, C]`` and ``gaps`` ``[S, C, B]`` for the
    ``S`` buckets ``bucket_ids`` and the ``C`` categories ``names``.
    """

    window_s: float
    near_concurrent_s: float
    n_buckets: int
    edges: F64
    names: tuple[str, ...]
    bucket_ids: I64
    accesses: I64
    near_concurrent: I64
    gaps: I32
    head: int | None
    origin: float | None
    dropped: int


class ReuseStats:
    """Sliding-window reuse counters fed with columnar access events (not thread-safe).

    ``window_s`` is split into ``n_buckets`` buckets; the window slides a bucket at a time,
    so it holds between ``window_s - window_s / n_buckets`` and ``window_s`` seconds of
    accesses. Gap bins span ``min_gap_s`` to the window length (see ``gap_edges``).
    ``origin`` is the time the stats start counting (default: the earliest event of the
    first batch); events before it and reuses of accesses before it are dropped.
    """

    def __init__(
        self,
        window_s: float,
        *,
        near_concurrent_s: float = 0.0,
        n_buckets: int = 120,
        categories: Sequence[str] = (),
        min_gap_s: float = 1e-3,
        bins_per_decade: int = 20,
        origin: float | None = None,
    ) -> None:
        if window_s <= 0 or n_buckets < 1 or near_concurrent_s < 0:
            raise ValueError("need window_s > 0, n_buckets >= 1, near_concurrent_s >= 0")
        self.window_s = float(window_s)
        self.near_concurrent_s = float(near_concurrent_s)
        self.n_buckets = n_buckets
        self.bucket_s = self.window_s / n_buckets
        self.edges = window_edges(self.window_s, n_buckets, min_gap_s, bins_per_decade)
        self._names: list[str] = []
        self._codes: dict[str, int] = {}
        self._cap = 0
        k, b = n_buckets, len(self.edges) - 1
        self._slot_bucket = np.full(k, np.iinfo(np.int64).min, dtype=np.int64)
        self._acc = np.zeros((k, 0), dtype=np.int64)
        self._near = np.zeros((k, 0), dtype=np.int64)
        # int32: one bucket x category x bin would need 2**31 reuses to overflow (and
        # saturates then, ``_book_gaps``).
        self._gaps = np.zeros((k, 0, b), dtype=np.int32)
        self._slot_reuses = np.zeros(k, dtype=np.int64)
        """Reuse gaps booked in each bucket, all cells together: a bound on each cell."""
        self._head: int | None = None  # newest bucket seen
        # Accesses before the origin are not counted, and nor are reuses of them: their
        # exposures were never opened here. Fixed once set, so the batch order cannot matter.
        self._origin = -np.inf if origin is None else float(origin)
        self._origin_set = origin is not None
        self.dropped = 0
        for name in categories:
            self.code(name)

    # --- category table ------------------------------------------------------------------
    @property
    def categories(self) -> tuple[str, ...]:
        return tuple(self._names)

    def code(self, name: str) -> int:
        """Code of category ``name``, added to the table if new."""
        c = self._codes.get(name)
        if c is None:
            c = len(self._names)
            self._names.append(name)
            self._codes[name] = c
            self._ensure_capacity(c + 1)
        return c

    def _ensure_capacity(self, n: int) -> None:
        if n <= self._cap:
            return
        cap = category_capacity(n)
        k, b = self.n_buckets, self._gaps.shape[2]
        for attr, shape, dtype in (
            ("_acc", (k, cap), np.int64),
            ("_near", (k, cap), np.int64),
            ("_gaps", (k, cap, b), np.int32),
        ):
            new = np.zeros(shape, dtype=dtype)
            old = getattr(self, attr)
            new[:, : self._cap] = old
            setattr(self, attr, new)
        self._cap = cap

    def nbytes(self) -> int:
        """Memory held by the counters: buckets x categories x bins, never per block."""
        held = (self._slot_bucket, self._slot_reuses, self._acc, self._near, self._gaps)
        return sum(a.nbytes for a in held)

    def forget_unused(self) -> int:
        """Drop the categories no bucket inside the window counts any more (their codes
        change; names stay the key); returns how many were dropped. A category that comes
        back later starts again from nothing, as it would after leaving the window."""
        c = len(self._names)
        slots = self._live_slots()
        used = (
            self._acc[slots, :c].any(axis=0)
            | self._near[slots, :c].any(axis=0)
            | self._gaps[slots, :c, :].any(axis=(0, 2))
        )
        if used.all():
            return 0
        keep = np.flatnonzero(used)
        self._names = [self._names[i] for i in keep]
        self._codes = {name: i for i, name in enumerate(self._names)}
        self._cap = category_capacity(len(keep))
        for attr in ("_acc", "_near", "_gaps"):
            old = getattr(self, attr)
            new = np.zeros((old.shape[0], self._cap, *old.shape[2:]), dtype=old.dtype)
            new[:, : len(keep)] = old[:, keep]
            setattr(self, attr, new)
        return int(c - len(keep))

    def _live_slots(self) -> I64:
        if self._head is None:
            return np.zeros(0, dtype=np.int64)
        return np.flatnonzero(self._slot_bucket > self._head - self.n_buckets)

    def state(self) -> WindowState:
        """The counts inside the window, compactly (see ``WindowState``)."""
        c = len(self._names)
        slots = self._live_slots()
        return WindowState(
            window_s=self.window_s,
            near_concurrent_s=self.near_concurrent_s,
            n_buckets=self.n_buckets,
            edges=self.edges.copy(),
            names=tuple(self._names),
            bucket_ids=self._slot_bucket[slots].copy(),
            accesses=self._acc[slots, :c].copy(),
            near_concurrent=self._near[slots, :c].copy(),
            gaps=self._gaps[slots, :c, :].copy(),
            head=self._head,
            origin=self._origin if self._origin_set else None,
            dropped=self.dropped,
        )

    def restore(self, state: WindowState) -> None:
        """Replace everything counted by ``state`` (an empty window's own ``state()`` or a
        checkpoint). ``ValueError`` if it was taken with another window shape or edges."""
        same = (
            state.window_s == self.window_s
            and state.near_concurrent_s == self.near_concurrent_s
            and state.n_buckets == self.n_buckets
            and np.array_equal(state.edges, self.edges)
        )
        if not same:
            raise ValueError("the state was taken with other window settings")
        k, b = self.n_buckets, self._gaps.shape[2]
        self._names, self._codes, self._cap = [], {}, 0
        self._acc = np.zeros((k, 0), dtype=np.int64)
        self._near = np.zeros((k, 0), dtype=np.int64)
        self._gaps = np.zeros((k, 0, b), dtype=np.int32)
        self._ensure_capacity(len(state.names))
        for name in state.names:
            self.code(name)
        c, slots = len(state.names), state.bucket_ids % self.n_buckets
        self._slot_bucket[:] = np.iinfo(np.int64).min
        self._slot_bucket[slots] = state.bucket_ids
        for attr in ("_acc", "_near", "_gaps"):
            getattr(self, attr)[:] = 0
        self._acc[slots, :c] = state.accesses
        self._near[slots, :c] = state.near_concurrent
        self._gaps[slots, :c, :] = state.gaps
        self._slot_reuses[:] = self._gaps.sum(axis=(1, 2), dtype=np.int64)
        self._head = state.head
        self._origin_set = state.origin is not None
        self._origin = -np.inf if state.origin is None else float(state.origin)
        self.dropped = state.dropped

    # --- ingest --------------------------------------------------------------------------
    def ingest_batch(self, batch: EventBatch) -> None:
        """Ingest the access events (hits, inserts) of a decoded wire batch; a bad one is
        refused whole, the error naming it and the row as sent (checked once, whole:
        its access events are then a part of what was checked)."""
        cat, pcat = batch.category.astype(np.int64), batch.prev_category.astype(np.int64)
        _check_columns(
            batch.ts,
            cat,
            batch.prev_ts,
            pcat,
            len(batch.categories),
            batch=f"batch {batch.seq} of worker {batch.worker!r}: ",
        )
        keep = np.isin(batch.kind, _ACCESS_KINDS)
        self._apply(batch.ts[keep], cat[keep], batch.prev_ts[keep], pcat[keep], batch.categories)

    def ingest(
        self,
        ts: F64,
        category: I32,
        prev_ts: F64,
        prev_category: I32,
        *,
        names: Sequence[str] | None = None,
    ) -> None:
        """Apply access events given as columns. Their order within a batch does not
        matter, nor across batches for events still inside the window when they arrive.

        ``category``/``prev_category`` are codes into ``names`` when given (remapped to
        this object's table), else into ``self.categories``. ``prev_ts`` is NaN and
        ``prev_category`` -1 where the sender does not know the block's previous access.
        A malformed batch raises ``ValueError`` naming the column and the row, and is
        refused whole: nothing of it is counted, none of its names added.
        """
        ts = np.asarray(ts, dtype=np.float64)
        cat = np.asarray(category, dtype=np.int64)
        pts = np.asarray(prev_ts, dtype=np.float64)
        pcat = np.asarray(prev_category, dtype=np.int64)
        # The whole batch is checked before anything changes: a refused one adds nothing,
        # not even its names.
        _check_columns(ts, cat, pts, pcat, len(self._names) if names is None else len(names))
        self._apply(ts, cat, pts, pcat, names)

    def _apply(self, ts: F64, cat: I64, pts: F64, pcat: I64, names: Sequence[str] | None) -> None:
        """``ingest``'s work on columns ``_check_columns`` has passed."""
        if len(ts) == 0:
            return
        cat, pcat = self._remap(cat, pcat, names)
        if not self._origin_set:
            self._origin, self._origin_set = float(ts.min()), True
        bucket = np.floor(ts / self.bucket_s).astype(np.int64)
        self._advance(int(bucket.max()))
        self._open(bucket, cat, ts >= self._origin)
        self._close(ts, pts, pcat)

    def _remap(self, cat: I64, pcat: I64, names: Sequence[str] | None) -> tuple[I64, I64]:
        """Codes into ``names`` (checked by ``_check_columns``) as codes of this table."""
        if names is None:
            return cat, pcat
        table = np.array([self.code(n) for n in names], dtype=np.int64)
        return table[cat], np.where(pcat >= 0, table[np.maximum(pcat, 0)], -1)

    def _advance(self, newest: int) -> None:
        """Move the ring's head to bucket ``newest``, clearing the buckets it overwrites."""
        if self._head is not None and newest <= self._head:
            return
        start = newest - self.n_buckets + 1
        if self._head is not None:
            start = max(start, self._head + 1)
        ids = np.arange(start, newest + 1, dtype=np.int64)
        slots = ids % self.n_buckets
        self._slot_bucket[slots] = ids
        self._acc[slots] = 0
        self._near[slots] = 0
        self._gaps[slots] = 0
        self._slot_reuses[slots] = 0
        self._head = newest

    def _live(self, bucket: I64) -> NDArray[np.bool_]:
        """Whether each bucket id is held by the ring (inside the current window)."""
        assert self._head is not None
        return bucket > self._head - self.n_buckets

    def _open(self, bucket: I64, cat: I64, after_origin: NDArray[np.bool_]) -> None:
        live = self._live(bucket) & after_origin
        self.dropped += int(len(bucket) - live.sum())
        slot = bucket[live] % self.n_buckets
        np.add.at(self._acc.reshape(-1), slot * self._cap + cat[live], 1)

    def _close(self, ts: F64, pts: F64, pcat: I64) -> None:
        known = (pcat >= 0) & ~np.isnan(pts)
        if not known.any():
            return
        ts, pts, pcat = ts[known], pts[known], pcat[known]
        pbucket = np.floor(pts / self.bucket_s).astype(np.int64)
        head = self._head
        assert head is not None
        # The access must be one this window opened: in a live bucket, not before the
        # origin, not in a bucket the ring has not reached; and not after the event that
        # reuses it (a sender's clock stepped back: no gap was observed, it stays open).
        ok = self._live(pbucket) & (pts >= self._origin) & (pbucket <= head) & (pts <= ts)
        self.dropped += int(len(ok) - ok.sum())
        gap = ts[ok] - pts[ok]
        cell = (pbucket[ok] % self.n_buckets) * self._cap + pcat[ok]
        near = gap < self.near_concurrent_s
        np.add.at(self._near.reshape(-1), cell[near], 1)
        b = self._gaps.shape[2]
        gbin = np.searchsorted(self.edges, gap[~near], side="right") - 1
        slot = pbucket[ok][~near] % self.n_buckets
        self._book_gaps(slot, cell[~near] * b + np.minimum(gbin, b - 1))

    def _book_gaps(self, slot: I64, flat: I64) -> None:
        """Count one reuse gap in each cell ``flat`` of ``_gaps`` (bucket ``slot``). A cell
        never passes int32's largest value: the reuses past it are dropped and counted.
        ``_slot_reuses`` bounds every cell of a bucket, so the exact check runs only while a
        bucket could overflow."""
        self._slot_reuses += np.bincount(slot, minlength=self.n_buckets)
        gaps = self._gaps.reshape(-1)
        if not (self._slot_reuses > _INT32_TOP).any():
            np.add.at(gaps, flat, _ONE32)
            return
        cells, adds = np.unique(flat, return_counts=True)
        total = gaps[cells].astype(np.int64) + adds
        self.dropped += int(np.maximum(total - _INT32_TOP, 0).sum())
        gaps[cells] = np.minimum(total, _INT32_TOP)

    # --- snapshot ------------------------------------------------------------------------
    def snapshot(self, now: float) -> StatsSnapshot:
        """Frozen summary of the accesses opened in the window ending at ``now``."""
        c = len(self._names)
        # Buckets newer than ``now`` (a sender's clock ahead) stay in, at age 0.
        newest = int(np.floor(now / self.bucket_s))
        slots = np.flatnonzero(self._slot_bucket > newest - self.n_buckets)
        acc = self._acc[slots, :c]
        near = self._near[slots, :c]
        gaps = self._gaps[slots, :c, :]
        per_slot_reuses = gaps.sum(axis=2, dtype=np.int64)
        open_ = np.maximum(acc - near - per_slot_reuses, 0)
        spread = self._age_spread(self._slot_bucket[slots], now)
        return StatsSnapshot(
            now=float(now),
            window_s=self.window_s,
            near_concurrent_s=self.near_concurrent_s,
            categories=tuple(self._names),
            edges=self.edges.copy(),
            observed=gaps.sum(axis=0, dtype=np.int64),
            censored=open_.T.astype(np.float64) @ spread,
            accesses=acc.sum(axis=0),
            reuses=per_slot_reuses.sum(axis=0),
            near_concurrent=near.sum(axis=0),
            dropped=self.dropped,
        )

    def _age_spread(self, bucket_ids: I64, now: float) -> F64:
        """``[S, B]``: share of a bucket's open exposures in each age bin, assuming their
        open times are uniform over the bucket (ages clipped at 0 for the current one)."""
        hi = np.maximum(now - bucket_ids * self.bucket_s, 0.0)
        lo = np.maximum(hi - self.bucket_s, 0.0)
        e_lo, e_hi = self.edges[:-1], self.edges[1:]
        overlap = np.clip(
            np.minimum(hi[:, None], e_hi[None, :]) - np.maximum(lo[:, None], e_lo[None, :]),
            0.0,
            None,
        )
        width = (hi - lo)[:, None]
        out: F64 = np.divide(overlap, width, out=np.zeros_like(overlap), where=width > 0)
        # A zero-width range (bucket opening exactly at now) is a point at its age.
        point = width[:, 0] <= 0
        if point.any():
            j = np.searchsorted(self.edges, hi[point], side="right") - 1
            out[np.flatnonzero(point), np.minimum(j, len(e_lo) - 1)] = 1.0
        return out

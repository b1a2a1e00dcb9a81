"""The controller's live statistics window and what it admits into it.

Owns the ``ReuseStats`` window behind one lock, and the rules that keep one worker from
spoiling it for all: events whose time is outside ``clock_tolerance_s`` of the controller's
clock are dropped and counted (a clock hours ahead would otherwise slide the window into the
future and starve every refit); only the categories a batch actually uses join the window,
at most ``max_categories_per_worker`` brought by any one worker and ``max_categories`` in
all (a batch over a limit is refused whole, for the dead-letter stream, with the reason);
categories no bucket counts any more age out. It must never talk to Redis or decode wire
data.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from agent.wire import EventBatch, EventKind
from controlplane.fit.reuse_window import ReuseStats, StatsSnapshot, WindowState

_ACCESS_KINDS = np.array([EventKind.HIT, EventKind.INSERT], dtype=np.uint8)


class BatchRefused(ValueError):
    """A batch the window will not take; the message says which limit, for a dead letter."""


@dataclass(frozen=True)
class WindowLimits:
    clock_tolerance_s: float
    max_categories: int
    max_categories_per_worker: int


class LiveWindow:
    """``ReuseStats`` plus admission, safe to call from ingest, refit and checkpoint threads."""

    def __init__(self, stats: ReuseStats, limits: WindowLimits) -> None:
        self.stats = stats
        self.limits = limits
        self._lock = threading.Lock()
        self._brought_by: dict[str, str] = {}
        """Category -> the worker whose batch brought it into the window."""
        self._brought: Counter[str] = Counter()
        self.revision = 0
        """Moves whenever the evidence does (accesses added, a checkpoint restored): a refit
        at the revision of the last one has nothing new to fit."""

    def apply(self, batch: EventBatch, now: float) -> int:
        """Add ``batch``'s accesses; returns the events dropped for their clock. Raises
        ``BatchRefused`` (nothing added) if its categories would break a limit."""
        tol = self.limits.clock_tolerance_s
        in_time = self._in_time(batch, now)
        rejected = int(len(batch) - np.count_nonzero(in_time))
        keep = in_time & np.isin(batch.kind, _ACCESS_KINDS)
        ts, cat = batch.ts[keep], batch.category[keep]
        prev_ts, prev_cat = batch.prev_ts[keep], batch.prev_category[keep].copy()
        prev_cat[prev_ts > now + tol] = -1  # a previous access "in the future" is unknown
        used = np.unique(np.concatenate([cat, prev_cat[prev_cat >= 0]]))
        remap = np.full(len(batch.categories) + 1, -1, dtype=np.int32)
        remap[used] = np.arange(len(used), dtype=np.int32)
        names = [batch.categories[i] for i in used.tolist()]
        with self._lock:
            self._admit_categories(batch.worker, names)
            self.stats.ingest(ts, remap[cat], prev_ts, remap[prev_cat], names=names)
            self.revision += len(ts)
        return rejected

    def timely(self, batch: EventBatch, now: float) -> EventBatch:
        """``batch`` less the events ``apply`` drops for their clock (what the shadow may
        see: one worker's skewed clock must not move time for every worker there)."""
        return batch.where(self._in_time(batch, now))

    def _in_time(self, batch: EventBatch, now: float) -> NDArray[np.bool_]:
        """Events within ``clock_tolerance_s`` of ``now``, or of the window's start."""
        tol = self.limits.clock_tolerance_s
        return (batch.ts <= now + tol) & (batch.ts >= now - self.stats.window_s - tol)

    def _admit_categories(self, worker: str, names: list[str]) -> None:
        """Count ``names`` new to the window as brought by ``worker``; a batch over a limit
        first ages out what no bucket counts (that may free the worker's share too, and
        make a name it had brought new again), then is refused if still over."""
        new = [n for n in names if n not in self._brought_by]
        if new and self._over_limit(worker, new) and self._age_out():
            new = [n for n in names if n not in self._brought_by]
        if not new:
            return
        lim = self.limits
        if self._brought[worker] + len(new) > lim.max_categories_per_worker:
            raise BatchRefused(
                f"categories: worker {worker!r} brought {self._brought[worker]} categories "
                f"into the window; {len(new)} more would pass max_categories_per_worker "
                f"({lim.max_categories_per_worker})"
            )
        if len(self._brought_by) + len(new) > lim.max_categories:
            raise BatchRefused(
                f"categories: the window holds {len(self._brought_by)} categories; "
                f"{len(new)} more would pass max_categories ({lim.max_categories})"
            )
        for name in new:
            self._brought_by[name] = worker
        self._brought[worker] += len(new)

    def _over_limit(self, worker: str, new: list[str]) -> bool:
        """Whether ``new`` categories brought by ``worker`` pass either limit."""
        lim = self.limits
        return (
            self._brought[worker] + len(new) > lim.max_categories_per_worker
            or len(self._brought_by) + len(new) > lim.max_categories
        )

    def age_out(self) -> int:
        """Forget the categories no bucket of the window counts any more; returns how many."""
        with self._lock:
            return self._age_out()

    def _age_out(self) -> int:
        gone = self.stats.forget_unused()
        if gone:
            kept = set(self.stats.categories)
            for name in [n for n in self._brought_by if n not in kept]:
                self._brought[self._brought_by.pop(name)] -= 1
            self._brought = +self._brought  # workers who bring none leave (worker churn)
        return gone

    @property
    def categories(self) -> int:
        return len(self._brought_by)

    def snapshot(self, now: float) -> StatsSnapshot:
        with self._lock:
            return self.stats.snapshot(now)

    def state(self) -> WindowState:
        with self._lock:
            return self.stats.state()

    def restore(self, state: WindowState) -> None:
        """Load a checkpoint (``ValueError`` if it does not fit this window); the categories
        it holds count as brought by nobody in particular."""
        with self._lock:
            before = self.stats.state()
            try:
                self.stats.restore(state)
            except Exception:
                self.stats.restore(before)  # all or nothing
                raise
            self._brought_by = dict.fromkeys(state.names, "")
            self._brought = Counter({"": len(state.names)})
            self.revision += 1

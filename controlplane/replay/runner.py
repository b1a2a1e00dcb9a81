"""Runs a policy x capacity matrix on one trace, in parallel processes when cores allow.

Owns scheduling and progress reporting of replay jobs, and which requests a run scores
(all of them, or in split mode only those after the fitted part: ``ReplayOptions``).
Workers are forked after the trace is loaded, so they share its arrays copy-on-write
instead of reloading the file. It must never print; callers render progress and results.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from controlplane.replay import catalog
from controlplane.replay.engine import CategoryResult, ReplayResult, replay_hits, summarize
from controlplane.replay.options import DEFAULT_OPTIONS, ReplayOptions
from controlplane.traces.model import Trace


@dataclass(frozen=True)
class ReplayJob:
    policy: str
    capacity: int


ProgressSink = Callable[[ReplayJob, int], None]
"""Receives (job, requests done so far)."""

_TRACE: Trace | None = None  # set in the parent before forking workers
_QUEUE: Any = None
_OPTIONS: ReplayOptions = DEFAULT_OPTIONS


def run_one(
    trace: Trace,
    job: ReplayJob,
    progress: Callable[[int], None] | None = None,
    options: ReplayOptions = DEFAULT_OPTIONS,
) -> ReplayResult:
    """Replay one job; its hit ratio counts requests from ``options.first_scored`` on."""
    policy = catalog.create(job.policy, job.capacity, trace, options)
    t0 = time.perf_counter()
    hits = replay_hits(trace, policy, job.capacity, progress=progress)
    seconds = time.perf_counter() - t0
    return summarize_from(trace, job, hits, options.first_scored(trace), seconds)


def summarize_from(
    trace: Trace, job: ReplayJob, hits: Any, start: int, seconds: float
) -> ReplayResult:
    """``summarize`` over requests ``start..`` only (all of them when ``start`` is 0)."""
    full = summarize(trace, job.policy, job.capacity, hits, seconds)
    if start == 0:
        return full
    lengths, cats = trace.lengths[start:], trace.categories[start:]
    k = len(trace.category_names)
    cat_hits = np.bincount(cats, weights=hits[start:], minlength=k)
    cat_acc = np.bincount(cats, weights=lengths, minlength=k)
    return replace(
        full,
        hits=int(hits[start:].sum()),
        accesses=int(lengths.sum()),
        per_category={
            name: CategoryResult(int(cat_hits[i]), int(cat_acc[i]))
            for i, name in enumerate(trace.category_names)
            if cat_acc[i] > 0
        },
    )


def _worker(job: ReplayJob) -> ReplayResult:
    assert _TRACE is not None
    queue = _QUEUE

    def progress(done: int) -> None:
        if queue is not None:
            queue.put((job, done))

    return run_one(_TRACE, job, progress, _OPTIONS)


def default_jobs() -> int:
    return max(
        1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    )


def run_matrix(
    trace: Trace,
    policies: Sequence[str],
    capacities: Sequence[int],
    *,
    jobs: int | None = None,
    progress: ProgressSink | None = None,
    options: ReplayOptions = DEFAULT_OPTIONS,
) -> list[ReplayResult]:
    """Replay every policy at every capacity; results in (policy, capacity) order.

    ``options`` reach every policy factory and decide the scored requests. Unknown policy
    names fail before any work starts.
    """
    for name in policies:
        catalog.factory(name)
    matrix = [ReplayJob(p, c) for p in policies for c in capacities]
    jobs = min(jobs or default_jobs(), len(matrix))
    if jobs <= 1 or "fork" not in mp.get_all_start_methods():
        return [run_one(trace, job, _bind(progress, job), options) for job in matrix]
    global _TRACE, _QUEUE, _OPTIONS
    ctx = mp.get_context("fork")
    _TRACE = trace
    _OPTIONS = options
    _QUEUE = ctx.Queue() if progress else None
    results: dict[ReplayJob, ReplayResult] = {}
    try:
        with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
            pending = {pool.submit(_worker, job): job for job in matrix}
            while pending:
                # Wake at least every 0.2 s to forward worker progress to the caller.
                done, _ = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                _drain(progress)
                for f in done:
                    results[pending.pop(f)] = f.result()
    finally:
        _TRACE = None
        _QUEUE = None
        _OPTIONS = DEFAULT_OPTIONS
    return [results[job] for job in matrix]


def _bind(progress: ProgressSink | None, job: ReplayJob) -> Callable[[int], None] | None:
    if progress is None:
        return None
    sink = progress
    return lambda done: sink(job, done)


def _drain(progress: ProgressSink | None) -> None:
    if progress is None or _QUEUE is None:
        return
    while True:
        try:
            job, done = _QUEUE.get_nowait()
        except Exception:  # queue.Empty; multiprocessing re-exports it oddly
            return
        progress(job, done)

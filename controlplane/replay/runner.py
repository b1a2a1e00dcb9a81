"""Runs a policy x capacity matrix on one trace, in parallel processes when cores allow.

Owns scheduling and progress reporting of replay jobs. Workers are forked after the trace
is loaded, so they share its arrays copy-on-write instead of reloading the file. It must
never print; callers render progress and results.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

from controlplane.replay import catalog
from controlplane.replay.engine import ReplayResult, replay_hits, summarize
from controlplane.traces.model import Trace


@dataclass(frozen=True)
class ReplayJob:
    policy: str
    capacity: int


ProgressSink = Callable[[ReplayJob, int], None]
"""Receives (job, requests done so far)."""

_TRACE: Trace | None = None  # set in the parent before forking workers
_QUEUE: Any = None


def run_one(
    trace: Trace, job: ReplayJob, progress: Callable[[int], None] | None = None
) -> ReplayResult:
    policy = catalog.create(job.policy, job.capacity, trace)
    t0 = time.perf_counter()
    hits = replay_hits(trace, policy, job.capacity, progress=progress)
    return summarize(trace, job.policy, job.capacity, hits, time.perf_counter() - t0)


def _worker(job: ReplayJob) -> ReplayResult:
    assert _TRACE is not None
    queue = _QUEUE

    def progress(done: int) -> None:
        if queue is not None:
            queue.put((job, done))

    return run_one(_TRACE, job, progress)


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
) -> list[ReplayResult]:
    """Replay every policy at every capacity; results in (policy, capacity) order.

    Unknown policy names fail before any work starts.
    """
    for name in policies:
        catalog.factory(name)
    matrix = [ReplayJob(p, c) for p in policies for c in capacities]
    jobs = min(jobs or default_jobs(), len(matrix))
    if jobs <= 1 or "fork" not in mp.get_all_start_methods():
        return [run_one(trace, job, _bind(progress, job)) for job in matrix]
    global _TRACE, _QUEUE
    ctx = mp.get_context("fork")
    _TRACE = trace
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

"""Runs a policy x capacity matrix on one trace, in parallel processes when cores allow.

Owns scheduling and progress reporting of replay jobs, and which requests a run scores
(all of them, or in split mode only those after the fitted part: ``ReplayOptions``).
Jobs run in forked workers that share the loaded trace (``controlplane.replay.pool``).
It must never print; callers render progress and results.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from controlplane.replay import catalog
from controlplane.replay.engine import (
    CategoryResult,
    ExplainsRun,
    ReplayResult,
    replay_hits,
    summarize,
)
from controlplane.replay.options import DEFAULT_OPTIONS, ReplayOptions
from controlplane.replay.pool import JobProgress, run_jobs
from controlplane.traces.model import Trace


@dataclass(frozen=True)
class ReplayJob:
    """One policy at one capacity (``kvwise simulate`` runs the same jobs)."""

    policy: str
    capacity: int


ProgressSink = Callable[[ReplayJob, int], None]
"""Receives (job, requests done so far)."""


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
    result = summarize_from(trace, job, hits, options.first_scored(trace), seconds)
    if isinstance(policy, ExplainsRun):
        result = replace(result, notes=policy.run_notes())
    return result


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


def policy_matrix(policies: Sequence[str], capacities: Sequence[int]) -> list[ReplayJob]:
    """Every policy at every capacity, in (policy, capacity) order; unknown policy names
    fail here, before any work starts."""
    for name in policies:
        catalog.factory(name)
    return [ReplayJob(p, c) for p in policies for c in capacities]


def run_matrix(
    trace: Trace,
    policies: Sequence[str],
    capacities: Sequence[int],
    *,
    jobs: int | None = None,
    progress: ProgressSink | None = None,
    options: ReplayOptions = DEFAULT_OPTIONS,
    finished: Callable[[ReplayJob], None] | None = None,
) -> list[ReplayResult]:
    """Replay every policy at every capacity; results in (policy, capacity) order.

    ``options`` reach every policy factory and decide the scored requests; ``finished``
    hears of each job once its result is in. Unknown policy names fail before any work
    starts.
    """
    matrix = policy_matrix(policies, capacities)

    def one(job: ReplayJob, report: JobProgress | None) -> ReplayResult:
        return run_one(trace, job, report, options)

    return run_jobs(matrix, one, workers=jobs, progress=progress, finished=finished)

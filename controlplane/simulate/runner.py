"""Runs a policy x capacity matrix of simulations on one trace, in parallel when cores allow.

Owns the jobs of ``kvwise simulate`` and their progress; the pool is the replay's
(``controlplane.replay.pool``). Unknown policy names fail before any work starts. It
must never print.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from controlplane.replay.pool import JobProgress, run_jobs
from controlplane.replay.runner import ReplayJob, policy_matrix
from controlplane.simulate.engine import UNBOUNDED, SimOptions, simulate
from controlplane.simulate.report import SimResult, summarize
from controlplane.traces.model import Trace

SimJob = ReplayJob
"""One policy at one capacity."""

ProgressSink = Callable[[SimJob, int], None]
"""Receives (job, requests arrived so far)."""


def run_one(
    trace: Trace, job: SimJob, options: SimOptions, progress: JobProgress | None = None
) -> SimResult:
    t0 = time.perf_counter()
    work, out = simulate(trace, job.policy, job.capacity, options, progress=progress)
    return summarize(job.policy, job.capacity, work, out, trace.lengths, time.perf_counter() - t0)


def run_matrix(
    trace: Trace,
    policies: Sequence[str],
    capacities: Sequence[int],
    options: SimOptions,
    *,
    jobs: int | None = None,
    progress: ProgressSink | None = None,
    finished: Callable[[SimJob], None] | None = None,
) -> list[SimResult]:
    """Every policy at every capacity; results in (policy, capacity) order. A policy
    without a size (``inf``) runs once, its result given for every capacity. ``finished``
    hears of each job once its result is in."""
    matrix = sim_jobs(policies, capacities)

    def one(job: SimJob, report: JobProgress | None) -> SimResult:
        return run_one(trace, job, options, report)

    ran = {
        (r.policy, r.capacity): r
        for r in run_jobs(matrix, one, workers=jobs, progress=progress, finished=finished)
    }
    return [
        ran.get((p, c)) or replace(ran[(p, capacities[0])], capacity=c)
        for p in policies
        for c in capacities
    ]


def sim_jobs(policies: Sequence[str], capacities: Sequence[int]) -> list[SimJob]:
    """The runs ``run_matrix`` makes: every policy at every capacity, those in
    ``UNBOUNDED`` at the first only (their results do not depend on it)."""
    return [
        job
        for job in policy_matrix(policies, capacities)
        if job.policy not in UNBOUNDED or job.capacity == capacities[0]
    ]

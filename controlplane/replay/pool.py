"""Runs independent jobs over one loaded trace, in forked processes when cores allow.

Owns the process pool behind ``kvwise replay`` and ``kvwise simulate``: workers are
forked after the caller has loaded its trace and built its job function, so they share
its arrays copy-on-write instead of reloading the file, and their progress reaches the
caller through a queue. It must never print or know what a job computes.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
from collections.abc import Callable, Hashable, Sequence
from multiprocessing.pool import AsyncResult
from typing import Any, TypeVar

J = TypeVar("J", bound=Hashable)
R = TypeVar("R")

JobProgress = Callable[[int], None]
"""Called by a job with how far it has got (its own unit, e.g. requests done)."""


# What forked workers inherit: set in the parent just before forking.
_FN: Callable[[Any, JobProgress | None], Any] | None = None
_QUEUE: Any = None


def default_workers() -> int:
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def _worker(job: Any) -> Any:
    fn, queue = _FN, _QUEUE
    assert fn is not None

    def report(done: int) -> None:
        if queue is not None:
            queue.put((job, done))

    return fn(job, report)


def run_jobs(
    jobs: Sequence[J],
    fn: Callable[[J, JobProgress | None], R],
    *,
    workers: int | None = None,
    progress: Callable[[J, int], None] | None = None,
) -> list[R]:
    """``fn(job, report)`` for every job, results in ``jobs`` order. With more than one
    worker (and ``fork`` available) the jobs run in forked processes; an interrupt (Ctrl-C)
    or a failed job ends them all at once instead of after every running job."""
    n = min(workers or default_workers(), len(jobs))
    if n <= 1 or "fork" not in mp.get_all_start_methods():
        return [fn(job, _bind(progress, job)) for job in jobs]
    global _FN, _QUEUE
    ctx = mp.get_context("fork")
    _FN = fn
    _QUEUE = ctx.Queue() if progress else None
    try:
        # Leaving the block terminates the workers: at once on an interrupt or an error.
        with ctx.Pool(n, initializer=_ignore_interrupts) as pool:
            running = [pool.apply_async(_worker, (job,)) for job in jobs]
            _wait_all(running, progress)
            return [result.get() for result in running]
    finally:
        _FN = None
        _QUEUE = None


def _ignore_interrupts() -> None:
    """In a worker: Ctrl-C reaches the whole process group; the parent alone handles it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _wait_all(
    running: Sequence[AsyncResult[Any]], progress: Callable[[Any, int], None] | None
) -> None:
    """Wait for every job, forwarding progress at least every 0.2 s; a failed job raises
    its error at once."""
    while True:
        _drain(progress)
        for result in running:
            if result.ready() and not result.successful():
                result.get()  # raises the job's error
        unfinished = [result for result in running if not result.ready()]
        if not unfinished:
            _drain(progress)
            return
        unfinished[0].wait(0.2)


def _bind(progress: Callable[[J, int], None] | None, job: J) -> JobProgress | None:
    if progress is None:
        return None
    sink = progress
    return lambda done: sink(job, done)


def _drain(progress: Callable[[Any, int], None] | None) -> None:
    queue = _QUEUE
    if progress is None or queue is None:
        return
    while True:
        try:
            job, done = queue.get_nowait()
        except Exception:  # queue.Empty; multiprocessing re-exports it oddly
            return
        progress(job, done)

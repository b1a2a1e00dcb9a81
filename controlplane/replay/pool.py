"""Runs independent jobs over one loaded trace, in forked processes when cores allow.

Owns the process pool behind ``kvwise replay`` and ``kvwise simulate``: workers are
forked after the caller has loaded its trace and built its job function, so they share
its arrays copy-on-write instead of reloading the file, and their progress reaches the
caller through a queue; a job is said finished to the caller once its result is in hand.
An interrupt (Ctrl-C) raises ``JobsInterrupted``, which carries the results of the jobs
that had finished. It must never print or know what a job computes.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing as mp
import os
import signal
import threading
from collections.abc import Callable, Hashable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

J = TypeVar("J", bound=Hashable)
R = TypeVar("R")


class WorkerDied(RuntimeError):
    """A worker process died while it ran a job (killed: out of memory, most likely)."""


class JobsInterrupted(KeyboardInterrupt):
    """Ctrl-C while the jobs ran: a ``KeyboardInterrupt`` (a caller that does not catch it
    ends as before) that carries the results of the jobs that had finished."""

    def __init__(self, finished: dict[Any, Any]) -> None:
        super().__init__()
        self.finished = finished
        """Each finished job's result, in the order of the jobs given."""


JobProgress = Callable[[int], None]
"""Called by a job with how far it has got (its own unit, e.g. requests done)."""


# What forked workers inherit: set in the parent just before forking.
_FN: Callable[[Any, JobProgress | None], Any] | None = None
_QUEUE: Any = None


CGROUP_ROOT = Path("/sys/fs/cgroup")


def default_workers(cgroup_root: Path = CGROUP_ROOT) -> int:
    """One worker per core this process may use: the cores it may run on, and no more
    than a CPU quota allows (a container's CPU limit, which the affinity does not show: a
    pod limited to 2 CPUs on a 64-core node forked 64 workers, each slowed to a sliver)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    quota = cgroup_cpus(cgroup_root)
    return max(1, min(cores or 1, quota or cores or 1))


def cgroup_cpus(root: Path) -> int | None:
    """The CPUs a cgroup CPU quota grants, rounded up (cgroup v2 ``cpu.max``, else v1
    ``cpu.cfs_quota_us`` over ``cpu.cfs_period_us``); None without a quota or a cgroup."""
    with contextlib.suppress(OSError, ValueError):
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else max(1, math.ceil(int(quota) / int(period)))
    with contextlib.suppress(OSError, ValueError):
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        if quota_us > 0 and period_us > 0:
            return max(1, math.ceil(quota_us / period_us))
    return None


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
    finished: Callable[[J], None] | None = None,
) -> list[R]:
    """``fn(job, report)`` for every job, results in ``jobs`` order. With more than one
    worker (and ``fork`` available) the jobs run in forked processes; an interrupt (Ctrl-C),
    SIGTERM or a failed job ends them all at once instead of after every running job, and
    a worker that dies (the OOM killer) fails the run instead of hanging it. ``finished``
    is called with each job once its result is here (after its last progress). An interrupt
    raises ``JobsInterrupted`` with the results of the jobs said finished by then."""
    hooks = _Hooks(progress, finished)
    n = min(workers or default_workers(), len(jobs))
    if n <= 1 or "fork" not in mp.get_all_start_methods():
        return _in_turn(jobs, fn, hooks)
    global _FN, _QUEUE
    ctx = mp.get_context("fork")
    _FN = fn
    # A SimpleQueue writes each report into its pipe before ``put`` returns (a Queue
    # leaves it to a feeder thread), so a job's last report is there before its result.
    _QUEUE = ctx.SimpleQueue() if progress else None
    pids = ctx.SimpleQueue()
    pool = ProcessPoolExecutor(n, mp_context=ctx, initializer=_start_worker, initargs=(pids,))
    try:
        with _signals_deferred() as signals:
            results: list[R] = _collect(pool, jobs, hooks, signals)
    except BrokenProcessPool:
        _end_pool(pool, pids)
        raise WorkerDied(
            "a worker process died while it ran a job (killed: out of memory?); "
            "fewer --jobs need less memory"
        ) from None
    except BaseException:
        _end_pool(pool, pids)
        raise
    finally:
        _FN = None
        _QUEUE = None
    pool.shutdown(wait=True)
    return results


class _Hooks(NamedTuple):
    """What the caller is told while the jobs run."""

    progress: Callable[[Any, int], None] | None
    finished: Callable[[Any], None] | None

    def finish(self, job: Any) -> None:
        if self.finished is not None:
            self.finished(job)


def _in_turn(jobs: Sequence[J], fn: Callable[[J, JobProgress | None], R], hooks: _Hooks) -> list[R]:
    """Every job's result, one job after another in this process."""
    results: dict[J, R] = {}
    try:
        with _sigterm_exits():
            for job in jobs:
                results[job] = fn(job, _bind(hooks.progress, job))
                hooks.finish(job)
    except KeyboardInterrupt:
        raise JobsInterrupted(results) from None
    return [results[job] for job in jobs]


@contextlib.contextmanager
def _sigterm_exits() -> Iterator[None]:
    """In the main thread, SIGTERM ends jobs run in turn as it ends a pool's: as
    ``SystemExit(128 + SIGTERM)``, so that the caller can say it stopped. It killed the
    process silently before (``timeout`` on one core: progress lines, then nothing). Raised
    from the handler, as no pool's lock can be held here."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _collect(
    pool: ProcessPoolExecutor,
    jobs: Sequence[J],
    hooks: _Hooks,
    signals: _Signals,
) -> list[Any]:
    """Every job's result, in ``jobs`` order, forwarding progress at least every 0.2 s;
    a signal received meanwhile is raised between two waits, once the results of the jobs
    finished by then are taken (an interrupt carries them)."""
    pending = {pool.submit(_worker, job): job for job in jobs}
    results: dict[J, Any] = {}
    while pending:
        done, _ = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
        _drain(hooks.progress)
        for future in done:
            job = pending.pop(future)
            results[job] = future.result()
            hooks.finish(job)
        try:
            signals.raise_if_received()
        except KeyboardInterrupt:
            raise JobsInterrupted({job: results[job] for job in jobs if job in results}) from None
    return [results[job] for job in jobs]


class _Signals:
    """SIGINT and SIGTERM received while the jobs run, raised where no lock is held. Raised
    by the handler itself, the interrupt could land inside ``concurrent.futures.wait``
    between taking and giving back a future's lock: the pool's own thread then waited for
    that lock for ever, and the command hung at exit (or failed with "release unlocked
    lock")."""

    def __init__(self) -> None:
        self.received: int | None = None

    def note(self, signum: int, _frame: object) -> None:
        self.received = self.received or signum

    def raise_if_received(self) -> None:
        """``KeyboardInterrupt`` for SIGINT, ``SystemExit(128 + signal)`` for SIGTERM
        (``timeout``, a job scheduler), so that the workers are ended too."""
        if self.received == signal.SIGINT:
            raise KeyboardInterrupt
        if self.received is not None:
            raise SystemExit(128 + self.received)


@contextlib.contextmanager
def _signals_deferred() -> Iterator[_Signals]:
    """In the main thread, SIGINT (unless ignored, as in a background job) and SIGTERM
    are noted while the jobs run, for ``_collect`` to raise."""
    signals = _Signals()
    if threading.current_thread() is not threading.main_thread():
        yield signals
        return
    deferred = [signal.SIGTERM]
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        deferred.append(signal.SIGINT)
    previous = {signum: signal.signal(signum, signals.note) for signum in deferred}
    try:
        yield signals
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _start_worker(pids: Any) -> None:
    """In a worker: say its pid (for ``_end_workers``), leave Ctrl-C, which reaches the
    whole process group, to the parent, and die of SIGTERM as a process does."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    pids.put(os.getpid())


def _end_pool(pool: ProcessPoolExecutor, pids: Any) -> None:
    """End every worker, then wait for the pool's own thread to end. Left running
    (``shutdown(wait=False)``), that thread closed its wake-up pipe while the interpreter's
    exit hook wrote into it (CPython gh-132969, fixed after 3.11): a Ctrl-C or a worker
    killed mid-run printed "OSError: [Errno 9] Bad file descriptor" after the command's own
    last line, at times. Workers are ended again while it waits: one that started a job
    after the first round had not said its pid yet, and would run its job to the end."""
    _end_workers(pids)
    closing = threading.Thread(target=pool.shutdown, kwargs={"cancel_futures": True})
    closing.start()
    while closing.is_alive():
        closing.join(0.05)
        _end_workers(pids)


def _end_workers(pids: Any) -> None:
    """Terminate every worker now: a running job would otherwise run to its end."""
    while not pids.empty():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pids.get(), signal.SIGTERM)


def _bind(progress: Callable[[J, int], None] | None, job: J) -> JobProgress | None:
    if progress is None:
        return None
    sink = progress
    return lambda done: sink(job, done)


def _drain(progress: Callable[[Any, int], None] | None) -> None:
    queue = _QUEUE
    if progress is None or queue is None:
        return
    while not queue.empty():
        job, done = queue.get()
        progress(job, done)

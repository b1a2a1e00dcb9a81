"""Benchmark: how long the shadow evaluator's lock is held, and how long a batch or a read
waits, while a worker's new miniatures are warmed with the window's kept requests.

One worker's synthetic to-C traffic (every request sampled at the default ``--rate 1``,
so a short trace fills the buffer) is applied with its capacity unknown, so its requests
are only kept; then its capacity comes (``set_capacities``, on a thread of its own) and
its 20 miniatures (the default policies and ladder) are warmed with all of them. Meanwhile
the main thread applies the next batches and reads the view, every 10 ms, timing each
call. Every hold of the lock is timed by wrapping it (each hold is named after the
evaluator's method that took it).

    python -m tests.bench.bench_shadow_warm [--duration 900] [--kept 0.75] [--rate 1.0]

``--duration``: the trace's seconds; ``--kept``: the share of its batches applied (and
kept) before the capacity comes; ``--rate``: the shadow's sampling rate.

Not collected by pytest; results go in docs/shadow.md ("Its error and its cost").
"""

from __future__ import annotations

import sys
import threading
import time
from contextlib import AbstractContextManager
from types import TracebackType

from controlplane.shadow.evaluator import ShadowEvaluator
from controlplane.shadow.settings import ShadowSettings
from controlplane.traces.synth import synthesize
from tests.agent_stream import agent_batches
from tests.bench.command_line import run_from_command_line


class TimedLock:
    """``lock``, each hold timed, by the name of the function that took it."""

    def __init__(self, lock: AbstractContextManager[object]) -> None:
        self._lock = lock
        self._since = 0.0
        self._holder = ""
        self.holds: dict[str, list[float]] = {}

    def __enter__(self) -> None:
        self._lock.__enter__()
        self._since = time.perf_counter()
        self._holder = sys._getframe(1).f_code.co_name

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        held = time.perf_counter() - self._since
        self.holds.setdefault(self._holder, []).append(held)
        self._lock.__exit__(kind, exc, tb)


def _timed(call: object, waits: list[float]) -> None:
    start = time.perf_counter()
    call()  # type: ignore[operator]
    waits.append(time.perf_counter() - start)


def run(duration: float, kept: float, rate: float) -> None:
    trace = synthesize("to-c", duration_s=duration, qps=3, seed=7)
    capacity = trace.capacity_for(0.1)
    batches = agent_batches(trace, capacity, batch_events=1000)
    settings = ShadowSettings(
        shadow_rate=rate,
        shadow_window_s=1e9,
        shadow_buckets=1,
        shadow_max_requests=trace.n_requests,
    )
    shadow = ShadowEvaluator(settings)
    lock = TimedLock(shadow._lock)
    shadow._lock = lock  # type: ignore[assignment]
    before = int(len(batches) * kept)
    for batch in batches[:before]:
        shadow.apply(batch)
    shadow.view()  # the gathered events rebuilt: the buffer holds them all
    held = sum(len(r.blocks) for r in shadow._workers["w1"].buffer)
    lock.holds.clear()
    start = time.perf_counter()
    warm = threading.Thread(target=shadow.set_capacities, args=({"w1": capacity},))
    warm.start()
    waits: dict[str, list[float]] = {"apply": [], "view": []}
    rest = iter(batches[before:])
    while warm.is_alive():
        _timed(shadow.view, waits["view"])
        upcoming = next(rest, None)
        if upcoming is not None:
            _timed(lambda: shadow.apply(upcoming), waits["apply"])  # noqa: B023
        time.sleep(0.01)
    warm.join()
    took = time.perf_counter() - start
    print(f"kept sampled accesses {held:,}; set_capacities took {took:.2f} s")
    for holder, holds in sorted(lock.holds.items()):
        print(f"  lock held by {holder}: {len(holds)} times, longest {max(holds) * 1e3:.1f} ms")
    for call, times in waits.items():
        if times:
            print(f"  {call}: {len(times)} calls, longest wait {max(times) * 1e3:.1f} ms")


def main() -> None:
    run_from_command_line(__doc__, run, duration=900.0, kept=0.75, rate=1.0)


if __name__ == "__main__":
    main()

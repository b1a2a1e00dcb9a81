"""Benchmark: synthesize traces and compute their statistics.

Times ``synthesize`` for ten minutes of to-C at 6 QPS (the interactive case) and for a
large to-C trace (two hours at ``--qps``, about ten million block accesses at 10 QPS),
split into generation (``TraceBuilder`` work) and ``Trace.from_arrays``; then times
``trace_stats`` on the large trace against a baseline in the same process: one stable
argsort of its block ids, the single costliest step ``trace_stats`` must take. Synthetic
data throughout.

    python -m tests.bench.bench_synth [--qps 10] [--hours 2] [--repeat 3]

Not collected by pytest (no ``test_`` prefix); results go in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import TypeVar

import numpy as np

from controlplane.traces.synth import synthesize
from controlplane.traces.workload_stats import trace_stats

T = TypeVar("T")


def best_of(repeat: int, fn: Callable[[], T]) -> tuple[float, T]:
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    assert out is not None
    return best, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--qps", type=float, default=10.0)
    ap.add_argument("--hours", type=float, default=2.0)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()

    for profile in ("to-c", "to-b"):
        qps = 6.0 if profile == "to-c" else 20.0
        secs, small = best_of(
            args.repeat, lambda p=profile, q=qps: synthesize(p, duration_s=600, qps=q, seed=1)
        )
        print(
            f"synthesize {profile} 600 s at {qps:g} QPS: {secs:.2f} s "
            f"({small.n_requests:,} requests, {small.n_accesses:,} accesses)"
        )

    duration = args.hours * 3600
    secs, big = best_of(1, lambda: synthesize("to-c", duration_s=duration, qps=args.qps, seed=1))
    print(
        f"synthesize to-c {duration:g} s at {args.qps:g} QPS: {secs:.2f} s "
        f"({big.n_requests:,} requests, {big.n_accesses:,} accesses)"
    )
    base, _ = best_of(args.repeat, lambda: np.argsort(big.blocks, kind="stable"))
    secs, s = best_of(args.repeat, lambda: trace_stats(big))
    print(
        f"trace_stats: {secs:.2f} s; baseline (one stable argsort of the blocks): {base:.2f} s "
        f"-> {secs / base:.1f}x the baseline; ideal hit ratio {s.ideal_hit_ratio:.4f}"
    )


if __name__ == "__main__":
    main()

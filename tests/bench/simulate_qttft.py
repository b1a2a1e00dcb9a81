"""The QTTFT report of docs/simulate.md: policies in the serving simulator at several
cache sizes and loads, and the simulator's wall time per million accesses.

Run (not collected by pytest)::

    python -m tests.bench.simulate_qttft select --seed 11
    python -m tests.bench.simulate_qttft report --seed 4242 --speeds to-c=1,S1 ...

``select`` picks each trace's loaded operating point from ``lru`` alone (never from any
other policy's result): at one instance of the profile and a cache of the profile's KV
pool, the largest speed-up of ``SPEEDS`` at which ``lru`` stays stable (p99 QTTFT under
``STABLE_P99_S``), just below saturation (searched up from x1, or down when x1 is not
stable). ``report`` then runs ``POLICIES`` and ``inf`` at 0.5, 1 and 2 times the pool at
that speed and at half of it (light load), on traces of another seed, and prints
Markdown tables. The to-C and to-B traces are synthetic (``kvwise trace synth``); the
Mooncake sample is the authors' synthetic workload. Results to stdout, progress to
stderr.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from controlplane.simulate.engine import SimOptions
from controlplane.simulate.profiles import BUILTIN, DEFAULT_PROFILE
from controlplane.simulate.report import SimResult
from controlplane.simulate.requests import workload
from controlplane.simulate.runner import run_matrix
from controlplane.traces.model import Trace
from controlplane.traces.reader import load_trace
from controlplane.traces.synth import synthesize

POLICIES = ("lru", "s3fifo", "arc", "wa")
SPEEDS = (
    0.1,
    0.15,
    0.2,
    0.25,
    0.3,
    0.4,
    0.5,
    0.6,
    0.8,
    1.0,
    1.25,
    1.5,
    1.75,
    2.0,
    2.5,
    3.0,
    3.5,
    4.0,
)
POOL_MULTIPLES = (0.5, 1.0, 2.0)
STABLE_P99_S = 30.0
MOONCAKE = Path(__file__).resolve().parents[1] / "data" / "mooncake_synthetic.jsonl.gz"


def traces(seed: int, duration: float) -> dict[str, Trace]:
    return {
        "to-c": synthesize("to-c", duration_s=duration, qps=6.0, seed=seed),
        "to-b": synthesize("to-b", duration_s=duration, qps=6.0, seed=seed),
        "mooncake": load_trace(MOONCAKE),
    }


def pool_blocks(trace: Trace) -> int:
    block = workload(trace).block_tokens
    return BUILTIN[DEFAULT_PROFILE].kv_pool_blocks(block)


def stable_at(name: str, trace: Trace, pool: int, speed: float) -> bool:
    """Whether ``lru`` at ``speed`` keeps p99 QTTFT under ``STABLE_P99_S``."""
    [r] = run_matrix(trace, ["lru"], [pool], SimOptions(speed=speed), jobs=1)
    stable = bool(r.qttft.p99 < STABLE_P99_S)
    print(
        f"{name} x{speed:g}: lru queue {r.queue.mean:.3f} s, QTTFT mean "
        f"{r.qttft.mean:.3f} p99 {r.qttft.p99:.2f} s, stable={stable}",
        file=sys.stderr,
    )
    return stable


def select(seed: int, duration: float) -> None:
    for name, trace in traces(seed, duration).items():
        pool = pool_blocks(trace)
        chosen = None
        if stable_at(name, trace, pool, 1.0):
            chosen = 1.0
            for speed in [x for x in SPEEDS if x > 1.0]:
                if not stable_at(name, trace, pool, speed):
                    break
                chosen = speed
        else:
            for speed in [x for x in reversed(SPEEDS) if x < 1.0]:
                if stable_at(name, trace, pool, speed):
                    chosen = speed
                    break
        print(f"{name}: loaded speed x{chosen}")


def report(seed: int, duration: float, speeds: dict[str, float], jobs: int | None) -> None:
    for name, trace in traces(seed, duration).items():
        pool = pool_blocks(trace)
        caps = [max(1, round(m * pool)) for m in POOL_MULTIPLES]
        print(
            f"\n### {name} ({trace.name}: {trace.n_requests:,} requests, "
            f"{trace.n_accesses:,} accesses; KV pool {pool:,} blocks)\n"
        )
        loaded = speeds.get(name, 1.0)
        for speed in (loaded / 2, loaded):
            t0 = time.perf_counter()
            results = run_matrix(
                trace, [*POLICIES, "inf"], caps, SimOptions(speed=speed), jobs=jobs
            )
            print(f"Speed x{speed:g} ({time.perf_counter() - t0:.0f} s of wall time)\n")
            print_table(results, caps, pool, trace.n_accesses)


def print_table(results: Sequence[SimResult], caps: Sequence[int], pool: int, n: int) -> None:
    by = {(r.policy, r.capacity): r for r in results}
    print("| policy | pool | hit | QTTFT mean | p50 | p90 | p99 | queue | vs lru | s/M acc |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for cap in caps:
        lru = by[("lru", cap)].qttft.mean
        for name in [*POLICIES, "inf"]:
            r = by[(name, cap)]
            q = r.qttft
            print(
                f"| {name} | {cap / pool:g}x | {r.hit_ratio:.3f} | {q.mean:.3f} | {q.p50:.3f} "
                f"| {q.p90:.3f} | {q.p99:.3f} | {r.queue.mean:.3f} | "
                f"{q.mean / lru - 1:+.1%} | {r.seconds / n * 1e6:.1f} |"
            )
    print()


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["select", "report"])
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--duration", type=float, default=3600.0)
    ap.add_argument("--speeds", default="", help="report: to-c=2,to-b=3,mooncake=1")
    ap.add_argument("--jobs", type=int, default=None)
    args = ap.parse_args(argv)
    if args.mode == "select":
        select(args.seed, args.duration)
        return
    speeds = {k: float(v) for k, v in (kv.split("=") for kv in args.speeds.split(",") if kv)}
    report(args.seed, args.duration, speeds, args.jobs)


if __name__ == "__main__":
    main()

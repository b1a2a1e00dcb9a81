"""Simulator throughput against the replay, in one process: wall and CPU seconds per
million block accesses. Run (not collected by pytest)::

    python -m tests.bench.bench_simulate --seed 4242 --duration 3600

On a synthetic to-C trace (``controlplane.traces.synth``) at a cache of the default
profile's KV pool, one instance at the trace's own speed, it replays and simulates each
policy one after the other and prints a Markdown table. The ratio to the replay of the
same policy, measured in the same process, is the portable figure.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

from controlplane.replay.runner import ReplayJob
from controlplane.replay.runner import run_one as replay_one
from controlplane.simulate.engine import SimOptions
from controlplane.simulate.profiles import BUILTIN, DEFAULT_PROFILE
from controlplane.simulate.runner import run_one
from controlplane.traces.synth import synthesize


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=4242)
    ap.add_argument("--duration", type=float, default=3600.0)
    ap.add_argument("--policies", default="lru,s3fifo,arc,wa")
    args = ap.parse_args(argv)
    trace = synthesize("to-c", duration_s=args.duration, qps=6.0, seed=args.seed)
    pool = BUILTIN[DEFAULT_PROFILE].kv_pool_blocks(16)
    m = trace.n_accesses / 1e6
    print(
        f"{trace.name}: {trace.n_requests:,} requests, {trace.n_accesses:,} accesses; "
        f"capacity {pool:,} blocks\n"
    )
    print(
        "| policy | replay s/M (CPU) | simulate s/M (wall) | simulate s/M (CPU) | x replay (CPU) |"
    )
    print("|---|---:|---:|---:|---:|")
    for name in args.policies.split(","):
        job = ReplayJob(name, pool)
        c0 = time.process_time()
        replay_one(trace, job)
        replay_cpu = time.process_time() - c0
        c0, w0 = time.process_time(), time.perf_counter()
        run_one(trace, job, SimOptions())
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
        print(
            f"| {name} | {replay_cpu / m:.2f} | {wall / m:.2f} | {cpu / m:.2f} | "
            f"{cpu / replay_cpu:.2f} |"
        )


if __name__ == "__main__":
    main()

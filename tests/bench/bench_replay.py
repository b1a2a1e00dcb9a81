"""Benchmark: replay throughput (block accesses per second) of every replay policy.

Builds a synthetic to-C trace (``controlplane.traces.synth``: conversations whose turns
extend earlier prompts, shared system prompts; synthetic data, not the public trace) of
at least ``--min-accesses`` block accesses, then replays it through each policy at one
capacity (a fraction of the trace's unique blocks) with
``controlplane.replay.engine.replay_hits``, one policy after another in this one process
on one core, so the ratios against ``lru`` compare like with like. Reports wall and CPU
time (CPU time is the steadier figure on a shared machine), accesses per second of each,
the ratio to ``lru`` and the hit ratio (a sanity check, not a result).

    python -m tests.bench.bench_replay [--min-accesses 10000000] [--capacity-frac 0.1]
                                       [--policies lru,fifo,...] [--json]

Goal on one core: >= 1,000,000 accesses/s for ``lru``, >= 500,000/s for the others. Not
collected by pytest (no ``test_`` prefix); results go in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from dataclasses import asdict, dataclass

from controlplane.replay import catalog
from controlplane.replay.engine import replay_hits
from controlplane.traces.model import Trace
from controlplane.traces.synth import synthesize

QPS = 6.0
"""The public trace A's request rate; the duration grows until the trace is big enough."""


@dataclass(frozen=True)
class Row:
    policy: str
    wall_s: float
    cpu_s: float
    accesses_per_s_wall: float
    accesses_per_s_cpu: float
    ratio_to_lru_cpu: float
    hit_ratio: float


def build_trace(min_accesses: int, seed: int) -> Trace:
    duration = 3600.0
    while True:
        trace = synthesize("to-c", duration_s=duration, qps=QPS, seed=seed)
        if trace.n_accesses >= min_accesses:
            return trace
        duration *= 1.1 * min_accesses / max(trace.n_accesses, 1)


def time_policy(trace: Trace, name: str, capacity: int) -> tuple[float, float, float]:
    policy = catalog.create(name, capacity, trace)
    w0, c0 = time.perf_counter(), time.process_time()
    hits = replay_hits(trace, policy, capacity)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    return wall, cpu, int(hits.sum()) / trace.n_accesses


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--min-accesses", type=int, default=10_000_000)
    ap.add_argument("--capacity-frac", type=float, default=0.1)
    ap.add_argument("--policies", default=",".join(catalog.names()))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    names = args.policies.split(",")
    for name in names:
        catalog.factory(name)  # unknown names fail before the long part
    if "lru" in names:  # the baseline of every ratio runs first
        names.remove("lru")
    names.insert(0, "lru")

    t0 = time.perf_counter()
    trace = build_trace(args.min_accesses, args.seed)
    built = time.perf_counter() - t0
    capacity = max(1, int(args.capacity_frac * trace.n_unique))
    n = trace.n_accesses
    header = {
        "trace": trace.name,
        "requests": trace.n_requests,
        "accesses": n,
        "unique_blocks": trace.n_unique,
        "capacity": capacity,
        "trace_build_s": round(built, 1),
        "python": platform.python_version(),
        "machine": platform.processor() or platform.machine(),
    }
    if not args.json:
        print(json.dumps(header), flush=True)
    rows: list[Row] = []
    lru_cpu = 0.0
    for name in names:
        wall, cpu, ratio = time_policy(trace, name, capacity)
        lru_cpu = lru_cpu or cpu
        rows.append(Row(name, wall, cpu, n / wall, n / cpu, lru_cpu / cpu, ratio))
        if not args.json:
            r = rows[-1]
            print(
                f"{name:8s} {r.accesses_per_s_wall:>12,.0f}/s wall {r.accesses_per_s_cpu:>12,.0f}/s"
                f" cpu  x{r.ratio_to_lru_cpu:.2f} of lru  hit ratio {r.hit_ratio:.4f}",
                flush=True,
            )
    if args.json:
        print(json.dumps({**header, "results": [asdict(r) for r in rows]}, indent=1))


if __name__ == "__main__":
    main()

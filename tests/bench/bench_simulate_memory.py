"""Benchmark: ``kvwise simulate``'s peak memory and wall time by policy and fleet size.

Each (policy, instances) runs ``kvwise simulate TRACE -p POLICY --instances N -j 1
--json`` in a process of its own, at the default profile's capacity; its peak resident
set comes from the operating system's accounting of that child alone (``os.wait4``), the
same figure as ``/usr/bin/time -v``'s "Maximum resident set size". Prints a Markdown
table. The trace is any file ``kvwise simulate`` reads, e.g.::

    kvwise trace synth --profile to-c --duration 300 --qps 20 --seed 5 -o sim.jsonl
    python -m tests.bench.bench_simulate_memory sim.jsonl --policies lru,wa,belady \\
        --instances 1,8,64

Not collected by pytest; results go in docs/benchmarks.md ("Simulate: memory by fleet
size").
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Sequence

CLI = ("-c", "from controlplane.cli import main; main()")


def peak_of_one(trace: str, policy: str, instances: int) -> tuple[float, float]:
    """Peak RSS (MiB) and wall seconds of one simulation in a child process."""
    argv = [sys.executable, *CLI, "simulate", trace, "-p", policy]
    argv += ["--instances", str(instances), "-j", "1", "--json"]
    t0 = time.perf_counter()
    child = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - t0
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode:
        raise SystemExit(f"{' '.join(argv)} exited {child.returncode}")
    return usage.ru_maxrss / 1024, wall  # Linux reports KiB


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", help="trace file for kvwise simulate")
    ap.add_argument("--policies", default="lru,wa,belady")
    ap.add_argument("--instances", default="1,8,64", help="comma-separated fleet sizes")
    args = ap.parse_args(argv)
    print("| policy | instances | peak RSS (MiB) | wall (s) |")
    print("|---|---:|---:|---:|")
    for n in (int(x) for x in args.instances.split(",")):
        for policy in args.policies.split(","):
            rss, wall = peak_of_one(args.trace, policy, n)
            print(f"| {policy} | {n} | {rss:,.0f} | {wall:.1f} |", flush=True)


if __name__ == "__main__":
    main()

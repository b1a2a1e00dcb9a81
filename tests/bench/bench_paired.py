"""Benchmark: the paired bootstrap of ``kvwise bench serve --compare``.

Times ``change_intervals`` (1,000 draws, all four statistics) on two synthetic runs of
``--requests`` requests each, paired by trace index, with per-request figures as a
summary keeps them (TTFT to the microsecond, token counts). The API is the one both the
sort-per-draw bootstrap and the counting one expose, so the same command times either
commit. Synthetic data throughout.

    python -m tests.bench.bench_paired [--requests 400000] [--repeat 1]

Not collected by pytest (no ``test_`` prefix); results go in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

from controlplane.loadgen.paired import change_intervals


def runs(requests: int) -> tuple[dict[str, Any], dict[str, Any]]:
    rng = np.random.default_rng(7)
    base = rng.lognormal(-2.0, 0.8, size=requests)
    prompt = rng.integers(100, 4000, size=requests)

    def run(scale: float) -> dict[str, Any]:
        ttft = np.round(base * scale * rng.normal(1.0, 0.05, size=requests), 6)
        return {
            "index": list(range(requests)),
            "ttft_s": ttft.tolist(),
            "prompt_tokens": prompt.tolist(),
            "cached_tokens": (prompt * rng.random(requests)).astype(int).tolist(),
        }

    return run(1.0), run(0.9)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=400_000)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    a, b = runs(args.requests)
    best = float("inf")
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        intervals = change_intervals(a, b)
        best = min(best, time.perf_counter() - t0)
    print(f"{args.requests:,} requests: {best:.2f} s (best of {args.repeat})")
    for key, (lo, hi) in intervals.items():
        print(f"  {key}: {lo:+.4%} .. {hi:+.4%}")


if __name__ == "__main__":
    main()

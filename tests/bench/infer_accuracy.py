"""How well ``agent.category_inference`` recovers turns from blocks alone, on synthetic traces.

Run (not collected by pytest)::

    python -m tests.bench.infer_accuracy --seed 2024 --duration 3600

Infers every request's category with the labels never looked at (as the replay's
``--categories auto`` does) and compares the inferred turn with the trace's label, capped
like the inference (1, 2, 3+). Prints, per profile, the agreement, the confusion table in
requests, the inference's time per request and the table's size. Synthetic traces only:
the real traces' turns may be harder to see.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

import numpy as np

from controlplane.replay.accesses import request_categories
from controlplane.traces.synth import synthesize


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=2024)
    ap.add_argument("--duration", type=float, default=3600.0)
    ap.add_argument("--qps", type=float, default=6.0)
    args = ap.parse_args(argv)
    for profile in ("to-c", "to-b"):
        trace = synthesize(profile, duration_s=args.duration, qps=args.qps, seed=args.seed)
        t0 = time.perf_counter()
        codes, names = request_categories(trace, "auto")
        per_request_us = (time.perf_counter() - t0) / trace.n_requests * 1e6
        inferred = np.array([int(names[c][1 : names[c].index("_")]) for c in codes])
        truth = np.minimum(trace.turns, 3)
        print(f"\n{trace.name}: {trace.n_requests:,} requests, {per_request_us:.0f} us/request")
        print(
            f"turn agrees (1 / 2 / 3+): {np.mean(inferred == truth):.1%}; first turn or not: "
            f"{np.mean((inferred > 1) == (truth > 1)):.1%}\n"
        )
        print("| label / inferred | 1 | 2 | 3+ |\n|---|---:|---:|---:|")
        for t in (1, 2, 3):
            row = [int(np.sum((truth == t) & (inferred == u))) for u in (1, 2, 3)]
            print(f"| {t if t < 3 else '3+'} | " + " | ".join(f"{x:,}" for x in row) + " |")


if __name__ == "__main__":
    main()

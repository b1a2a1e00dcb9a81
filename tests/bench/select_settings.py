"""How docs/policy.md chose ``wa``'s fitting defaults: a greedy search on a selection seed.

Run (not collected by pytest)::

    python -m tests.bench.select_settings --seed 7 --duration 1800

On synthetic to-C and to-B traces of a seed never used for reported results, at 5, 10,
20 and 40 % of the unique blocks, it scores a setting by its mean block hit ratio over
those eight cells (``wa`` fitted online, as ``kvwise replay`` does). Knobs are chosen one
at a time in a fixed order, each with the earlier ones at their chosen values, starting
from the fitter's defaults before the search (``START``); a candidate must beat the
incumbent's mean by more than ``--tie`` to replace it (ties keep the incumbent, the
simpler or current value). Prints each round's table and the choices; progress goes to
stderr.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from controlplane.fit.settings import FitSettings
from controlplane.replay.options import ReplayOptions
from controlplane.traces.model import Trace
from controlplane.traces.synth import synthesize
from tests.bench.ablation import FRACS, Variant, run, synthetic_trace_parser

KNOBS: tuple[tuple[str, tuple[Any, ...]], ...] = (
    ("life_s", (None, 0.1, 1.0, 5.0, 30.0)),
    ("shrinkage_samples", (None, 500.0, 5000.0)),
    ("near_concurrent_s", (None, 0.3, 1.0, 3.0)),
    ("attribution", ("last", "creator")),
    ("reuse_class", ("off", "trace")),
)
"""Candidates per knob; ``None`` is the starting point's value (below)."""

START = ReplayOptions(fit=FitSettings(life_s_override=None))
"""The fitter's defaults before this search: a life window per category (the quantile
rule), no near-concurrent merging, shrinkage worth 50 samples, the last accessor."""


def score(traces: Sequence[Trace], options: ReplayOptions, jobs: int, tag: str) -> list[float]:
    """Hit ratios of ``wa`` with ``options``: every trace, every capacity."""
    name = Variant(tag, "wa", "censored", options).register()
    out: list[float] = []
    for trace in traces:
        out += run(trace, [name], jobs, options)[name]
    return out


def _parse(kv: str) -> tuple[str, Any]:
    key, value = kv.split("=", 1)
    typed = {"None": None, "True": True, "False": False}
    if value in typed:
        return key, typed[value]
    try:
        return key, float(value)
    except ValueError:
        return key, value


def main(argv: Sequence[str] | None = None) -> None:
    ap = synthetic_trace_parser(__doc__, seed=7, duration_s=1800.0)
    ap.add_argument("--tie", type=float, default=2e-4, help="mean gain needed to switch")
    ap.add_argument("--only", default="", help="comma-separated knobs to search (default all)")
    ap.add_argument(
        "--base", default="", help="start from these choices, e.g. life_s=0.1,attribution=last"
    )
    args = ap.parse_args(argv)
    traces = [
        synthesize(p, duration_s=args.duration, qps=args.qps, seed=args.seed)
        for p in ("to-c", "to-b")
    ]
    cells = [
        f"{t.name.split('-')[1]}-{t.name.split('-')[2]} {f:.0%}" for t in traces for f in FRACS
    ]
    for name in ("lru", "s3fifo"):
        ratios = [x for t in traces for x in run(t, [name], args.jobs, ReplayOptions())[name]]
        print(f"{name}: " + ", ".join(f"{c} {x:.4f}" for c, x in zip(cells, ratios, strict=True)))
    best = replace(START, **dict(_parse(kv) for kv in args.base.split(",") if kv))
    knobs = [k for k in KNOBS if not args.only or k[0] in args.only.split(",")]
    print(f"start: {best}")
    best_scores = score(traces, best, args.jobs, "incumbent")
    for knob, candidates in knobs:
        print(f"\n### {knob}\n\n| value | mean | " + " | ".join(cells) + " |")
        print("|---|---:|" + "---:|" * len(cells))
        rows = [(getattr(best, knob), best_scores)]
        for value in (c for c in candidates if c != getattr(best, knob)):
            opts = replace(best, **{knob: value})
            rows.append((value, score(traces, opts, args.jobs, f"{knob}={value}")))
        incumbent_mean = sum(best_scores) / len(best_scores)
        for value, s in rows:
            print(
                f"| {value} | {sum(s) / len(s):.4f} | " + " | ".join(f"{x:.4f}" for x in s) + " |"
            )
            if sum(s) / len(s) > incumbent_mean + args.tie and s is not best_scores:
                best, best_scores, incumbent_mean = (
                    replace(best, **{knob: value}),
                    s,
                    sum(s) / len(s),
                )
        print(f"\nchosen {knob} = {getattr(best, knob)}", flush=True)
    auto = score(traces, replace(best, categories="auto"), args.jobs, "auto")
    print(
        "\nwith inferred categories: "
        + ", ".join(f"{c} {x:.4f}" for c, x in zip(cells, auto, strict=True))
    )
    print(f"\nchosen: {best}", file=sys.stderr)


if __name__ == "__main__":
    main()

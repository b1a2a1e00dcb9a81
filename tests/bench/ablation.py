"""The ablation report of docs/policy.md: every policy, and ``wa`` one improvement at a time.

Run (not collected by pytest)::

    python -m tests.bench.ablation --seed 2024

On synthetic to-C and to-B traces (``controlplane.traces.synth``: synthetic, calibrated to
the paper's published statistics, not the real traces) and the bundled Mooncake sample,
at capacities of 5, 10, 20 and 40 % of each trace's unique blocks, it replays the
baselines, ``wa-ref``, the ablation ladder from ``wa-ref`` to ``wa`` (each row adds one
improvement to the row above), ``wa`` with inferred categories, ``belady`` and ``inf``,
all through ``controlplane.replay`` with online refits (``ReplayOptions`` defaults), and
prints Markdown tables. The defaults it reports were chosen on another seed by
``tests.bench.select_settings``. Results go to stdout; progress to stderr.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from agent.policies.base import EvictionPolicy
from controlplane.replay import catalog
from controlplane.replay.engine import ReplayResult
from controlplane.replay.online import Evictor, Fitter, build
from controlplane.replay.options import ReplayOptions
from controlplane.replay.runner import run_matrix
from controlplane.traces.model import Trace
from controlplane.traces.reader import load_trace
from controlplane.traces.synth import synthesize

BASELINES = ("lru", "fifo", "lfu", "s3fifo", "sieve", "arc")
FRACS = [0.05, 0.1, 0.2, 0.4]
"""Capacities as fractions of a trace's unique blocks (``--fracs`` replaces them)."""
MOONCAKE = Path(__file__).resolve().parents[1] / "data" / "mooncake_synthetic.jsonl.gz"


@dataclass(frozen=True)
class Variant:
    """One fitted-policy row: an evictor, a fitter and the options it replays with."""

    label: str
    evictor: Evictor
    fitter: Fitter
    options: ReplayOptions

    def register(self) -> str:
        """Register as a replay policy (before the runner forks); return its name."""
        name = f"abl:{self.label}"
        v = self

        def factory(capacity: int, trace: Trace, options: ReplayOptions) -> EvictionPolicy:
            return build(v.evictor, trace, v.options, fitter=v.fitter, capacity=capacity)

        catalog.register_offline(name)(factory)
        return name


def ladder(defaults: ReplayOptions) -> list[Variant]:
    """From the reference code's behaviour to ``wa``, one improvement per row, then
    alternatives. The window is the default (1 h) throughout: on traces of an hour it
    never drops an access, so it has no row here."""
    ref_like = replace(
        defaults, attribution="creator", life_s=5.0, near_concurrent_s=0.3, shrinkage_samples=0.0
    )
    rows = [
        Variant("wa-ref (reference code)", "wa-ref", "reference", ref_like),
        Variant("+ every-access stamps, unknown = default", "wa", "reference", ref_like),
        Variant("+ censored MLE fit (own fit per category)", "wa", "censored", ref_like),
    ]
    prev = ref_like
    steps: tuple[tuple[str, dict[str, Any]], ...] = (
        ("+ shrinkage to the pooled fit", {"shrinkage_samples": defaults.shrinkage_samples}),
        ("+ near-concurrent threshold 0 s", {"near_concurrent_s": defaults.near_concurrent_s}),
        ("+ attribution to the last accessor", {"attribution": defaults.attribution}),
        ("+ life window 0.1 s = **wa**", {"life_s": defaults.life_s}),
        ("+ reuse classes (replay only)", {"reuse_class": "trace"}),
    )
    for label, change in steps:
        prev = replace(prev, **change)
        rows.append(Variant(label, "wa", "censored", prev))
    quantile = defaults.fit.model_copy(update={"life_s_override": None})
    rows += [
        Variant(
            "alt: wa, life window per category (0.9 quantile)",
            "wa",
            "censored",
            replace(defaults, fit=quantile),
        ),
        Variant("wa, inferred categories", "wa", "censored", replace(defaults, categories="auto")),
        Variant(
            "wa + reuse classes, inferred categories",
            "wa",
            "censored",
            replace(defaults, categories="auto", reuse_class="trace"),
        ),
    ]
    return rows


def run(
    trace: Trace, names: Sequence[str], jobs: int, options: ReplayOptions
) -> dict[str, list[float]]:
    caps = [trace.capacity_for(f) for f in FRACS]
    t0 = time.perf_counter()
    results: list[ReplayResult] = run_matrix(trace, list(names), caps, jobs=jobs, options=options)
    print(
        f"  {trace.name}: {len(results)} replays in {time.perf_counter() - t0:.0f} s",
        file=sys.stderr,
    )
    by: dict[str, list[float]] = {n: [] for n in names}
    for r in results:
        by[r.policy].append(r.hit_ratio)
    return by


def table(title: str, rows: dict[str, list[float]], labels: dict[str, str]) -> str:
    head = "| policy | " + " | ".join(f"{f:.0%}" for f in FRACS) + " |"
    sep = "|---|" + "---:|" * len(FRACS)
    body = [
        f"| {labels.get(n, n)} | " + " | ".join(f"{x:.4f}" for x in v) + " |"
        for n, v in rows.items()
    ]
    return "\n".join(
        [f"**{title}** (block hit ratio by capacity, % of unique blocks)", "", head, sep, *body]
    )


def _d(w: float, x: float) -> str:
    """``w - x``, absolute and relative to ``x``."""
    return f"{w - x:+.4f} ({(w - x) / x:+.1%})" if x > 0 else f"{w - x:+.4f}"


def gains(rows: dict[str, list[float]], pairs: Sequence[tuple[str, str]]) -> str:
    """Each ``(label, name)`` row against lru, the best baseline and wa-ref, absolute and
    relative, per capacity."""
    lines = [
        "| capacity | best baseline | policy | - lru | - best baseline | - wa-ref |",
        "|---|---|---|---:|---:|---:|",
    ]
    for i, f in enumerate(FRACS):
        best = max(BASELINES, key=lambda b: rows[b][i])
        lru, b, ref = rows["lru"][i], rows[best][i], rows["wa-ref"][i]
        for label, name in pairs:
            w = rows[name][i]
            lines.append(
                f"| {f:.0%} | {best} {b:.4f} | {label} {w:.4f} | {_d(w, lru)} | {_d(w, b)} "
                f"| {_d(w, ref)} |"
            )
    return "\n".join(lines)


def kept(rows: dict[str, list[float]], pairs: Sequence[tuple[str, str, str]]) -> str:
    """Share of a labelled policy's gain over lru that its inferred-category twin keeps."""
    lines = ["| inferred vs labelled | " + " | ".join(f"{f:.0%}" for f in FRACS) + " |"]
    lines.append("|---|" + "---:|" * len(FRACS))
    for label, auto, labelled in pairs:
        cells = []
        for i in range(len(FRACS)):
            gain = rows[labelled][i] - rows["lru"][i]
            keep = (rows[auto][i] - rows["lru"][i]) / gain if gain > 0 else float("nan")
            cells.append(f"{keep:.0%}" if gain > 0 else "n/a (no gain)")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def report(trace: Trace, jobs: int, defaults: ReplayOptions) -> str:
    """Every policy with online refits, then the paper's split protocol."""
    variants = ladder(defaults)
    names = {v.register(): v.label for v in variants}
    by_label = {label: n for n, label in names.items()}
    ref = by_label["wa-ref (reference code)"]
    wa = by_label["+ life window 0.1 s = **wa**"]
    wa_re = by_label["+ reuse classes (replay only)"]
    order = [*BASELINES, *names, "belady", "inf"]
    rows = run(trace, order, jobs, defaults)
    rows["wa-ref"] = rows[ref]
    out = [
        table(f"{trace.name}, online refits", {n: rows[n] for n in order}, names),
        "",
        gains(rows, [("wa", wa), ("wa + reuse classes", wa_re)]),
        "",
        kept(
            rows,
            [
                ("wa", by_label["wa, inferred categories"], wa),
                ("wa + reuse classes", by_label["wa + reuse classes, inferred categories"], wa_re),
            ],
        ),
    ]
    split = replace(defaults, wa_fit="split")
    split_names = ["lru", "s3fifo", "wa-ref", "wa", "abl:wa-split-reuse"]
    Variant("wa-split-reuse", "wa", "censored", replace(split, reuse_class="trace")).register()
    srows = run(trace, split_names, jobs, split)
    labels = {"abl:wa-split-reuse": "wa + reuse classes"}
    title = f"{trace.name}, split: fitted on the first half, scored on the second half only"
    out += ["", table(title, srows, labels)]
    return "\n".join(out)


def report_unlabelled(trace: Trace, jobs: int, defaults: ReplayOptions) -> str:
    """A trace without labels: fitted policies on inferred categories."""
    auto = replace(defaults, categories="auto")
    variants = [
        Variant("wa-ref, inferred categories", "wa-ref", "reference", auto),
        Variant("wa, inferred categories", "wa", "censored", auto),
        Variant(
            "wa + reuse classes, inferred", "wa", "censored", replace(auto, reuse_class="trace")
        ),
    ]
    names = {v.register(): v.label for v in variants}
    order = [*BASELINES, *names, "belady", "inf"]
    rows = run(trace, order, jobs, defaults)
    rows["wa-ref"] = rows[order[len(BASELINES)]]
    pairs = [(label, n) for n, label in names.items() if not label.startswith("wa-ref")]
    return "\n".join(
        [
            table(f"{trace.name}, online refits", {n: rows[n] for n in order}, names),
            "",
            gains(rows, pairs),
        ]
    )


def synthetic_trace_parser(
    doc: str | None, *, seed: int = 2024, duration_s: float = 3600.0
) -> argparse.ArgumentParser:
    """The options every report on synthetic traces takes (``--seed``, ``--duration``,
    ``--qps``, ``--jobs``), described by the first paragraph of the script's ``doc``."""
    ap = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=seed)
    ap.add_argument(
        "--duration", type=float, default=duration_s, help="seconds of each synthetic trace"
    )
    ap.add_argument("--qps", type=float, default=6.0)
    ap.add_argument("--jobs", type=int, default=2)
    return ap


def report_traces(
    args: argparse.Namespace, defaults: ReplayOptions
) -> list[tuple[Trace, ReplayOptions]]:
    """The traces a report runs, each with its options: one synthetic trace per profile of
    ``args.profiles`` (by ``synthetic_trace_parser``'s options), then, with
    ``args.mooncake``, the Mooncake sample with inferred categories."""
    traces = [
        (synthesize(p, duration_s=args.duration, qps=args.qps, seed=args.seed), defaults)
        for p in args.profiles.split(",")
        if p
    ]
    if args.mooncake:
        traces.append((load_trace(MOONCAKE), replace(defaults, categories="auto")))
    return traces


def headline(trace: Trace, about: str = "") -> str:
    """The line a report prints above a trace's tables."""
    return (
        f"\n{trace.name}{about}: {trace.n_requests:,} requests, {trace.n_accesses:,} accesses, "
        f"{trace.n_unique:,} unique blocks\n"
    )


def main(argv: Sequence[str] | None = None) -> None:
    ap = synthetic_trace_parser(__doc__)
    ap.add_argument("--profiles", default="to-c,to-b")
    ap.add_argument("--mooncake", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--fracs", default="0.05,0.1,0.2,0.4", help="capacities, shares of unique")
    args = ap.parse_args(argv)
    FRACS[:] = [float(f) for f in args.fracs.split(",")]
    defaults = ReplayOptions()
    print(f"defaults: {defaults}", file=sys.stderr)
    for profile in args.profiles.split(","):
        trace = synthesize(profile, duration_s=args.duration, qps=args.qps, seed=args.seed)
        print(headline(trace))
        print(report(trace, args.jobs, defaults))
    if args.mooncake:
        trace = load_trace(MOONCAKE)
        print(headline(trace, " (Mooncake sample, no labels: inferred categories)"))
        print(report_unlabelled(trace, args.jobs, defaults))


if __name__ == "__main__":
    main()

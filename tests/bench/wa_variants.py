"""``wa`` and its candidate improvements against the baselines, with the share of the
lru -> Belady gap each closes: the "A better wa" rows of docs/policy.md.

Run (not collected by pytest)::

    python -m tests.bench.wa_variants --seed 2024

On synthetic to-C and to-B traces (``controlplane.traces.synth``: synthetic, calibrated to
the paper's published statistics, not the real traces) with their labels, and the bundled
Mooncake sample with inferred categories, at capacities of 1-40 % of each trace's unique
blocks, it replays the baselines, ``wa`` (online refits, ``ReplayOptions`` defaults), each
variant in ``VARIANTS``, the replay-only policies of ``REPLAY_ONLY`` (``wa-mix``,
``wa-shared``, ``wa-pace`` at each prior tried, ``wa-superseded`` under each rule,
``wa-regret`` with one and two baselines) and
``belady``, and prints per
trace the hit ratios and the gap closed, ``(x - lru) / (belady - lru)``. Choose on one
seed, report on others. Results go to stdout; progress to stderr.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace

from agent.policies.base import EvictionPolicy
from controlplane.replay import catalog, experts, shared_rate
from controlplane.replay.catalog import ReplayFactory
from controlplane.replay.options import ReplayOptions
from controlplane.replay.pace import paced_wa
from controlplane.replay.superseded import SCOPES, superseding_wa
from controlplane.traces.model import Trace
from tests.bench.ablation import (
    BASELINES,
    FRACS,
    Variant,
    headline,
    report_traces,
    run,
    synthetic_trace_parser,
    table,
)

SHRINKAGE_TRIED = 500.0
"""The pooled fit's pseudo-samples tried against the default (docs/policy.md, "Shrinkage by
the goal's rule")."""
VARIANTS: dict[str, Callable[[ReplayOptions], ReplayOptions]] = {
    "wa": lambda o: o,
    "wa + reuse classes (hit, no ghost)": lambda o: replace(o, reuse_class="hit", reuse_ghost=0),
    "wa + reuse classes (hit or ghost 1x)": lambda o: replace(
        o, reuse_class="hit", reuse_ghost=1.0
    ),
    "wa + reuse classes (hit or ghost 4x)": lambda o: replace(
        o, reuse_class="hit", reuse_ghost=4.0
    ),
    "wa + reuse classes (hit or ghost 16x)": lambda o: replace(
        o, reuse_class="hit", reuse_ghost=16.0
    ),
    "wa + reuse classes (trace knowledge)": lambda o: replace(o, reuse_class="trace"),
    "wa + depth classes": lambda o: replace(o, depth="classes"),
    "wa + depth classes + saved-prefill weights": lambda o: replace(o, depth="cost"),
    "wa with shrinkage 500": lambda o: replace(o, shrinkage_samples=SHRINKAGE_TRIED),
    "wa + reuse classes (hit or ghost 16x) with shrinkage 500": lambda o: replace(
        o, reuse_class="hit", reuse_ghost=16.0, shrinkage_samples=SHRINKAGE_TRIED
    ),
}
"""Label -> the options of the row, from the run's defaults."""


def gap_table(title: str, rows: dict[str, list[float]], labels: dict[str, str]) -> str:
    """Share of the lru -> Belady gap each row closes, per capacity."""
    head = "| policy | " + " | ".join(f"{f:.0%}" for f in FRACS) + " |"
    lines = [f"**{title}**", "", head, "|---|" + "---:|" * len(FRACS)]
    lru, belady = rows["lru"], rows["belady"]
    for name, label in labels.items():
        cells = []
        for i in range(len(FRACS)):
            gap = belady[i] - lru[i]
            cells.append(f"{(rows[name][i] - lru[i]) / gap:+.1%}" if gap > 1e-9 else "n/a")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def best_table(rows: dict[str, list[float]], labels: dict[str, str]) -> str:
    """Each row against the best baseline at each capacity."""
    lines = ["| capacity | best baseline | " + " | ".join(labels.values()) + " |"]
    lines.append("|---|---|" + "---:|" * len(labels))
    for i, f in enumerate(FRACS):
        best = max(BASELINES, key=lambda b: rows[b][i])
        diffs = " | ".join(f"{rows[n][i] - rows[best][i]:+.4f}" for n in labels)
        lines.append(f"| {f:.0%} | {best} {rows[best][i]:.4f} | {diffs} |")
    return "\n".join(lines)


MIXTURE = "wa-mix (two-phase where one exponential fits badly)"
"""The replay-only ``wa-mix`` (``controlplane.replay.mixture``), run with the defaults."""
PACE_PRIORS = (1.0, 4.0, 16.0)
"""The gamma priors (in gaps) ``wa-pace`` was tried with on seed 7."""
PACE = {
    f"wa-pace (conversation pace; prior {k:g} gaps)": (f"wa-pace:prior {k:g}", paced_wa(k))
    for k in PACE_PRIORS
}
"""Label -> name and factory of each ``wa-pace`` row (``controlplane.replay.pace``)."""
SUPERSEDED = {
    f"wa-superseded ({scope})": (f"wa-superseded:{scope}", superseding_wa(scope))
    for scope in SCOPES
}
"""Label -> name and factory of each ``wa-superseded`` row, one per rule
(``controlplane.replay.superseded``)."""
SHARED = "wa-shared (shared prefixes at their own rate)"
"""The replay-only ``wa-shared`` (``controlplane.replay.shared_rate``), with its defaults."""
SHARED_SHRUNK = "wa-shared with shrinkage 500"
"""``wa-shared`` with ``SHRINKAGE_TRIED`` pseudo-samples of the pooled fit."""


def wa_shared_shrunk(capacity: int, trace: Trace, options: ReplayOptions) -> EvictionPolicy:
    """``wa-shared`` fitted with ``SHRINKAGE_TRIED`` pseudo-samples of the pooled fit."""
    shrunk = replace(options, shrinkage_samples=SHRINKAGE_TRIED)
    return shared_rate.fitted_wa_shared(capacity, trace, shrunk)


REGRET = "wa-regret (wa-shared and lru by regret)"
"""The replay-only ``wa-regret`` (``controlplane.replay.experts``)."""
REGRET_ARC = "wa-regret (wa-shared and lru and arc by regret)"
"""The same mix with ``arc`` as a third expert."""

REPLAY_ONLY: dict[str, tuple[str, ReplayFactory | None]] = {
    MIXTURE: ("wa-mix", None),
    SHARED: ("wa-shared", None),
    SHARED_SHRUNK: ("wa-shared:shrinkage 500", wa_shared_shrunk),
    REGRET: ("wa-regret", None),
    REGRET_ARC: ("wa-regret:lru+arc", experts.regret_wa("lru", "arc")),
    **PACE,
    **SUPERSEDED,
}
"""The rows of replay-only policies of their own, not options of ``wa``: label -> the
name it replays under and the factory to register it with (None: in the catalogue)."""


def register_replay_only(label: str) -> str:
    """Register the policy of a ``REPLAY_ONLY`` row (before the runner forks); its name."""
    name, factory = REPLAY_ONLY[label]
    if factory is not None:
        catalog.register_offline(name)(factory)
    return name


def report(trace: Trace, jobs: int, defaults: ReplayOptions, chosen: Sequence[str]) -> str:
    labels: dict[str, str] = {}
    for label in chosen:
        if label in REPLAY_ONLY:
            labels[register_replay_only(label)] = label
            continue
        v = Variant(f"{trace.name}:{label}", "wa", "censored", VARIANTS[label](defaults))
        labels[v.register()] = label
    order = [*BASELINES, *labels, "belady"]
    rows = run(trace, order, jobs, defaults)
    title = f"{trace.name}, categories {defaults.categories}, online refits"
    shown = {n: labels.get(n, n) for n in order}
    return "\n\n".join(
        [
            table(title, {n: rows[n] for n in order}, shown),
            best_table(rows, labels),
            gap_table(f"{trace.name}: share of the lru -> Belady gap closed", rows, labels),
        ]
    )


def main(argv: Sequence[str] | None = None) -> None:
    ap = synthetic_trace_parser(__doc__)
    ap.add_argument("--profiles", default="to-c,to-b")
    ap.add_argument("--mooncake", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--fracs", default="0.01,0.02,0.05,0.1,0.2,0.4")
    ap.add_argument(
        "--variants", default=",".join([*VARIANTS, *REPLAY_ONLY]), help="labels, comma-separated"
    )
    args = ap.parse_args(argv)
    FRACS[:] = [float(f) for f in args.fracs.split(",")]
    chosen = [v for v in args.variants.split(",") if v]
    defaults = ReplayOptions()
    traces = report_traces(args, defaults)
    for trace, options in traces:
        print(headline(trace))
        print(report(trace, args.jobs, options, chosen), flush=True)
    print(f"seed {args.seed}, {args.duration:.0f} s at {args.qps} QPS", file=sys.stderr)


if __name__ == "__main__":
    main()

"""``auto``'s selection over time in chosen cells: each judged window's shadow reading,
the selector's word, the family ``auto`` ran, and what each candidate family's full cache
scored over the same window (docs/policy.md, "A policy that selects itself").

Run (not collected by pytest)::

    python -m tests.bench.auto_timeline --seed 2027 --duration 3600 \\
        --cell to-b:0.02 --cell mooncake:0.4 --also reuse_class=hit

Each cell is a trace (``to-c``, ``to-b``: synthetic, ``controlplane.traces.synth``;
``mooncake``: the bundled sample, inferred categories) and a capacity as a share of its
unique blocks. Each candidate family is replayed alone at that capacity, then ``auto``
(``wa`` and ``auto`` with ``--also``'s options); a row per judged window gives the
requests it covers, the family in force while they were served and ``auto``'s own hit
ratio over them, each family's shadow reading and full figure, and the selector's
reason. It only reads replays; results go to stdout.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from dataclasses import replace
from itertools import pairwise

import numpy as np
from numpy.typing import NDArray

from agent.policy_document import DEFAULT_FAMILY
from controlplane.replay import catalog
from controlplane.replay.engine import replay_hits
from controlplane.replay.options import ReplayOptions
from controlplane.shadow.auto_replay import AutoReplayPolicy
from controlplane.shadow.selection import SelectionView
from controlplane.shadow.settings import ShadowSettings
from controlplane.traces.model import Trace
from controlplane.traces.reader import load_trace
from controlplane.traces.synth import synthesize
from tests.bench.ablation import MOONCAKE, synthetic_trace_parser
from tests.bench.auto_report import add_variant_option, setting

FAMILIES = (DEFAULT_FAMILY, *ShadowSettings().baselines)
"""``auto``'s candidates: ``wa`` and the controller's default shadow baselines."""
Hits = NDArray[np.int64]


def trace_of(name: str, seed: int, duration: float, qps: float) -> Trace:
    if name == "mooncake":
        return load_trace(MOONCAKE)
    return synthesize("to-c" if name == "to-c" else "to-b", duration_s=duration, qps=qps, seed=seed)


def windowed(hits: Hits, lengths: Hits, bounds: Sequence[int]) -> list[float]:
    """Hit ratio over each span of requests ``bounds[i]:bounds[i+1]``."""
    return [ratio(hits[lo:hi], lengths[lo:hi]) for lo, hi in pairwise(bounds)]


def ratio(hits: Hits, lengths: Hits) -> float:
    accesses = int(lengths.sum())
    return int(hits.sum()) / accesses if accesses else 0.0


def timeline(trace: Trace, frac: float, options: ReplayOptions) -> str:
    """The cell's heading, then one row per judged window and one for the trace's tail."""
    capacity = trace.capacity_for(frac)
    lengths = trace.lengths
    full = {
        f: replay_hits(trace, catalog.create(f, capacity, trace, options), capacity)
        for f in FAMILIES
    }
    auto = AutoReplayPolicy(capacity, trace, options)
    auto_hits = replay_hits(trace, auto, capacity)
    overall = ", ".join(f"{f} {ratio(h, lengths):.4f}" for f, h in full.items())
    bounds = [0, *(r for r, _ in auto.verdicts), trace.n_requests]
    spans = {f: windowed(h, lengths, bounds) for f, h in full.items()}
    rows = zip(pairwise(bounds), windowed(auto_hits, lengths, bounds), strict=True)
    views: list[SelectionView | None] = [v for _, v in auto.verdicts]
    lines = [
        f"{trace.name} at {frac:.0%} ({capacity:,} blocks): "
        f"auto {ratio(auto_hits, lengths):.4f}, {overall}",
        "",
        "| requests | in force | auto | "
        + " | ".join(f"{f} shadow / full" for f in FAMILIES)
        + " | the selector's word |",
        "|---|---|---:|" + "---:|" * len(FAMILIES) + "---|",
    ]
    family, t0 = DEFAULT_FAMILY, float(trace.timestamps[0])
    for i, (((lo, hi), own), view) in enumerate(zip(rows, [*views, None], strict=True)):
        word = (
            "(the trace ends)"
            if view is None
            else f"at {view.window_end - t0:.0f} s: {view.reason}"
        )
        cells = shadow_and_full(view, {f: spans[f][i] for f in FAMILIES})
        lines.append(f"| {lo:,}-{hi:,} | {family} | {own:.4f} | {cells} | {word} |")
        family = view.chosen if view is not None else family
    return "\n".join(lines)


def shadow_and_full(view: SelectionView | None, full: dict[str, float]) -> str:
    """Each family's shadow reading in ``view`` (``-``: none) and full figure."""
    shadow = view.hit_ratios if view is not None else {}
    return " | ".join(
        f"{shadow[f]:.4f} / {full[f]:.4f}" if f in shadow else f"- / {full[f]:.4f}"
        for f in FAMILIES
    )


def cell(text: str) -> tuple[str, float]:
    """``to-b:0.02`` as a trace name and a share of its unique blocks."""
    name, _, share = text.partition(":")
    try:
        value = float(share)
    except ValueError:
        value = math.nan
    if name not in ("to-c", "to-b", "mooncake") or not 0 < value <= 1:
        raise argparse.ArgumentTypeError(
            f"{text!r}: a cell is TRACE:SHARE, TRACE to-c, to-b or mooncake, SHARE in (0, 1]"
        )
    return name, value


def main(argv: Sequence[str] | None = None) -> None:
    ap = synthetic_trace_parser(__doc__)
    ap.add_argument("--cell", type=cell, action="append", required=True, metavar="TRACE:SHARE")
    add_variant_option(ap, "--also", "replay options for auto and wa, e.g. reuse_class=hit")
    args = ap.parse_args(argv)
    options = ReplayOptions()
    for text in args.also:
        options = replace(options, **dict(map(setting, text.split(","))))
    for name, share in args.cell:
        trace = trace_of(name, args.seed, args.duration, args.qps)
        run = replace(options, categories="auto") if name == "mooncake" else options
        print(timeline(trace, share, run), "\n", flush=True)


if __name__ == "__main__":
    main()

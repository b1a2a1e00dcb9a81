"""``auto`` against every baseline and ``wa`` (docs/policy.md, "A policy that selects
itself"), and the selection of its settings.

Run (not collected by pytest)::

    python -m tests.bench.auto_report --select --seed 7 --duration 1800   # choose settings
    python -m tests.bench.auto_report --seed 2024 --duration 3600         # report

``--select`` replays a grid of ``auto`` settings (shadow rate, window, windows in a row,
margin) on synthetic to-C and to-B traces of the selection seed and ranks them by the
number of (trace, capacity) cells where they meet the issue's goal (at least the best
baseline less 0.001; strictly above it at 1-5 % on to-C), then by the mean difference
to the best baseline. The report replays lru, fifo, lfu, s3fifo, sieve, arc, ``wa`` and ``auto``
(``ReplayOptions`` defaults: the chosen settings) at 1, 2, 5, 10, 20, 40 % of the unique
blocks on synthetic to-C and to-B traces of another seed and on the bundled Mooncake
sample (inferred categories), and marks the issue's goals met or not. Everything is
synthetic (``controlplane.traces.synth``; the Mooncake sample is the Mooncake authors'
synthetic workload). Results go to stdout; progress to stderr.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from collections.abc import Sequence
from dataclasses import fields, replace
from typing import Any

from agent.policies.base import EvictionPolicy
from controlplane.replay import catalog
from controlplane.replay.options import ReplayOptions
from controlplane.shadow.auto_replay import AutoReplayPolicy
from controlplane.traces.model import Trace
from controlplane.traces.reader import load_trace
from controlplane.traces.synth import synthesize
from tests.bench import ablation
from tests.bench.ablation import BASELINES, MOONCAKE, headline, synthetic_trace_parser

FRACS = [0.01, 0.02, 0.05, 0.1, 0.2, 0.4]
GRID = {
    "auto_rate": [1.0],
    "auto_window_s": [300.0],
    "auto_windows": [1, 2],
    "auto_margin": [0.001, 0.003, 0.005, 0.01],
}
TOLERANCE = 0.001
"""The goal: ``auto`` at least the best baseline less this, at every capacity."""
STRICT = (0.01, 0.02, 0.05)
"""Capacities where ``auto`` must be strictly above the best baseline (to-C, Mooncake)."""


AUTO_FIELDS = tuple(f.name for f in fields(ReplayOptions) if f.name.startswith("auto_"))


def register(overrides: dict[str, Any]) -> str:
    """``auto`` with ``overrides`` of the run's options as a replay policy of its own
    (before the runner forks); everything else comes from the run's options (categories
    inferred on the Mooncake sample)."""
    shown = {k: v for k, v in overrides.items() if k in _SHORT or not k.startswith("auto_")}
    name = "auto[" + ",".join(f"{_SHORT.get(k, k)}={_text(v)}" for k, v in shown.items()) + "]"

    def factory(capacity: int, trace: Trace, run: ReplayOptions) -> EvictionPolicy:
        return AutoReplayPolicy(capacity, trace, replace(run, **overrides))

    catalog.register_offline(name)(factory)
    return name


_SHORT = {
    "auto_rate": "r",
    "auto_window_s": "w",
    "auto_windows": "n",
    "auto_margin": "m",
    "auto_supersede": "supersede",
    "auto_wa": "wa",
    "auto_switch": "switch",
}


def auto_settings(options: ReplayOptions) -> dict[str, Any]:
    """``options``'s ``auto_*`` fields."""
    return {f: getattr(options, f) for f in AUTO_FIELDS}


def _text(value: object) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def replays(
    trace: Trace, names: Sequence[str], jobs: int, options: ReplayOptions
) -> dict[str, list[float]]:
    """Every policy at every capacity of ``FRACS`` (the ablation's runner)."""
    ablation.FRACS[:] = FRACS
    return ablation.run(trace, names, jobs, options)


def best_baseline(rows: dict[str, list[float]], i: int) -> str:
    return max(BASELINES, key=lambda b: rows[b][i])


def select(seed: int, duration: float, qps: float, jobs: int) -> None:
    defaults = ReplayOptions()
    grid = [
        replace(defaults, **dict(zip(GRID, values, strict=True)))
        for values in itertools.product(*GRID.values())
    ]
    settings = list(dict.fromkeys([defaults, *grid]))  # the defaults in force, for comparison
    names = [register(auto_settings(s)) for s in settings]
    short: dict[str, list[float]] = {n: [] for n in names}
    met: dict[str, int] = dict.fromkeys(names, 0)
    for profile in ("to-c", "to-b"):
        trace = synthesize(profile, duration_s=duration, qps=qps, seed=seed)
        rows = replays(trace, [*BASELINES, "wa", *names], jobs, defaults)
        for i, frac in enumerate(FRACS):
            best = rows[best_baseline(rows, i)][i]
            strict = profile == "to-c" and frac in STRICT
            for n in names:
                short[n].append(rows[n][i] - best)
                met[n] += rows[n][i] > best if strict else rows[n][i] >= best - TOLERANCE
            print(f"  {profile} {frac:.0%}: best {best:.4f}, wa {rows['wa'][i]:.4f}")
    print("| setting | cells meeting the goal | worst vs best baseline | mean vs best baseline |")
    print("|---|---:|---:|---:|")
    ranked = sorted(names, key=lambda n: (met[n], sum(short[n])), reverse=True)
    for n in ranked:
        mean = sum(short[n]) / len(short[n])
        print(f"| {n} | {met[n]} of {len(short[n])} | {min(short[n]):+.4f} | {mean:+.4f} |")


def report_table(title: str, rows: dict[str, list[float]], strict: bool) -> str:
    head = "| policy | " + " | ".join(f"{f:.0%}" for f in FRACS) + " |"
    lines = [f"{title}", "", head, "|---|" + "---:|" * len(FRACS)]
    for name, values in rows.items():
        lines.append(f"| {name} | " + " | ".join(f"{x:.4f}" for x in values) + " |")
    for auto in (n for n in rows if n.startswith("auto")):
        lines += ["", f"| capacity | best baseline | {auto} | wa | {auto} - best | goal |"]
        lines.append("|---|---|---:|---:|---:|---|")
        lines += [goal_row(rows, auto, i, strict) for i in range(len(FRACS))]
    return "\n".join(lines)


def goal_row(rows: dict[str, list[float]], auto: str, i: int, strict: bool) -> str:
    """One capacity's line: ``auto`` against the best baseline, the goal met or not."""
    frac, best = FRACS[i], best_baseline(rows, i)
    b, a = rows[best][i], rows[auto][i]
    met = a >= b - TOLERANCE and (not strict or frac not in STRICT or a > b)
    need = "> best" if strict and frac in STRICT else f">= best - {TOLERANCE}"
    return (
        f"| {frac:.0%} | {best} {b:.4f} | {a:.4f} | {rows['wa'][i]:.4f} | {a - b:+.4f} "
        f"| {need}: **{'MET' if met else 'NOT MET'}** |"
    )


def report(seed: int, duration: float, qps: float, jobs: int, also: Sequence[str]) -> None:
    defaults = ReplayOptions()
    variants = list(register_variants(also))
    names = [*BASELINES, "wa", "auto", *variants]
    print(f"defaults: {defaults}", file=sys.stderr)
    for profile, strict in (("to-c", True), ("to-b", False)):
        trace = synthesize(profile, duration_s=duration, qps=qps, seed=seed)
        print(headline(trace))
        print(report_table(f"{trace.name}", replays(trace, names, jobs, defaults), strict))
    trace = load_trace(MOONCAKE)
    inferred = replace(defaults, categories="auto")
    print(f"\n{trace.name} (inferred categories): {trace.n_requests:,} requests\n")
    print(report_table(trace.name, replays(trace, names, jobs, inferred), True))


def main(argv: Sequence[str] | None = None) -> None:
    ap = synthetic_trace_parser(__doc__)
    ap.add_argument("--select", action="store_true", help="rank the settings grid instead")
    add_variant_option(
        ap,
        "--also",
        "report beside auto a variant with other replay options, e.g. "
        "auto_margin=0.005,auto_windows=2 or reuse_class=hit",
    )
    args = ap.parse_args(argv)
    if args.select:
        select(args.seed, args.duration, args.qps, args.jobs)
    else:
        report(args.seed, args.duration, args.qps, args.jobs, args.also)


def add_variant_option(ap: argparse.ArgumentParser, flag: str, help_text: str) -> None:
    """A repeatable ``flag FIELD=VALUE,...``: ``auto`` with those replay options."""
    ap.add_argument(flag, action="append", default=[], metavar="FIELD=VALUE,...", help=help_text)


def register_variants(texts: Sequence[str]) -> dict[str, str]:
    """``auto`` with each ``FIELD=VALUE,...`` of ``texts`` registered: its name -> the text."""
    return {register(dict(map(setting, text.split(",")))): text for text in texts}


def setting(text: str) -> tuple[str, Any]:
    """``auto_margin=0.002`` (or ``reuse_class=hit``) as a ``ReplayOptions`` field and its
    value."""
    field, _, value = text.partition("=")
    if field not in {f.name for f in fields(ReplayOptions)}:
        raise SystemExit(f"--also: {field!r} is not a ReplayOptions field")
    try:
        number = float(value)
    except ValueError:
        return field, value
    return field, int(number) if field == "auto_windows" else number


if __name__ == "__main__":
    main()

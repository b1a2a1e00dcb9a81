"""What ``kvwise replay`` prints: its tables (folded at the terminal's width), its JSON
document and its ``--plot`` figure; after a Ctrl-C, the runs that had finished, which did
not, and exit code 130.

Owns the command's output only: it never replays, reads a trace or parses an option
(``controlplane.cli.replay_cmd`` does), and never computes a hit ratio itself.
"""

from __future__ import annotations

from pathlib import Path
from textwrap import wrap
from typing import TYPE_CHECKING, NamedTuple

import typer

from controlplane.cli.common import (
    counted,
    exit_interrupted,
    fail,
    note_no_eviction,
    note_one_category,
    print_json,
    say,
    trace_json,
)
from controlplane.cli.tables import Column, FoldedTable

if TYPE_CHECKING:
    from rich.console import Console

    from controlplane.replay.engine import ReplayResult
    from controlplane.replay.options import ReplayOptions
    from controlplane.traces.model import Trace

NOT_RUN = "-"
"""A table cell whose run did not finish (Ctrl-C)."""


class Runs(NamedTuple):
    """What the replay gave: every run's result, or after a Ctrl-C those that finished."""

    results: list[ReplayResult]
    not_finished: list[tuple[str, int]]
    """The (policy, capacity) runs a Ctrl-C cut, in the order they were asked for."""


def end_interrupted(runs: Runs) -> None:
    """After the finished runs' results: which runs did not finish, and exit code 130."""
    sizes: dict[str, list[str]] = {}
    for policy, capacity in runs.not_finished:
        sizes.setdefault(policy, []).append(f"{capacity:,}")
    cut = "; ".join(f"{p} at {', '.join(c)} blocks" for p, c in sizes.items())
    total = len(runs.results) + len(runs.not_finished)
    exit_interrupted(
        f"replay: interrupted after {len(runs.results)}/{total} runs done; not finished: {cut}"
    )


def report(
    trace_path: Path,
    trace: Trace,
    names: list[str],
    capacities: list[int],
    runs: Runs,
    options: ReplayOptions,
    top_categories: int,
    json_out: bool,
) -> None:
    """The results as JSON on stdout, or as tables."""
    if json_out:
        print_json(_json_doc(trace_path, trace, options, runs))
        return
    _print_tables(trace, names, capacities, runs.results, top_categories, options)
    note_one_category(trace, names, options.categories)
    note_no_eviction(trace, capacities)


def plot_curve(path: Path | None, trace: Trace, runs: Runs) -> None:
    """The figure ``--plot`` asks for (none after a Ctrl-C: its curves would lack points)."""
    if path is None:
        return
    if runs.not_finished:
        say(f"--plot: {path} not drawn (interrupted)")
        return
    from controlplane.plots.capacity_curve import write_capacity_curve

    title = f"Block hit ratio by cache size: {trace.name}"
    try:
        write_capacity_curve(path, runs.results, trace.n_unique, title)
    except OSError as exc:
        fail(f"--plot: {path}: {exc.strerror or exc}")
    typer.echo(f"wrote {path}", err=True)


def _json_doc(
    trace_path: Path, trace: Trace, options: ReplayOptions, runs: Runs
) -> dict[str, object]:
    """The JSON output; after a Ctrl-C, ``not_finished`` names the runs it cut."""
    cut = [{"policy": p, "capacity": c} for p, c in runs.not_finished]
    return {
        **trace_json(trace_path, trace),
        "options": options.to_json(),
        "scored": _scored(trace, options),
        "results": [r.to_json() for r in runs.results],
        **({"not_finished": cut} if cut else {}),
    }


def _scored(trace: Trace, options: ReplayOptions) -> dict[str, object]:
    """Which requests every hit ratio of the run counts."""
    start = options.first_scored(trace)
    note = (
        "hit ratios count every request"
        if start == 0
        else f"hit ratios count only requests {start}..{trace.n_requests - 1} (0-based), "
        f"the {1 - options.split:.0%} after the fitted part; the fitted part is replayed, "
        "not scored"
    )
    return {
        "first_request": start,
        "requests": trace.n_requests - start,
        "accesses": int(trace.lengths[start:].sum()),
        "part": "all" if start == 0 else "after split",
        "note": note,
    }


def _print_tables(
    trace: Trace,
    names: list[str],
    capacities: list[int],
    results: list[ReplayResult],
    top: int,
    options: ReplayOptions,
) -> None:
    from rich.console import Console

    console = Console()
    by = {(r.policy, r.capacity): r for r in results}
    console.print(
        f"[bold]{trace.name}[/]: {counted(trace.n_requests, 'request')}, "
        f"{counted(trace.n_accesses, 'block access', 'block accesses')}, "
        f"{counted(trace.n_unique, 'unique block')}"
    )
    split_mode = options.first_scored(trace) > 0
    if split_mode:
        console.print(f"[bold yellow]split mode[/]: {_scored(trace, options)['note']}")
    table = FoldedTable(
        title="Block hit ratio" + (" (scored part only)" if split_mode else ""),
        keys=[Column("policy", "left")],
        values=[Column(f"{counted(c, 'block')}\n({c / trace.n_unique:.1%})") for c in capacities],
    )
    for name in names:
        table.add_row([name], [_ratio_cell(by.get((name, c))) for c in capacities])
    table.print(console)
    for note, runs in _runs_by_note(results).items():
        said = _hanging(f"{_runs_named(runs, capacities)}: {note}", console.width)
        console.print(said, highlight=False, soft_wrap=True)
    if len(trace.category_names) > 1 and top > 0:
        ran = [c for c in capacities if any((n, c) in by for n in names)]  # Ctrl-C: not all
        _print_category_tables(console, names, ran, by, top)


def _runs_by_note(results: list[ReplayResult]) -> dict[str, dict[str, list[int]]]:
    """Each note once, with the runs that gave it (policy: capacities), in the order the
    runs came: a short trace gave every fitted policy at every size the same note, and
    printed alone each one filled a screen."""
    runs: dict[str, dict[str, list[int]]] = {}
    for r in results:
        for note in r.notes:
            runs.setdefault(note, {}).setdefault(r.policy, []).append(r.capacity)
    return runs


def _runs_named(runs: dict[str, list[int]], capacities: list[int]) -> str:
    """``wa, wa-ref at every size`` or ``wa at 500 / 900 blocks; auto at 500 blocks``:
    the policies that share the same sizes named together."""
    policies_of: dict[tuple[int, ...], list[str]] = {}
    for policy, sizes in runs.items():
        policies_of.setdefault(tuple(sizes), []).append(policy)
    return "; ".join(
        f"{', '.join(policies)} at {_sizes(list(sizes), capacities)}"
        for sizes, policies in policies_of.items()
    )


def _sizes(sizes: list[int], capacities: list[int]) -> str:
    if len(sizes) > 1 and sorted(sizes) == sorted(capacities):
        return "every size"
    if len(sizes) == 1:
        return counted(sizes[0], "block")
    return f"{' / '.join(f'{c:,}' for c in sizes)} blocks"


def _hanging(text: str, width: int) -> str:
    """``text`` wrapped between words at ``width`` (80 at most), its later lines indented
    so that each note stands apart from the next."""
    lines = wrap(
        text, min(width, 80), subsequent_indent="  ", break_long_words=False, break_on_hyphens=False
    )
    return "\n".join(lines)


def _print_category_tables(
    console: Console,
    names: list[str],
    capacities: list[int],
    by: dict[tuple[str, int], ReplayResult],
    top: int,
) -> None:
    per_category = next(iter(by.values())).per_category
    cats = sorted(per_category, key=lambda k: -per_category[k].accesses)[:top]
    for c in capacities:
        table = FoldedTable(
            title=f"Per-category hit ratio at {counted(c, 'block')} (top {len(cats)} by accesses)",
            keys=[Column("category", "left"), Column("accesses")],
            values=[Column(n) for n in names],
        )
        for cat in cats:
            table.add_row(
                [cat, f"{per_category[cat].accesses:,}"],
                [_ratio_cell(by.get((n, c)), cat) for n in names],
            )
        table.print(console)


def _ratio_cell(result: ReplayResult | None, category: str | None = None) -> str:
    """A run's hit ratio (of ``category``), or ``NOT_RUN`` for a run a Ctrl-C cut."""
    if result is None:
        return NOT_RUN
    if category is None:
        return f"{result.hit_ratio:.4f}"
    return f"{result.per_category[category].hit_ratio:.3f}"

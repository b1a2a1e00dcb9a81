"""``kvwise replay``: judge eviction policies on a trace.

Owns the command's options, progress display and output (table or JSON). The replay
itself is ``controlplane.replay``; trace reading is ``controlplane.traces.reader``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from controlplane.cli.common import fail, load_trace_or_fail, parse_fracs, parse_ints, split_list


def register(app: typer.Typer) -> None:
    app.command("replay")(replay)


def replay(
    trace_path: Annotated[
        Path, typer.Argument(metavar="TRACE", help="Bailian or Mooncake JSONL trace (.gz ok)")
    ],
    policy: Annotated[
        str,
        typer.Option(
            "--policy", "-p", help="Comma-separated policy names, or 'all' (every policy + bounds)"
        ),
    ] = "all",
    capacity: Annotated[
        str | None, typer.Option(help="Cache sizes in blocks, e.g. 5000,10000")
    ] = None,
    capacity_frac: Annotated[
        str | None,
        typer.Option(help="Cache sizes as fractions of the trace's unique blocks"),
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="One JSON object on stdout")] = False,
    jobs: Annotated[
        int, typer.Option("--jobs", "-j", help="Worker processes (0 = one per core)")
    ] = 0,
    skip_bad_lines: Annotated[
        bool, typer.Option(help="Skip malformed trace lines (counted) instead of stopping")
    ] = False,
    top_categories: Annotated[
        int, typer.Option(help="Categories shown per capacity in the table (by accesses)")
    ] = 8,
    refit_every: Annotated[
        float, typer.Option(help="wa/wa-ref online: refit every this many trace seconds")
    ] = 60.0,
    wa_fit: Annotated[
        str,
        typer.Option(
            help="online: refit as the replay goes; split: fit on the first --split of the "
            "requests, score every policy on the rest only"
        ),
    ] = "online",
    split: Annotated[
        float, typer.Option(help="Share of requests fitted on with --wa-fit split")
    ] = 0.5,
    categories: Annotated[
        str,
        typer.Option(help="labels: the trace's type_turn; auto: inferred from blocks and length"),
    ] = "labels",
    attribution: Annotated[
        str | None,
        typer.Option(help="wa: a block's category is its 'last' accessor's or its 'creator's"),
    ] = None,
    near_concurrent: Annotated[
        float | None, typer.Option(help="wa: reuse gaps below this many seconds are merged")
    ] = None,
    life: Annotated[
        float | None, typer.Option(help="wa: one life window (seconds) for every category")
    ] = None,
    reuse_class: Annotated[
        bool,
        typer.Option(
            help="wa: split each category by whether the block was accessed before "
            "(measured in docs/policy.md; the agent does not do it yet)"
        ),
    ] = False,
) -> None:
    """Replay TRACE through eviction policies at several cache sizes.

    Every request's hits are the longest cached prefix of its blocks; blocks are released
    tail first and the cache evicts down to capacity after each request (docs/replay.md).
    Belady (farthest next use) and an infinite cache are the reference bounds.

    Examples:

      kvwise replay trace.jsonl --capacity-frac 0.05,0.1,0.2,0.4

      kvwise replay mooncake_trace.jsonl -p lru,s3fifo --capacity 5000 --json

      kvwise replay trace.jsonl -p lru,wa,wa-ref --wa-fit split --split 0.5
    """
    from controlplane.replay import catalog

    if capacity and capacity_frac:
        fail("give --capacity or --capacity-frac, not both")
    options = _options(
        refit_every, wa_fit, split, categories, attribution, near_concurrent, life, reuse_class
    )
    names = catalog.names() if policy == "all" else split_list(policy, "--policy")
    known = set(catalog.names())
    unknown = [n for n in names if n not in known]
    if unknown:
        fail(f"unknown policy {unknown[0]!r}; known policies: {', '.join(catalog.names())}")
    trace = load_trace_or_fail(trace_path, skip_bad_lines=skip_bad_lines)
    if trace.n_requests == 0:
        fail(f"{trace_path}: no requests")
    if capacity:
        capacities = parse_ints(capacity, "--capacity")
    else:
        fracs = parse_fracs(capacity_frac or "0.05,0.1,0.2,0.4", "--capacity-frac")
        capacities = [max(1, round(f * trace.n_unique)) for f in fracs]

    results = _run_with_progress(trace, names, capacities, jobs, options, quiet=json_out)
    if json_out:
        doc: dict[str, Any] = {
            "trace": str(trace_path),
            "requests": trace.n_requests,
            "accesses": trace.n_accesses,
            "unique_blocks": trace.n_unique,
            "skipped_lines": len(trace.skipped_lines),
            "options": _options_json(options),
            "scored": _scored(trace, options),
            "results": [r.to_json() for r in results],
        }
        json.dump(doc, sys.stdout)
        sys.stdout.write("\n")
        return
    _print_tables(trace, names, capacities, results, top_categories, _scored(trace, options))


def _options(
    refit_every: float,
    wa_fit: str,
    split: float,
    categories: str,
    attribution: str | None,
    near_concurrent: float | None,
    life: float | None,
    reuse_class: bool,
) -> Any:
    from controlplane.replay.options import DEFAULT_ATTRIBUTION, ReplayOptions

    choices = {
        "--wa-fit": (wa_fit, ("online", "split")),
        "--categories": (categories, ("labels", "auto")),
    }
    if attribution is not None:
        choices["--attribution"] = (attribution, ("creator", "last"))
    for opt, (value, allowed) in choices.items():
        if value not in allowed:
            fail(f"{opt} must be one of {', '.join(allowed)}, got {value!r}")
    try:
        return ReplayOptions(
            refit_every_s=refit_every,
            wa_fit=wa_fit,  # type: ignore[arg-type]
            split=split,
            categories=categories,  # type: ignore[arg-type]
            attribution=attribution or DEFAULT_ATTRIBUTION,  # type: ignore[arg-type]
            near_concurrent_s=near_concurrent,
            life_s=life,
            reuse_class=reuse_class,
        )
    except ValueError as exc:
        fail(str(exc))


def _options_json(options: Any) -> dict[str, Any]:
    return {
        "refit_every_s": options.refit_every_s,
        "wa_fit": options.wa_fit,
        "split": options.split,
        "categories": options.categories,
        "attribution": options.attribution,
        "near_concurrent_s": options.near_concurrent_s,
        "life_s": options.life_s,
        "reuse_class": options.reuse_class,
    }


def _scored(trace: Any, options: Any) -> dict[str, Any]:
    """Which requests every hit ratio of the run counts."""
    start = options.first_scored(trace)
    return {
        "first_request": start,
        "requests": trace.n_requests - start,
        "accesses": int(trace.lengths[start:].sum()),
        "part": "all" if start == 0 else "after split",
        "note": "hit ratios count every request"
        if start == 0
        else f"hit ratios count only requests {start}..{trace.n_requests - 1} (0-based), "
        f"the {1 - options.split:.0%} after the fitted part; the fitted part is replayed, "
        "not scored",
    }


def _run_with_progress(
    trace: Any, names: list[str], capacities: list[int], jobs: int, options: Any, quiet: bool
) -> list[Any]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from controlplane.replay.runner import ReplayJob, run_matrix

    total = trace.n_requests * len(names) * len(capacities)
    # Small replays finish before a bar is worth drawing.
    if quiet or trace.n_accesses * len(names) * len(capacities) < 2_000_000:
        return run_matrix(trace, names, capacities, jobs=jobs or None, options=options)
    done: dict[ReplayJob, int] = {}
    with Progress(
        TextColumn("[bold]replay"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("requests"),
        TimeElapsedColumn(),
        transient=True,
        console=None,
    ) as bar:
        task = bar.add_task("replay", total=total)

        def progress(job: ReplayJob, n: int) -> None:
            done[job] = n
            bar.update(task, completed=sum(done.values()))

        return run_matrix(
            trace, names, capacities, jobs=jobs or None, progress=progress, options=options
        )


def _print_tables(
    trace: Any,
    names: list[str],
    capacities: list[int],
    results: list[Any],
    top: int,
    scored: dict[str, Any],
) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    by = {(r.policy, r.capacity): r for r in results}
    console.print(
        f"[bold]{trace.name}[/]: {trace.n_requests:,} requests, {trace.n_accesses:,} block "
        f"accesses, {trace.n_unique:,} unique blocks"
    )
    if scored["first_request"]:
        console.print(f"[bold yellow]split mode[/]: {scored['note']}")
    title = "Block hit ratio" + ("" if not scored["first_request"] else " (scored part only)")
    table = Table(title=title, title_justify="left")
    table.add_column("policy")
    for c in capacities:
        table.add_column(f"{c:,} blocks\n({c / trace.n_unique:.1%})", justify="right")
    for name in names:
        ratios = [by[(name, c)].hit_ratio for c in capacities]
        table.add_row(name, *(f"{x:.4f}" for x in ratios))
    console.print(table)
    if len(trace.category_names) <= 1 or top <= 0:
        return
    acc = next(iter(results)).per_category
    cats = sorted(acc, key=lambda k: -acc[k].accesses)[:top]
    for c in capacities:
        t = Table(
            title=f"Per-category hit ratio at {c:,} blocks (top {len(cats)} by accesses)",
            title_justify="left",
        )
        t.add_column("category")
        t.add_column("accesses", justify="right")
        for name in names:
            t.add_column(name, justify="right")
        for cat in cats:
            t.add_row(
                cat,
                f"{acc[cat].accesses:,}",
                *(f"{by[(n, c)].per_category[cat].hit_ratio:.3f}" for n in names),
            )
        console.print(t)

"""What ``kvwise simulate`` prints: its tables, its JSON document, its plot and its notes
when a cache size was one no instance evicted from, the fitted policies saw one category,
a cache of 0 blocks was asked for, or the simulated fleet falls behind the arrivals.

Owns the command's output only: it never runs a simulation, reads a trace or parses an
option (``controlplane.cli.simulate_cmd`` does).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from controlplane.cli.common import (
    COMPARE_SMALLER,
    counted,
    fail,
    note,
    note_one_category,
    print_json,
    signed_percent,
    trace_json,
)
from controlplane.cli.tables import print_even, print_titled

if TYPE_CHECKING:
    from rich.table import Table

    from controlplane.simulate.engine import SimOptions
    from controlplane.simulate.report import Latency, SimResult
    from controlplane.traces.model import Trace


def report(
    trace_path: Path,
    trace: Trace,
    options: SimOptions,
    block: int,
    results: list[SimResult],
    *,
    json_out: bool,
    plot: Path | None,
) -> None:
    if plot is not None:
        _plot(results, plot, f"{trace.name}, {options.profile.name} x {options.instances}")
    if json_out:
        print_json(_json_doc(trace_path, trace, options, block, results))
        return
    _print_tables(trace, options, block, results)
    note_one_category(trace, [r.policy for r in results], options.replay.categories)
    _note_nothing_evicted([r for r in results if not _unbounded(r) and not _cacheless(r)])
    _note_zero_blocks(results)
    _note_overload(trace, options, [r for r in results if not _cacheless(r)])


def _note_nothing_evicted(sized: list[SimResult]) -> None:
    """Say which cache sizes no instance ever evicted from, under any policy: every
    policy scores the same there (a frequent surprise when the default size, a GPU's KV
    pool, meets a small trace, or a trace spread over many instances)."""
    by_size: dict[int, bool] = {}
    for r in sized:
        by_size[r.capacity] = by_size.get(r.capacity, True) and r.evicted_blocks == 0
    whole = sorted(size for size, untouched in by_size.items() if untouched)
    if whole:
        sizes = ", ".join(f"{c:,}" for c in whole)
        note(
            f"no instance evicted a block from a cache of {sizes} blocks: each held all the "
            f"blocks it was sent, so every policy scores the same there. {COMPARE_SMALLER}"
        )


def _cacheless(r: SimResult) -> bool:
    """Whether ``r`` ran a sized policy in a cache of 0 blocks (``--capacity 0``)."""
    return r.capacity == 0 and not _unbounded(r)


def _note_zero_blocks(results: list[SimResult]) -> None:
    """Say what a cache of 0 blocks does, where one ran: it hits nothing, and it holds no
    running request's KV either, so each instance serves one request at a time. Its queue
    is that, not a fleet too small for the arrivals, so ``_note_overload`` leaves it out."""
    if any(_cacheless(r) for r in results):
        note(
            "a cache of 0 blocks can hit nothing: every prompt is computed in full there, "
            "whatever the policy. It holds no running request's KV either, so each "
            "instance serves one request at a time: its queue comes from that, not from "
            "too few --instances."
        )


OVERLOADED = 1.5
"""The last request started this many times the span of the arrivals after the first
arrived, or later: the queue grows, the fleet falls behind."""
MOSTLY = 0.5
"""Share of the mean QTTFT that queueing must reach for the note to call it mostly so."""


def _note_overload(trace: Trace, options: SimOptions, results: list[SimResult]) -> None:
    """Say when the fleet falls behind the arrivals: QTTFT is then mostly queueing, which
    grows with the trace's length rather than with what the cache saves. Judged by when
    the last request started, not finished (the last requests' decode is no backlog), and
    only where queueing is most of QTTFT."""
    span = float(trace.timestamps[-1] - trace.timestamps[0]) / options.speed
    behind = [
        r
        for r in results
        if r.last_start_s >= OVERLOADED * span and r.queue.mean >= MOSTLY * r.qttft.mean > 0
    ]
    if not behind:
        return
    worst = max(behind, key=lambda r: r.last_start_s)
    share = worst.queue.mean / worst.qttft.mean
    note(
        f"the fleet falls behind: the last request started {_span(worst.last_start_s)} after "
        f"the first arrived, for {_span(span)} of arrivals ({worst.policy} at "
        f"{counted(worst.capacity, 'block')}), and requests waited {_span(worst.queue.mean)} "
        f"in the queue on average ({share:.0%} of QTTFT), so QTTFT is mostly queueing. More "
        "--instances or a lower --speed models a fleet that keeps up."
    )


def _span(seconds: float) -> str:
    """Seconds for a note: whole ones from 10 s, three significant digits below."""
    if seconds >= 10:
        return f"{seconds:,.0f} s"
    if seconds >= 0.001:
        return f"{seconds:.3g} s"
    return "under 1 ms"


def _plot(results: list[SimResult], path: Path, title: str) -> None:
    from controlplane.plots.simulate import plot_simulation

    try:
        plot_simulation(results, path, title=title)
    except OSError as exc:
        fail(f"--plot: {path}: {exc.strerror or exc}")
    typer.echo(f"wrote {path}", err=True)


def _json_doc(
    trace_path: Path, trace: Trace, options: SimOptions, block: int, results: list[SimResult]
) -> dict[str, Any]:
    prof = options.profile
    return {
        **trace_json(trace_path, trace),
        "block_tokens": block,
        "profile": prof.model_dump(),
        "profile_kv_pool_blocks": prof.kv_pool_blocks(block),
        "options": {
            "instances": options.instances,
            "router": options.router,
            "speed": options.speed,
            "output_tokens_default": options.output_tokens,
            "affinity_slack": options.slack,
            "categories": options.replay.categories,
            "refit_every_s": options.replay.refit_every_s,
            "reuse_class": options.replay.reuse_class,
        },
        "results": [r.to_json() for r in results],
    }


def _seconds(column: list[float]) -> list[str]:
    """A column of seconds at one precision, the largest in at most six characters."""
    top = max(column, default=0.0)
    digits = 3 if top < 9.9995 else 1 if top < 999.95 else 0
    return [f"{x:.{digits}f}" for x in column]


def _columns(rows: list[list[float]]) -> list[list[str]]:
    """``rows`` of seconds as text, each column at its own single precision."""
    columns = [_seconds(list(column)) for column in zip(*rows, strict=True)]
    return [list(row) for row in zip(*columns, strict=True)] if columns else [[] for _ in rows]


def _unbounded(r: SimResult) -> bool:
    """Whether ``r``'s policy has no size (``inf``): its result is the same at every one."""
    from controlplane.simulate.engine import UNBOUNDED

    return r.policy in UNBOUNDED


def _shown(results: list[SimResult]) -> list[SimResult]:
    """The rows of the tables: a policy without a size (``inf``) once, not once a size."""
    seen: set[str] = set()
    rows = []
    for r in results:
        if _unbounded(r) and r.policy in seen:
            continue
        seen.add(r.policy)
        rows.append(r)
    return rows


def _blocks(r: SimResult) -> str:
    return "any" if _unbounded(r) else f"{r.capacity:,}"


VS_LRU = "vs lru: change of mean QTTFT from lru's at this size; - is faster"
"""The QTTFT table's caption: the column sits beside the hit ratio, where +0.9% would
read as better."""


def _print_tables(trace: Trace, options: SimOptions, block: int, results: list[SimResult]) -> None:
    from rich.console import Console

    console = Console()
    prof = options.profile
    print_even(
        console,
        f"[bold]{trace.name}[/]: {counted(trace.n_requests, 'request')}, "
        f"{counted(trace.n_accesses, 'block')} of {block} tokens, {trace.n_unique:,} unique",
    )
    print_even(
        console,
        f"{prof.name} x {options.instances} ({options.router}), speed x{options.speed:g}; "
        f"its KV pool holds {prof.kv_pool_blocks(block):,} blocks per instance",
    )
    rows = _shown(results)
    lru = {r.capacity: r.qttft.mean for r in results if r.policy == "lru"}
    q = _table(["hit", "mean", "p50", "p90", "p99"])
    if lru:
        q.add_column("vs lru", justify="right")
    for r, cells in zip(rows, _columns([_quad(r.qttft) for r in rows]), strict=True):
        row = [f"{r.hit_ratio:.3f}", *cells]
        base = None if _unbounded(r) else lru.get(r.capacity)
        if lru:
            row.append(signed_percent(r.qttft.mean / base - 1) if base else "-")
        q.add_row(r.policy, _blocks(r), *row)
    print_titled(console, "QTTFT = queue + time to first token (s)", q, VS_LRU if lru else "")
    t = _table(["mean", "p50", "p90", "p99", "queue", "q p99"])
    times = [[*_quad(r.ttft), r.queue.mean, r.queue.p99] for r in rows]
    for r, cells in zip(rows, _columns(times), strict=True):
        t.add_row(r.policy, _blocks(r), *cells)
    print_titled(console, "TTFT and queue (s)", t)
    s = _table(["saved", "tokens", "out tok/s", "req/s", "wall s"])
    for r in rows:
        s.add_row(
            r.policy,
            _blocks(r),
            f"{r.saved_ratio:.1%}",
            f"{r.saved_tokens:,}",
            f"{r.output_tokens_per_s:,.0f}",
            f"{r.requests_per_s:.2f}",
            f"{r.seconds:.1f}",
        )
    print_titled(console, "Prefill saved and throughput", s)


def _table(columns: list[str]) -> Table:
    """A table of these columns after policy and blocks; its title and caption are
    printed outside it (``print_titled``)."""
    from rich.table import Table

    t = Table()
    t.add_column("policy")
    t.add_column("blocks", justify="right")
    for c in columns:
        t.add_column(c, justify="right")
    return t


def _quad(lat: Latency) -> list[float]:
    return [lat.mean, lat.p50, lat.p90, lat.p99]

"""``kvwise trace``: synthesize traces, record live traffic, print workload statistics.

Owns the ``trace`` command group (``record`` is ``controlplane.cli.trace_record_cmd``'s) and
the options and output of ``synth`` and ``stats`` (one summary line, a table, JSON,
or with ``--plot`` the paper's figures). Synthesis is ``controlplane.traces.synth``,
statistics ``controlplane.traces.workload_stats``, reading ``controlplane.traces.reader``,
writing ``controlplane.traces.writer`` and figures ``controlplane.plots.trace_figures``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, cast

import typer

from controlplane.cli.common import (
    JsonFlag,
    SkipBadLinesFlag,
    TraceArgument,
    check_names,
    check_plotting,
    check_writable,
    counted,
    fail,
    is_stream,
    load_trace_or_fail,
    positive,
    print_json,
    trace_json,
    whole_number,
)
from controlplane.cli.progress import Steps
from controlplane.cli.tables import even_wrap, print_titled
from controlplane.cli.trace_record_cmd import record

if TYPE_CHECKING:
    from rich.table import Table

    from controlplane.plots.trace_figures import Written
    from controlplane.traces.model import Trace
    from controlplane.traces.synth import Profile
    from controlplane.traces.workload_stats import Quantiles, TraceStats, WorkloadSamples

trace_app = typer.Typer(
    name="trace",
    help=(
        "Synthesize traces and characterize them the way the paper does.\n\n"
        "A trace is a Bailian or Mooncake JSONL file (.gz ok): synth writes one, stats "
        "describes one, record captures live workers' requests as one (docs/traces.md).\n\n"
        "Examples:\n\n"
        "    kvwise trace synth --profile to-c --duration 600 -o toc.jsonl.gz\n"
        "    kvwise trace stats toc.jsonl.gz --plot figures/"
    ),
    no_args_is_help=True,
)


def register(app: typer.Typer) -> None:
    app.add_typer(trace_app)


trace_app.command("record")(record)


MAX_SYNTH_REQUESTS = 120_000
"""Most requests one synthetic trace may draw, the warm-up before its window included
(``generated_requests``). A kept to-C request takes about 13 KB while the trace is built,
so the cap keeps the command under 2 GB (docs/traces.md)."""


STANDARD_OUTPUT = Path("/dev/stdout")
"""The name ``--output -`` goes by in messages: the trace itself goes to the standard output
already open, so the summary goes to standard error, as it does for any output that is
not a regular file."""


SeedOpt = Annotated[
    int,
    typer.Option(
        parser=whole_number(0), metavar="N", help="Random seed (0 or more): same seed, same trace"
    ),
]


@trace_app.command("synth")
def synth(
    output: Annotated[
        Path,
        typer.Option(
            "--output", "-o", help="Bailian JSONL file to write (.gz: gzip; -: standard output)"
        ),
    ],
    profile: Annotated[
        str,
        typer.Option(metavar="NAME", help="Workload: to-c (people chatting) or to-b (API calls)"),
    ] = "to-c",
    duration: Annotated[
        float,
        typer.Option(
            parser=positive,
            metavar="SECONDS",
            help="Trace seconds the requests' timestamps span (not how long it runs)",
        ),
    ] = 600.0,
    qps: Annotated[
        float, typer.Option(parser=positive, metavar="RATE", help="Mean requests per second")
    ] = 6.0,
    seed: SeedOpt = 0,
) -> None:
    """Write a synthetic Bailian trace calibrated to the paper's to-C or to-B workload.

    Synthetic data: use it to exercise policies, never as a measurement of the real
    traces (docs/traces.md, "Synthetic traces").

    Example:

        kvwise trace synth --profile to-c --duration 600 --seed 1 -o toc.jsonl.gz
    """
    from controlplane.traces.synth import PROFILES, Profile, synthesize
    from controlplane.traces.workload_stats import trace_stats

    check_names([profile], PROFILES, "--profile", "profile")
    to_stdout = str(output) == "-"
    output = STANDARD_OUTPUT if to_stdout else output
    check_writable(output, "--output")  # now: a large trace is minutes of work
    chosen = cast(Profile, profile)
    warmup = _warmup_within_the_cap(chosen, duration, qps)
    with Steps("trace synth") as steps:
        left = f"{output} left as it was"
        drawing = f"{duration:g} s at {qps:g} QPS, {warmup:,.0f} s warm-up, seed {seed}"
        steps.step(f"drawing {profile} requests", detail=drawing, cut=left)
        trace = synthesize(chosen, duration_s=duration, qps=qps, seed=seed)
        if not trace.n_requests:
            fail(f"--duration {duration:g} at --qps {qps:g} gave no request: ask for more")
        steps.step(f"writing {output}", cut=left)
        _write(trace, output, to_stdout=to_stdout)
        steps.step("counting its statistics", cut=f"{output} written whole")
        _say_written(output, trace_stats(trace), duration)


def _write(trace: Trace, output: Path, *, to_stdout: bool) -> None:
    """``trace`` written to ``output``, or (``-o -``) to the standard output already open,
    wherever the shell pointed it (a pipe, a file, appended to or not)."""
    from controlplane.traces.writer import write_bailian, write_bailian_stream

    try:
        if to_stdout:
            write_bailian_stream(trace, sys.stdout.buffer)
        else:
            write_bailian(trace, output)
    except OSError as exc:
        fail(f"{output}: {exc.strerror or exc}")


def _say_written(output: Path, s: TraceStats, duration: float) -> None:
    """The summary of a trace written to ``output``: on stderr where the trace itself
    went to a stream (a pipe, standard output), so the two never mix."""
    typer.echo(
        f"wrote {output}: {counted(s.requests, 'request')} over {duration:g} s\n"
        f"{counted(s.block_accesses, 'block access', 'block accesses')}, "
        f"{counted(s.unique_blocks, 'unique block')}; "
        f"ideal hit ratio {s.ideal_hit_ratio:.3f}",
        err=is_stream(output),
    )


def _warmup_within_the_cap(profile: Profile, duration: float, qps: float) -> float:
    """The seconds of warm-up drawn before the window; fail if the trace asked for would
    draw more than ``MAX_SYNTH_REQUESTS`` (the warm-up counted)."""
    from controlplane.traces.synth import generated_requests

    asked = generated_requests(profile, duration_s=duration, qps=qps)
    warmup = asked / qps - duration
    if asked > MAX_SYNTH_REQUESTS:
        fail(
            f"--duration x --qps asks for about {asked:,.0f} requests ({warmup:,.0f} s of "
            f"warm-up before the window included); at most {MAX_SYNTH_REQUESTS:,} in one trace"
        )
    return warmup


PlotDirOpt = Annotated[
    Path | None,
    typer.Option(
        "--plot",
        metavar="DIR",
        help="Also draw the paper's figures into DIR (PNG, 1000x625 px): reuse-time CDF "
        "per category, lifespan CDF, hit share by turn, skew. Needs the plot extra",
    ),
]


SAID_BY_THE_TRACE_SUMMARY = ("name", "block_accesses")
"""Fields of ``TraceStats`` that ``stats --json`` leaves out: the trace summary every
command's JSON opens with says them already, as ``trace`` (the path) and ``accesses``."""


@trace_app.command("stats")
def stats(
    trace_path: TraceArgument,
    json_out: JsonFlag = False,
    skip_bad_lines: SkipBadLinesFlag = False,
    plot: PlotDirOpt = None,
    top_categories: Annotated[
        int,
        typer.Option(
            parser=whole_number(0), metavar="N", help="Categories in the reuse-time table"
        ),
    ] = 10,
) -> None:
    """Characterize TRACE: ideal hit ratio, reuse times, lifespans, skew, turns, types.

    Definitions are in docs/traces.md; fields a format cannot support (Mooncake has no
    type or turn) print as "n/a" (null in JSON), and figures it cannot support are
    skipped with the reason.

    Examples:

        kvwise trace stats qwen_traceA_blksz_16.jsonl --json
        kvwise trace stats qwen_traceA_blksz_16.jsonl --plot figures/
    """
    from controlplane.traces.workload_stats import trace_stats, workload_samples

    if plot is not None:
        check_plotting("--plot", folder=plot)
    with Steps("trace stats", shown=False) as steps:  # reading shows its own status line
        steps.step(f"reading {trace_path}")
        trace = load_trace_or_fail(trace_path, skip_bad_lines=skip_bad_lines)
        steps.show_on_terminal()  # seconds on a large trace: say so, as reading did
        steps.step("counting its statistics")
        samples = workload_samples(trace)
        s = trace_stats(trace, samples)
        figures = None
        if plot is not None:
            steps.step(f"drawing figures into {plot}")
            figures = _plot(plot, trace, samples, top_categories)
    if figures is not None:  # said once the status line is gone, not through it
        _say_figures(figures)
    if json_out:
        said = s.to_json()
        for key in SAID_BY_THE_TRACE_SUMMARY:
            del said[key]
        print_json(trace_json(trace_path, trace) | said)
        return
    _print(s, top_categories)


def _plot(directory: Path, trace: Trace, samples: WorkloadSamples, top: int) -> Written:
    from controlplane.plots.trace_figures import write_trace_figures

    try:
        return write_trace_figures(directory, trace, samples, top_categories=max(top, 1))
    except OSError as exc:
        fail(f"--plot: {directory}: {exc.strerror or exc}")


def _say_figures(written: Written) -> None:
    for path in written.paths:
        typer.echo(f"wrote {path}", err=True)
    for name, why in written.skipped.items():
        typer.echo(f"skipped {name}:\n  {why}", err=True)


def _na(value: float | None, fmt: str = "{:.3f}") -> str:
    return "n/a" if value is None else fmt.format(value)


def _shares(d: dict[str, float] | None) -> list[str]:
    """Each share as ``name 12.3%``, the largest first (``n/a`` where there are none)."""
    if d is None:
        return ["n/a"]
    return [f"{k} {v:.1%}" for k, v in sorted(d.items(), key=lambda kv: -kv[1])]


def _print(s: TraceStats, top: int) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    summary = Table(show_header=False)
    # The labels stay whole; the values (the shares by type) wrap beside them.
    summary.add_column("statistic", no_wrap=True)
    summary.add_column("value", overflow="fold")
    rows: list[tuple[str, str | list[str]]] = [
        ("requests", f"{s.requests:,}"),
        ("block accesses", f"{s.block_accesses:,}"),
        ("unique blocks", f"{s.unique_blocks:,}"),
        ("duration", f"{s.duration_s:,.1f} s"),
        ("QPS", _na(s.qps, "{:.2f}")),
        ("mean input / output tokens",
         f"{_na(s.mean_input_tokens, '{:,.0f}')} / {_na(s.mean_output_tokens, '{:,.0f}')}"),
        ("ideal hit ratio (infinite cache)", f"{s.ideal_hit_ratio:.4f}"),
        ("requests giving 90% of hits", _na(s.skew_request_share, "{:.1%}")),
        ("hits from turn-1 requests", _na(s.single_turn_hit_share, "{:.1%}")),
        ("multi-turn share (turn >= 2)", _na(s.multi_turn_share, "{:.1%}")),
        ("  by type", _shares(s.multi_turn_share_by_type)),
        ("next-turn probability after turn 1", _na(s.next_turn_prob_first)),
        ("  by type", _shares(s.followup_share_by_type)),
        ("next-turn probability after later turns", _na(s.next_turn_prob_later)),
        ("type mix", _shares(s.type_mix)),
    ]  # fmt: skip
    # What is left of the width beside the labels: one space each side of each cell and
    # three borders. Shares break only between one and the next.
    room = console.width - max(len(label) for label, _ in rows) - 7
    for label, value in rows:
        summary.add_row(label, value if isinstance(value, str) else even_wrap(value, room))
    print_titled(console, f"{s.name} ({s.source_format})", summary)

    q = Table()
    for col in ("sample", "count", "P50", "P80", "P90", "P99"):
        q.add_column(col, justify="left" if col == "sample" else "right")
    _quantile_row(q, "reuse time, all", s.reuse_time)
    _quantile_row(q, "lifespan, reused blocks", s.lifespan)
    _quantile_row(q, "lifespan, all blocks", s.lifespan_all_blocks)
    cats = sorted(s.reuse_time_by_category.items(), key=lambda kv: -kv[1].count)
    for name, quant in cats[: max(top, 0)]:
        _quantile_row(q, f"reuse time, {name}", quant)
    print_titled(console, "Times (s): P50 / P80 / P90 / P99", q)


def _quantile_row(table: Table, label: str, q: Quantiles | None) -> None:
    if q is None:
        table.add_row(label, "0", "n/a", "n/a", "n/a", "n/a")
        return
    table.add_row(label, f"{q.count:,}", *(f"{x:,.3f}" for x in (q.p50, q.p80, q.p90, q.p99)))

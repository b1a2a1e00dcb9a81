"""``kvwise replay``: judge eviction policies on a trace.

Owns the command's options and the checks on them and its progress display (stderr); what
it prints is ``controlplane.cli.replay_output``. The replay itself is
``controlplane.replay``, trace reading ``controlplane.traces.reader`` and drawing
``controlplane.plots``. It must never compute a hit ratio itself.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from controlplane.cli.common import (
    JobsOpt,
    JsonFlag,
    SkipBadLinesFlag,
    TraceArgument,
    check_plotting,
    counted,
    fail,
    load_trace_or_fail,
    non_negative,
    open_fraction,
    parse_fracs,
    parse_ints,
    policy_names,
    positive,
    ratio,
    refuse_fit_options_unused,
    unique,
    whole_number,
)
from controlplane.cli.fitted_options import (
    CategoriesOpt,
    RefitEveryOpt,
    ReuseClassOpt,
    fitted_option,
)
from controlplane.cli.replay_output import Runs, end_interrupted, plot_curve, report
from controlplane.replay.options import (
    DEFAULT_OPTIONS,
    Attribution,
    AutoSupersede,
    AutoWA,
    FitMode,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from controlplane.replay.engine import ReplayResult
    from controlplane.replay.options import ReplayOptions
    from controlplane.traces.model import Trace

DEFAULT_FRACS = "0.05,0.1,0.2,0.4"
# Options grouped in the help by what they are about.
_sizes = partial(typer.Option, rich_help_panel="Policies and cache sizes")
_output = partial(typer.Option, rich_help_panel="Output")
_AUTO_PANEL = "auto (family selected by a shadow)"

KNOWN_POLICIES = (
    "arc, fifo, lfu, lru, s3fifo, sieve, wa, wa-ref, wa-mix, wa-pace, wa-superseded, "
    "wa-shared, wa-regret, auto, belady, inf"
)
"""The replay catalogue's names, for --help: the catalogue loads SciPy and the shadow
(seconds), so the command loads it when it runs (a test keeps the two the same)."""

PolicyOpt = Annotated[
    str,
    _sizes(
        "--policy",
        "-p",
        metavar="NAMES",
        help=f"Comma-separated policies, or 'all'. Known: {KNOWN_POLICIES}.",
    ),
]
BLOCK_SIZES = "a block is 16 tokens in Bailian traces, 512 in Mooncake's"
"""The trace formats' block sizes, for --help (a test keeps them the replay's)."""
CapacityOpt = Annotated[
    str | None,
    _sizes(metavar="BLOCKS", help=f"Cache sizes in blocks ({BLOCK_SIZES}), e.g. 5000,10000"),
]
CapacityFracOpt = Annotated[
    str | None,
    _sizes(
        metavar="FRACS",
        help=f"Cache sizes as shares of the trace's unique blocks [default: {DEFAULT_FRACS}]",
    ),
]
TopCategoriesOpt = Annotated[
    int, _output(parser=whole_number(0), metavar="N", help="Categories per table (by accesses)")
]
PlotOpt = Annotated[
    Path | None,
    _output(
        metavar="FILE.png",
        help="Also draw hit ratio against cache size per policy (PNG, 1000x625 px); "
        "runs belady and inf too if not named. Needs the plot extra",
    ),
]
WaFitOpt = Annotated[
    FitMode,
    fitted_option(
        help="online: refit as the replay goes; split: fit on the first --split of the "
        "requests, score every policy on the rest only"
    ),
]
SplitOpt = Annotated[
    float | None,
    fitted_option(
        parser=open_fraction,
        metavar="SHARE",
        help=f"Share fitted on with --wa-fit split [default: {DEFAULT_OPTIONS.split:g}]",
    ),
]
AttributionOpt = Annotated[
    Attribution | None,
    fitted_option(
        help="A block's category is its last accessor's or its creator's [default: last]"
    ),
]
NearConcurrentOpt = Annotated[
    float | None,
    fitted_option(parser=non_negative, metavar="SECONDS", help="Reuse gaps below this are merged"),
]
LifeOpt = Annotated[
    float | None,
    fitted_option(parser=positive, metavar="SECONDS", help="One life window for every category"),
]
ShrinkageOpt = Annotated[
    float | None,
    fitted_option(
        parser=non_negative,
        metavar="SAMPLES",
        help="Pseudo-samples of the pooled fit in each category's fit (docs/fitting.md)",
    ),
]


def _share(text: str) -> float:
    """Typer parser of a share in (0, 1]."""
    value = positive(text)
    if value > 1:
        raise typer.BadParameter(f"must be in (0, 1], got {text}")
    return value


def _auto(field: str, **option: Any) -> Any:
    """An option of ``auto``, listed in its own panel of the help; its default is
    ``DEFAULT_OPTIONS``'s ``field``, said in the help, so that the option is None unless
    given (``_auto_fields`` refuses one given without ``auto``, as ``--split`` is)."""
    default = getattr(DEFAULT_OPTIONS, field)
    shown = default if isinstance(default, str) else f"{default:g}"
    help_text = f"{option.pop('help')} [default: {shown}]"
    return typer.Option(rich_help_panel=_AUTO_PANEL, help=help_text, **option)


AutoRateOpt = Annotated[
    float | None,
    _auto(
        "auto_rate", parser=_share, metavar="SHARE", help="Share of prefix trees the shadow keeps"
    ),
]
AutoWindowOpt = Annotated[
    float | None,
    _auto(
        "auto_window_s",
        parser=positive,
        metavar="SECONDS",
        help="Trace seconds of one shadow window",
    ),
]
AutoWindowsOpt = Annotated[
    int | None,
    _auto(
        "auto_windows",
        parser=whole_number(1, 1000),
        metavar="N",
        help="Windows in a row a family must lead to be selected (1 to 1000)",
    ),
]
AutoMarginOpt = Annotated[
    float | None,
    _auto("auto_margin", parser=ratio, metavar="RATIO", help="Hit ratio a family must lead by"),
]
AutoMinAccessesOpt = Annotated[
    int | None,
    _auto(
        "auto_min_accesses",
        parser=whole_number(0),
        metavar="N",
        help="Sampled accesses a window needs to count",
    ),
]
AutoSupersedeOpt = Annotated[
    AutoSupersede | None,
    _auto(
        "auto_supersede",
        help="tree: auto's wa evicts superseded branches first while in force, as a vLLM "
        "worker under the document's supersede: tree, and its shadow's wa does too; off: "
        "neither does",
    ),
]
AutoWAOpt = Annotated[
    AutoWA | None,
    _auto(
        "auto_wa",
        help="wa-shared: auto's wa family is the replay-only wa-shared (shared prefixes at "
        "their own reuse rate, reuse classes by hit), shadowed as served; wa: the agent's",
    ),
]


def register(app: typer.Typer) -> None:
    app.command("replay")(replay)


def replay(
    trace_path: TraceArgument,
    policy: PolicyOpt = "all",
    capacity: CapacityOpt = None,
    capacity_frac: CapacityFracOpt = None,
    jobs: JobsOpt = 0,
    skip_bad_lines: SkipBadLinesFlag = False,
    json_out: JsonFlag = False,
    plot: PlotOpt = None,
    top_categories: TopCategoriesOpt = 8,
    refit_every: RefitEveryOpt = 60.0,
    wa_fit: WaFitOpt = "online",
    split: SplitOpt = None,
    categories: CategoriesOpt = "labels",
    attribution: AttributionOpt = None,
    near_concurrent: NearConcurrentOpt = None,
    life: LifeOpt = None,
    shrinkage: ShrinkageOpt = None,
    reuse_class: ReuseClassOpt = "off",
    auto_rate: AutoRateOpt = None,
    auto_window: AutoWindowOpt = None,
    auto_windows: AutoWindowsOpt = None,
    auto_margin: AutoMarginOpt = None,
    auto_min_accesses: AutoMinAccessesOpt = None,
    auto_supersede: AutoSupersedeOpt = None,
    auto_wa: AutoWAOpt = None,
) -> None:
    """Replay TRACE through eviction policies at several cache sizes.

    A request's hits are its longest cached prefix; blocks are released tail first, then the
    cache evicts to capacity (docs/replay.md). Belady and an infinite cache are the bounds.

    Examples:

        kvwise replay trace.jsonl --capacity-frac 0.05,0.1,0.2,0.4
        kvwise replay trace.jsonl -p lru,s3fifo --capacity 5000 --json
        kvwise replay trace.jsonl -p lru,s3fifo,wa --plot curve.png
        kvwise replay trace.jsonl -p lru,arc,wa,auto --capacity-frac 0.01,0.05
    """
    sizes = _capacities(capacity, capacity_frac)
    names = _names(policy, plot)
    auto: tuple[float | str | None, ...] = (auto_rate, auto_window, auto_windows, auto_margin)
    auto += (auto_min_accesses, auto_supersede, auto_wa)
    options = _options(
        names,
        refit_every_s=refit_every,
        wa_fit=wa_fit,
        split=_split(split, wa_fit),
        categories=categories,
        attribution=attribution,
        reuse_class=reuse_class,
        **_fit_overrides(near_concurrent, life, shrinkage),
        **_auto_fields(names, *auto),
    )
    trace = _replayed_trace(trace_path, skip_bad_lines, options)
    runs = _run_with_progress(trace, names, capacities := sizes(trace), jobs, options, json_out)
    plot_curve(plot, trace, runs)
    report(trace_path, trace, names, capacities, runs, options, top_categories, json_out)
    if runs.not_finished:
        end_interrupted(runs)


def _fit_overrides(
    near_concurrent: float | None, life: float | None, shrinkage: float | None
) -> dict[str, float | None]:
    """The fitting knobs the replay overrides (None: the controller's default)."""
    return {"near_concurrent_s": near_concurrent, "life_s": life, "shrinkage_samples": shrinkage}


def _split(split: float | None, wa_fit: str) -> float:
    """The share fitted on: ``--split`` only goes with ``--wa-fit split``."""
    if split is not None and wa_fit != "split":
        fail("--split applies only with --wa-fit split")
    return DEFAULT_OPTIONS.split if split is None else split


def _options(names: list[str], attribution: Attribution | None, **settings: Any) -> ReplayOptions:
    """The replay's settings, or a one-line error naming the flag that conflicts (one of
    the fitted policies' given with none of them among ``names`` included)."""
    from controlplane.replay.options import DEFAULT_ATTRIBUTION, ReplayOptions

    refuse_fit_options_unused(
        names,
        settings["refit_every_s"],
        settings["reuse_class"],
        attribution=attribution is not None,
        near_concurrent=settings["near_concurrent_s"] is not None,
        life=settings["life_s"] is not None,
        shrinkage=settings["shrinkage_samples"] is not None,
    )

    try:
        return ReplayOptions(attribution=attribution or DEFAULT_ATTRIBUTION, **settings)
    except ValueError as exc:
        fail(str(exc))


def _replayed_trace(path: Path, skip_bad_lines: bool, options: ReplayOptions) -> Trace:
    """The trace at ``path`` as the replay sees it (``_labelled``), its scored part
    checked (``_check_scored_part``)."""
    trace = _labelled(load_trace_or_fail(path, skip_bad_lines=skip_bad_lines), options)
    _check_scored_part(trace, options)
    return trace


def _labelled(trace: Trace, options: ReplayOptions) -> Trace:
    """``trace`` with the categories the fitted policies see (``--categories auto``:
    the inferred ones), so that the per-category results are by those."""
    if options.categories == "labels":
        return trace
    from dataclasses import replace

    from controlplane.replay.accesses import request_categories

    codes, names = request_categories(trace, options.categories)
    return replace(trace, categories=codes, category_names=names)


def _names(policy: str, plot: Path | None) -> list[str]:
    """The policies to replay: those asked for, and the bounds when plotting."""
    from controlplane.replay import catalog

    names = policy_names(policy)
    if plot is not None:
        check_plotting("--plot", png=plot)
        names += [b for b in catalog.BOUNDS if b not in names]
    return names


_AUTO_FIELDS = {
    "--auto-rate": "auto_rate",
    "--auto-window": "auto_window_s",
    "--auto-windows": "auto_windows",
    "--auto-margin": "auto_margin",
    "--auto-min-accesses": "auto_min_accesses",
    "--auto-supersede": "auto_supersede",
    "--auto-wa": "auto_wa",
}
"""``auto``'s options and the ``ReplayOptions`` field each sets."""


def _auto_fields(names: list[str], *values: float | str | None) -> dict[str, Any]:
    """``auto``'s options (``values``, in ``_AUTO_FIELDS``'s order, None where not given)
    by ``ReplayOptions`` field, the defaults where not given. Like ``--split``, one given
    applies only with what it is for: ``auto`` among the policies ``names``."""
    given = dict(zip(_AUTO_FIELDS, values, strict=True))
    named = [option for option, value in given.items() if value is not None]
    if named and "auto" not in names:
        verb = "applies" if len(named) == 1 else "apply"
        fail(f"{', '.join(named)} {verb} only when --policy includes auto")
    return {
        field: getattr(DEFAULT_OPTIONS, field) if given[option] is None else given[option]
        for option, field in _AUTO_FIELDS.items()
    }


def _capacities(capacity: str | None, capacity_frac: str | None) -> Callable[[Trace], list[int]]:
    """The cache sizes in blocks of a trace, each once (fractions that round to one size
    merge). The options are checked now, before a long trace loads."""
    if capacity is not None and capacity_frac is not None:
        fail("give --capacity or --capacity-frac, not both")
    if capacity is not None:  # an empty one fails, as in simulate, not the default sizes
        blocks = parse_ints(capacity, "--capacity")
        return lambda trace: blocks
    fracs = parse_fracs(
        DEFAULT_FRACS if capacity_frac is None else capacity_frac, "--capacity-frac"
    )
    return lambda trace: unique(trace.capacity_for(f) for f in fracs)


def _check_scored_part(trace: Trace, options: ReplayOptions) -> None:
    """In split mode, fail if the part after the fit holds no request to score."""
    if options.wa_fit == "split" and options.first_scored(trace) >= trace.n_requests:
        fail(
            f"--wa-fit split: fitting on {options.split:.0%} of "
            f"{counted(trace.n_requests, 'request')} leaves none to score; give a longer "
            "trace or a smaller --split"
        )


def _run_with_progress(
    trace: Trace,
    names: list[str],
    capacities: list[int],
    jobs: int,
    options: ReplayOptions,
    quiet: bool,
) -> Runs:
    """Every run's result; after a Ctrl-C, those of the runs that had finished (none: the
    interrupt goes on, said as before)."""
    from controlplane.cli.progress import MatrixProgress
    from controlplane.replay.pool import JobsInterrupted, WorkerDied
    from controlplane.replay.runner import run_matrix

    try:
        with MatrixProgress(trace.n_requests, len(names) * len(capacities), quiet=quiet) as shown:
            try:
                matrix = run_matrix(
                    trace,
                    names,
                    capacities,
                    jobs=jobs or None,
                    progress=shown.update,
                    options=options,
                    finished=shown.finish,
                )
                return Runs(matrix, [])
            except JobsInterrupted as exc:
                if not exc.finished:
                    raise
                finished: list[ReplayResult] = list(exc.finished.values())
    except WorkerDied as exc:
        fail(str(exc), code=1)
    done = {(r.policy, r.capacity) for r in finished}
    return Runs(finished, [(n, c) for n in names for c in capacities if (n, c) not in done])

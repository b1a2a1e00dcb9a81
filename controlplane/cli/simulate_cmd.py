"""``kvwise simulate``: time to first token of eviction policies in a simulated fleet.

Owns the command's options and progress display; what it prints is
``controlplane.cli.simulate_output``. The simulator is ``controlplane.simulate``; trace
reading is ``controlplane.traces.reader``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from controlplane.cli.common import (
    INT64_MAX,
    JobsOpt,
    JsonFlag,
    SkipBadLinesFlag,
    SpeedOpt,
    TraceArgument,
    check_names,
    check_plotting,
    fail,
    load_trace_or_fail,
    parse_floats,
    parse_fracs,
    parse_ints,
    policy_names,
    refuse_fit_options_unused,
    unique,
)
from controlplane.cli.fitted_options import CategoriesOpt, RefitEveryOpt, ReuseClassOpt
from controlplane.cli.simulate_output import report

if TYPE_CHECKING:
    from controlplane.replay.options import CategorySource, ReplayOptions, ReuseClass
    from controlplane.simulate.engine import SimOptions
    from controlplane.simulate.profiles import Profile
    from controlplane.simulate.report import SimResult
    from controlplane.traces.model import Trace

DEFAULT_POLICIES = "lru,s3fifo,arc,wa"
MAX_INSTANCES = 1024
"""Most engine instances: each holds arrays over the trace's unique blocks and a policy
of its own (fitted ones index the whole trace), so memory grows with the fleet."""

PolicyOpt = Annotated[
    str,
    typer.Option("--policy", "-p", metavar="NAMES", help="Comma-separated policy names, or 'all'"),
]
CapacityOpt = Annotated[
    str | None,
    typer.Option(metavar="BLOCKS", help="Cache sizes per instance, in blocks: 1000,2000"),
]
CapacityFracOpt = Annotated[
    str | None,
    typer.Option(metavar="FRACS", help="Cache sizes as fractions of the trace's unique blocks"),
]
CapacityGibOpt = Annotated[
    str | None, typer.Option(metavar="GIBS", help="Cache sizes in GiB of KV per instance: 20,40,80")
]
ProfileOpt = Annotated[
    str,
    typer.Option(
        metavar="NAME|FILE",
        help="Hardware/model: llama3-8b-h200, llama3-8b-h100, llama3-70b-fp8-h200, "
        "or a .json/.toml file (docs/simulate.md)",
    ),
]
InstancesOpt = Annotated[int, typer.Option(metavar="N", help="Engine instances (one cache each)")]
RouterOpt = Annotated[
    str, typer.Option(metavar="NAME", help="round-robin, least-loaded, prefix or session")
]
OutputTokensOpt = Annotated[
    int, typer.Option(metavar="N", help="Output tokens of requests whose trace gives none")
]
BlockTokensOpt = Annotated[
    int | None,
    typer.Option(
        metavar="N",
        help="Tokens per block, for a trace format that does not say (Bailian's are 16, "
        "Mooncake's 512)",
    ),
]
AffinitySlackOpt = Annotated[
    int,
    typer.Option(metavar="N", help="prefix router: extra requests allowed on a matched instance"),
]
PlotOpt = Annotated[
    Path | None,
    typer.Option(metavar="FILE.png", help="Write a PNG: QTTFT CDF, hit ratio and QTTFT by size"),
]


def register(app: typer.Typer) -> None:
    app.command("simulate")(simulate)


def simulate(
    trace_path: TraceArgument,
    policy: PolicyOpt = DEFAULT_POLICIES,
    capacity: CapacityOpt = None,
    capacity_frac: CapacityFracOpt = None,
    capacity_gib: CapacityGibOpt = None,
    profile: ProfileOpt = "llama3-8b-h200",
    instances: InstancesOpt = 1,
    router: RouterOpt = "round-robin",
    speed: SpeedOpt = 1.0,
    output_tokens: OutputTokensOpt = 256,
    block_tokens: BlockTokensOpt = None,
    affinity_slack: AffinitySlackOpt = 16,
    categories: CategoriesOpt = "labels",
    refit_every: RefitEveryOpt = 60.0,
    reuse_class: ReuseClassOpt = "off",
    json_out: JsonFlag = False,
    plot: PlotOpt = None,
    jobs: JobsOpt = 0,
    skip_bad_lines: SkipBadLinesFlag = False,
) -> None:
    """Serve TRACE on simulated engine instances and report TTFT per policy and size.

    Requests arrive at the trace's times (--speed scales them) and are routed to
    --instances engines. Each engine steps like vLLM (token budget per step, chunked
    prefill, decode one token a step), its KV cache of the given size managed by the
    policy; blocks of running requests stay pinned. Step times come from the --profile's
    roofline model. QTTFT = queueing + time to first token (docs/simulate.md).

    The default size is what the profile's GPU holds after the weights.

    Examples:

        kvwise simulate tests/data/mooncake_synthetic.jsonl.gz --instances 4
        kvwise simulate trace.jsonl -p lru,wa --capacity-gib 20,40 --speed 2
        kvwise simulate trace.jsonl --router prefix --instances 8 --plot ttft.png
    """
    sizes = _capacities(capacity, capacity_frac, capacity_gib)
    if plot is not None:
        check_plotting("--plot", png=plot)
    names = policy_names(policy)
    refuse_fit_options_unused(names, refit_every, reuse_class)
    options = _options(
        _profile(profile),
        instances,
        router,
        speed,
        output_tokens,
        block_tokens,
        affinity_slack,
        _replay_options(categories, refit_every, reuse_class),
    )
    trace = load_trace_or_fail(trace_path, skip_bad_lines=skip_bad_lines)
    _check_speed(trace, options.speed)
    block = _block_tokens(trace_path, trace, options)
    capacities = sizes(trace, options.profile, block)
    results = _run_with_progress(trace, names, capacities, options, jobs, quiet=json_out)
    report(trace_path, trace, options, block, results, json_out=json_out, plot=plot)


def _profile(name_or_path: str) -> Profile:
    """The profile, checked for finite step times (``CostModel``) before any work."""
    from controlplane.simulate.cost import CostModel
    from controlplane.simulate.profiles import ProfileError, load_profile

    try:
        profile = load_profile(name_or_path)
    except ProfileError as exc:
        fail(f"--profile: {exc}")
    try:
        CostModel(profile)
    except ProfileError as exc:
        fail(f"--profile: {name_or_path}: {exc}")
    return profile


def _options(
    prof: Profile,
    instances: int,
    router: str,
    speed: float,
    output_tokens: int,
    block_tokens: int | None,
    slack: int,
    replay: ReplayOptions,
) -> SimOptions:
    from controlplane.simulate import router as routers
    from controlplane.simulate.engine import SimOptions
    from controlplane.traces.model import MAX_REQUEST_TOKENS

    check_names([router], routers.names(), "--router", "router")
    checks = {  # option: (within range, what the range is, the value given)
        "--instances": (1 <= instances <= MAX_INSTANCES, f"from 1 to {MAX_INSTANCES:,}", instances),
        "--output-tokens": (
            1 <= output_tokens <= MAX_REQUEST_TOKENS,
            f"from 1 to {MAX_REQUEST_TOKENS:,}",
            output_tokens,
        ),
        "--block-tokens": (block_tokens is None or block_tokens >= 1, "at least 1", block_tokens),
        "--affinity-slack": (slack >= 0, "at least 0", slack),
    }
    for opt, (ok, rule, value) in checks.items():
        if not ok:
            fail(f"{opt}: must be {rule}, got {value}")
    return SimOptions(
        profile=prof,
        instances=instances,
        router=router,
        speed=speed,
        block_tokens=block_tokens,
        output_tokens=output_tokens,
        slack=slack,
        replay=replay,
    )


def _replay_options(
    categories: CategorySource, refit_every: float, reuse_class: ReuseClass
) -> ReplayOptions:
    """How fitted policies are fitted (``wa``, ``auto``), from the command's options."""
    from controlplane.replay.options import ReplayOptions

    try:
        return ReplayOptions(
            refit_every_s=refit_every, categories=categories, reuse_class=reuse_class
        )
    except ValueError as exc:
        fail(str(exc))


def _block_tokens(trace_path: Path, trace: Trace, options: SimOptions) -> int:
    """Tokens per block: what the trace says (a recorded one), else its format's, or
    ``--block-tokens`` for a trace that does not say (one that does counts its hash ids
    and prompt lengths in its own). Fails, naming the trace, on a request no engine
    takes."""
    from controlplane.replay.accesses import block_tokens_of
    from controlplane.simulate.requests import workload

    native = block_tokens_of(trace)
    if options.block_tokens not in (None, native) and native is not None:
        fail(
            f"--block-tokens {options.block_tokens}: this {trace.source_format} trace's "
            f"blocks hold {native} tokens each (its hash ids and prompt lengths count in "
            "them); leave the option out"
        )
    try:
        return int(workload(trace, block_tokens=options.block_tokens).block_tokens)
    except ValueError as exc:
        fail(f"{trace_path}: {exc}")


def _check_speed(trace: Trace, speed: float) -> None:
    """Fail, naming ``--speed``, when it puts the trace's arrivals past a float's range."""
    from controlplane.simulate.requests import arrival_times

    try:
        arrival_times(trace, speed)
    except ValueError as exc:
        fail(f"--speed: {str(exc).removeprefix('speed ')}")


CAPACITY_OPTIONS = ("--capacity", "--capacity-frac", "--capacity-gib")
"""The ways to size the cache, one at most per run."""

SizesOf = Callable[["Trace", "Profile", int], list[int]]
"""The cache sizes in blocks for a trace, a profile and its tokens per block."""


def _capacities(capacity: str | None, capacity_frac: str | None, gib: str | None) -> SizesOf:
    """The cache sizes asked for, checked now, before a long trace loads (none: the
    profile's KV pool)."""
    given = [
        option
        for option, value in zip(CAPACITY_OPTIONS, (capacity, capacity_frac, gib), strict=True)
        if value is not None
    ]
    if len(given) > 1:
        got = f"{', '.join(given[:-1])} and {given[-1]}"
        fail(f"give only one of {', '.join(CAPACITY_OPTIONS)} (got {got})")
    if capacity is not None:
        blocks = parse_ints(capacity, "--capacity")
        return lambda trace, prof, block: blocks
    if capacity_frac is not None:
        fracs = parse_fracs(capacity_frac, "--capacity-frac")
        return lambda trace, prof, block: unique(trace.capacity_for(f) for f in fracs)
    if gib is not None:
        sizes = parse_floats(gib, "--capacity-gib")
        return lambda trace, prof, block: unique(_gib_blocks(prof, g, block) for g in sizes)
    return lambda trace, prof, block: [prof.kv_pool_blocks(block)]


def _gib_blocks(prof: Profile, gib: float, block: int) -> int:
    """The blocks ``gib`` GiB hold; a size under one block fails, naming it, rather than
    run as a cache of none, and so does one of more blocks than ``--capacity`` takes."""
    from controlplane.simulate.profiles import GIB

    one = prof.kv_bytes_per_token * block / GIB
    if gib > INT64_MAX * one:
        fail(
            f"--capacity-gib: {gib:g} is too large (at most {INT64_MAX * one:.3g}: "
            f"{INT64_MAX} blocks of {block} tokens)"
        )
    blocks = min(prof.blocks_for_gib(gib, block), INT64_MAX)
    if blocks < 1:
        fail(
            f"--capacity-gib: {gib:g} is under one block ({prof.name}: {block} tokens "
            f"take {one:.3g} GiB)"
        )
    return blocks


def _run_with_progress(
    trace: Trace,
    names: list[str],
    capacities: list[int],
    options: SimOptions,
    jobs: int,
    quiet: bool,
) -> list[SimResult]:
    from controlplane.cli.progress import MatrixProgress
    from controlplane.replay.pool import WorkerDied
    from controlplane.simulate.engine import UNBOUNDED
    from controlplane.simulate.runner import run_matrix, sim_jobs

    cells = len(sim_jobs(names, capacities))
    try:
        with MatrixProgress(
            trace.n_requests, cells, quiet=quiet, command="simulate", sizeless=UNBOUNDED
        ) as shown:
            return run_matrix(
                trace,
                names,
                capacities,
                options,
                jobs=jobs or None,
                progress=shown.update,
                finished=shown.finish,
            )
    except WorkerDied as exc:
        fail(str(exc), code=1)

"""``kvwise demo``: the live loop on your machine, with a terminal view.

Owns the demo's options, what it says at each start step (which Redis it uses and why,
where the controller and its dashboard listen), its live view (fitted parameters per
category with what each column means, the policy version each worker applied, hit ratios
of kvwise vs stock LRU on the same traffic) and the final JSON. The agent settings its
workers read (a malformed ``KVWISE_REDIS_URL`` among them) are checked before anything is
created. The processes are ``controlplane.dev.demo``'s.
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any

import typer

from agent.runtime.connection import redact
from controlplane.cli.common import (
    agent_settings_or_fail,
    as_whole_number,
    exit_interrupted,
    fail,
    finite_at_least,
    non_negative,
    print_json,
    warn_unknown_variables,
)

if TYPE_CHECKING:
    from rich.console import Console, RenderableType
    from rich.table import Table

    from controlplane.dev.demo import DemoStack

MAX_WORKERS = 16


def _worker_count(text: str) -> int:
    """Typer parser of --workers, worded as the other options' parsers (a ``min=`` bound
    read as pydantic's "Input should be greater than or equal to 2")."""
    count = as_whole_number(text)
    if count < 2:
        raise typer.BadParameter(f"must be at least 2 (a pair: wa and stock LRU), got {text}")
    if count > MAX_WORKERS:
        raise typer.BadParameter(f"must be at most {MAX_WORKERS}, got {text}")
    return count


def _at_least(minimum: float, metavar: str, help_text: str) -> Any:
    """An option of a finite number >= ``minimum``, the bound written once: its parser's,
    and its help's ``(0.1 or more)``."""
    return typer.Option(
        parser=finite_at_least(minimum), metavar=metavar, help=f"{help_text} ({minimum:g} or more)"
    )


WorkersOpt = Annotated[
    int,
    typer.Option(
        parser=_worker_count,
        metavar="N",
        help=f"Simulated workers, 2 to {MAX_WORKERS}: half wa, half lru (odd: one more wa)",
    ),
]
SpeedOpt = Annotated[float, _at_least(0.1, "FACTOR", "Trace time runs this much faster")]
DurationOpt = Annotated[
    float,
    typer.Option(
        parser=non_negative, metavar="SECONDS", help="Wall-clock seconds to run (0 = until Ctrl-C)"
    ),
]
RefitOpt = Annotated[float, _at_least(0.5, "SECONDS", "Controller refit period")]
JsonOpt = Annotated[bool, typer.Option("--json", help="No live view; final JSON summary")]


def register(app: typer.Typer) -> None:
    app.command("demo")(demo)


def demo(
    workers: WorkersOpt = 4,
    speed: SpeedOpt = 30.0,
    duration: DurationOpt = 0.0,
    refit_interval: RefitOpt = 5.0,
    json_out: JsonOpt = False,
) -> None:
    """Run the whole live loop locally: Redis, the controller, and simulated workers.

    Uses `KVWISE_REDIS_URL`, else a Redis on 127.0.0.1:6379 if one answers, else starts
    an embedded redis-server in a temporary directory, and says which. Its keys go under a
    fresh prefix of its own (`kvwise-demo-XXXXXXXX:`, not `KVWISE_KEY_PREFIX`), so it never
    touches a deployment's keys sharing that Redis, and are deleted when it ends. Generates to-C
    synthetic traces (calibrated to the paper; synthetic data), starts the controller on
    localhost (open, without a deployment's `KVWISE_API_TOKEN` or `KVWISE_API_READ_TOKEN`
    from the environment) and workers in pairs on the same trace: one with kvwise's fitted policy
    (wa), one with stock LRU. Watch the controller fit per-category parameters and every
    worker apply each new version. Ctrl-C stops every process and removes what the demo
    created (exit code 130; the `--json` summary then says `"interrupted": true`).

    Examples:

        kvwise demo
        kvwise demo --workers 6 --speed 60 --duration 120
        kvwise demo --duration 60 --json > demo.json
    """
    from controlplane.dev.demo import DemoSettings, DemoStack

    stack = DemoStack(DemoSettings(workers=workers, speed=speed, refit_interval_s=refit_interval))
    redis_url = _redis_url_set(stack)
    stopping = {"flag": False}

    def on_signal(signum: int, _frame: object) -> None:
        stopping["flag"] = True

    signal.signal(signal.SIGTERM, on_signal)
    view = _View()
    try:
        _start(stack, redis_url)
        deadline = time.monotonic() + duration if duration else None
        _run_view(stack, stopping, deadline, view, live=not json_out and sys.stdout.isatty())
    except KeyboardInterrupt:
        view.interrupted = True
    finally:
        stack.stop()
    _end(view, json_out)


def _end(view: _View, json_out: bool) -> None:
    """The summary of what the demo saw last, once every process is gone (so without the
    controller's URLs), saying whether a Ctrl-C ended it; then exit code 130 if one did."""
    summary = {k: v for k, v in view.snap.items() if k not in GONE_WITH_THE_DEMO}
    summary["interrupted"] = view.interrupted
    if json_out:
        print_json(summary)
    elif not view.shown_whole and "agents" in summary:
        from rich.console import Console

        print_summary(summary, Console())
    done = "stopped every process and removed the demo's data."
    if view.interrupted:
        exit_interrupted(f"kvwise demo: interrupted; {done}")
    _say(done)


def _say(message: str) -> None:
    typer.echo(f"kvwise demo: {message}", err=True)


_REDIS_SOURCE = {  # short: the startup lines fit 80 columns
    "KVWISE_REDIS_URL": "from KVWISE_REDIS_URL",
    "reused": "one answered there: reused",
    "embedded": "embedded, stopped at the end",
}


def _redis_url_set(stack: DemoStack) -> str | None:
    """The Redis URL the user set (``KVWISE_REDIS_URL``, as the agent settings read it), or
    None. The workers are agents: a bad agent setting fails here, naming it, before
    anything is created, not in every worker; the key prefix is the stack's own, so the
    user's ``KVWISE_KEY_PREFIX`` is neither read nor refused."""
    settings = agent_settings_or_fail({"key_prefix": stack.prefix}, {})
    warn_unknown_variables()
    return settings.redis_url if "redis_url" in settings.model_fields_set else None


def _start(stack: DemoStack, redis_url: str | None) -> None:
    """Start each part, saying what it chose; a part that fails is one error line."""
    try:
        stack.start_redis(redis_url)
        assert stack.redis_source is not None
        _say(f"Redis at {redact(stack.redis_url)} ({_REDIS_SOURCE[stack.redis_source]})")
        _say(f"keys under {stack.prefix!r}, deleted at the end")
        stack.start_controller()
        _say(f"controller at {stack.api_url}")
        _say(f"open the dashboard: {_dashboard(stack)}")
        _say(f"REST API docs: {stack.api_url}/docs")
        stack.start_workers()
    except RuntimeError as exc:
        fail(str(exc))
    s = stack.settings
    _say(f"{s.workers} workers ({s.workers // 2} wa, {s.workers - s.workers // 2} lru)")
    _say(f"on synthetic to-C traces at {s.speed:g}x speed, {stack.capacity:,} blocks each")


def _dashboard(stack: DemoStack) -> str:
    return f"{stack.api_url}/ui/"


GONE_WITH_THE_DEMO = ("api", "dashboard")
"""Snapshot fields left out of the summary: they point at the demo's controller, stopped
before the summary is printed."""


def _snapshot(stack: DemoStack) -> dict[str, Any]:
    try:
        policy = stack.get("/v1/policy")
        categories = stack.get("/v1/categories")
        agents = stack.get("/v1/agents")
        shadow = stack.get("/v1/shadow")
    except Exception as exc:  # the view keeps going while a process restarts
        return {"error": str(exc)}
    if not (isinstance(agents, list) and isinstance(categories, list)):
        return {"error": f"unexpected answer from the controller: {agents!r:.200}"}
    return {
        "redis": redact(stack.redis_url),
        "redis_source": stack.redis_source,
        "api": stack.api_url,
        "dashboard": _dashboard(stack),
        "speed": stack.settings.speed,
        "capacity_blocks": stack.capacity,
        "policy_version": policy.get("version") if isinstance(policy, dict) else None,
        "categories": categories,
        "agents": [{**a, "evictor": stack.workers.get(a["id"], "?")} for a in agents],
        "shadow": shadow,
    }


@dataclass
class _View:
    """What the demo last saw, and whether the live view showed all of it."""

    snap: dict[str, Any] = field(default_factory=dict)
    shown_whole: bool = False
    interrupted: bool = False
    """Whether a Ctrl-C ended the demo (not ``--duration`` or a SIGTERM)."""


def _run_view(
    stack: DemoStack, stopping: dict[str, bool], deadline: float | None, view: _View, live: bool
) -> None:
    """Watch until stopped (a signal, the deadline or Ctrl-C), keeping the last snapshot
    in ``view``."""
    from rich.live import Live

    def running() -> bool:
        if (msg := stack.failed()) is not None:
            raise SystemExit(msg)
        return not stopping["flag"] and (deadline is None or time.monotonic() < deadline)

    if not live:  # --json, or the output goes to a file or a pipe: the summary at the end
        _watch(running, view, lambda: None)
        _say("stopping the workers to read their final counters")
        _read_final(stack, view)
        return
    with Live(refresh_per_second=2, screen=False) as screen:

        def show() -> None:
            view.snap = _snapshot(stack)
            frame, view.shown_whole = _render(view.snap, screen.console)
            screen.update(frame)

        _watch(running, view, show)
        screen.console.print("stopping the workers to read their final counters", style="dim")
        _read_final(stack, view)
        frame, view.shown_whole = _render(view.snap, screen.console)
        screen.update(frame)


def _watch(running: Callable[[], bool], view: _View, each: Callable[[], None]) -> None:
    """``each`` once a second while ``running``; a Ctrl-C ends it, noted in ``view``."""
    try:
        while running():
            each()
            time.sleep(1.0)
    except KeyboardInterrupt:
        view.interrupted = True


def _read_final(stack: DemoStack, view: _View) -> None:
    """Stop the workers (their last heartbeats carry their final counters), give the
    controller up to 5 s to ingest what they sent, and read everything once more."""
    stack.stop_workers()
    deadline = time.monotonic() + 5.0
    while True:
        snap = _snapshot(stack)
        if "agents" not in snap:  # the controller is gone: keep what was read last
            view.snap = view.snap if "agents" in view.snap else snap
            return
        view.snap = snap
        if all(map(_all_taken, snap["agents"])) or time.monotonic() > deadline:
            return
        time.sleep(0.2)


def _all_taken(agent: dict[str, Any]) -> bool:
    """Whether the controller took (ingested, or refused and counted) all ``agent`` sent."""
    taken = agent["events_ingested"] + agent["clock_rejected"] + agent["events_refused"]
    return bool(taken >= agent["events_sent"])


def _render(snap: dict[str, Any], console: Console) -> tuple[RenderableType, bool]:
    """The live frame, and whether it shows everything: it does when the terminal is
    tall enough; else the fitted parameters first, then what else fits (everything is
    printed when the demo ends)."""
    from rich.text import Text

    if "error" in snap:
        return Text(f"waiting for the controller: {snap['error']}"), False
    frames = _frames(snap)
    rows = console.height - 1
    fits = (i for i, frame in enumerate(frames) if len(console.render_lines(frame)) <= rows)
    chosen = next(fits, len(frames) - 1)
    return frames[chosen], chosen == 0


def _frames(snap: dict[str, Any]) -> list[RenderableType]:
    """The frames of ``snap``, from everything down to the fitted parameters alone."""
    from rich.console import Group
    from rich.text import Text

    live = "dashboard" in snap  # else the summary, once the controller is gone
    head = Text.from_markup(
        f"[bold]kvwise demo[/]  policy version [bold cyan]{snap['policy_version']}[/]  "
        f"cache {snap['capacity_blocks']:,} blocks{'  (Ctrl-C to stop)' if live else ''}\n"
        + (f"dashboard [bold]{snap['dashboard']}[/]  " if live else "")
        + f"redis {snap['redis']}"
    )
    workers = _workers_table(snap)
    parameters, legend = _categories_table(snap)
    fewer, _ = _categories_table(snap, top=FEWER_CATEGORIES)

    def more(what: str) -> Text:
        return Text(
            f"(a taller terminal shows more: {what}; all are printed when the demo ends)",
            style="dim",
        )

    return [
        Group(head, workers, *_shadow_tables(snap["shadow"]), parameters, legend),
        Group(head, parameters, workers, more("the shadow curves, the legend")),
        # An 80x24 terminal: the workers (wa beside lru, each one's applied version, what
        # the demo is there to show) over fewer categories, rather than no workers at all.
        Group(head, fewer, workers, more("the shadow curves, more categories, the legend")),
        Group(head, parameters, more("the shadow curves, the workers, the legend")),
    ]


def _workers_table(snap: dict[str, Any]) -> Table:
    from rich.table import Table

    table = Table(
        title="Workers (synthetic to-C traffic; pairs replay the same trace)", title_justify="left"
    )
    for col in ("worker", "evictor", "applied version", "hit ratio", "events sent", "dropped"):
        table.add_column(col, justify="left" if col in ("worker", "evictor") else "right")
    for a in snap["agents"]:
        table.add_row(
            a["id"],
            a["evictor"],
            str(a["applied_version"]),
            f"{a['hit_ratio']:.4f}",
            f"{a['events_sent']:,}",
            f"{a['events_dropped']:,}",
        )
    return table


def _shadow_tables(shadow: Any) -> list[RenderableType]:
    """Per worker group, each policy's shadow hit ratio at each capacity multiple (GET
    /v1/shadow), and the refit guard's last verdict."""
    from rich.table import Table
    from rich.text import Text

    if not isinstance(shadow, dict) or not shadow.get("enabled"):
        return [Text("shadow evaluation: off", style="dim")]
    out: list[RenderableType] = []
    for group in shadow.get("groups", []):
        table = Table(
            title=f"What each policy would score (shadow, {group['sampled_accesses']:,} "
            f"sampled accesses, rate {shadow['rate']:g}; capacity {group['capacity']:,})",
            title_justify="left",
        )
        table.add_column("policy")
        for multiple in shadow["ladder"]:
            table.add_column(f"x{multiple:g}", justify="right")
        for curve in group["curves"]:
            cells = [
                f"{p['hit_ratio']:.3f}±{(p['ci_high'] - p['ci_low']) / 2:.3f}"
                for p in curve["points"]
            ]
            table.add_row(curve["policy"], *cells)
        out.append(table)
        out.append(
            Text(
                f"the workers' own hit ratio {group['observed_hit_ratio']:.3f} over all their "
                f"requests, {group['sampled_observed_hit_ratio']:.3f} over the sampled ones",
                style="dim",
            )
        )
    if not out:
        out.append(Text("shadow evaluation: no worker with a known capacity yet", style="dim"))
    guard = shadow.get("guard") or {}
    out.append(Text(f"refit guard: {guard.get('reason', '-')}", style="dim"))
    out.append(Text(f"evictor family: {_selection_said(shadow)}", style="dim"))
    return out


def _selection_said(shadow: dict[str, Any]) -> str:
    """The family selection's last reason, or when it first judges."""
    selection = shadow.get("selection")
    if isinstance(selection, dict):
        return str(selection.get("reason", "-"))
    window = float(shadow.get("window_s") or 0)
    return (
        f"not judged yet: the first judgement needs a full shadow window ({window:,g} s of "
        "traffic; KVWISE_SHADOW_WINDOW_S sets it for the controller)"
    )


def print_summary(snap: dict[str, Any], console: Console) -> None:
    """Everything the demo saw last (the whole live frame): printed at the end when the
    terminal was too short to show it live."""
    console.print(_frames(snap)[0])


FEWER_CATEGORIES = 5
"""Categories the live frame shows beside the workers where ten and the workers do not fit
(an 80x24 terminal with four workers)."""

_CATEGORY_COLUMNS = ("category", "samples", "p_reuse", "rate /s", "reuse s", "life s")
"""Short headers: the table, KS and source included, fits 80 columns with every header on
one line ("mean reuse s" folded in two)."""


def _categories_table(snap: dict[str, Any], top: int = 10) -> tuple[Table, RenderableType]:
    """The fitted parameters (the ``top`` categories by samples) and what each column
    means."""
    from rich.table import Table
    from rich.text import Text

    title = f"Fitted parameters per category (top {top} by samples)"
    table = Table(title=title, title_justify="left")
    for col in (*_CATEGORY_COLUMNS, "KS", "source"):
        table.add_column(col, justify="left" if col in ("category", "source") else "right")
    rows = sorted(snap["categories"], key=lambda c: -(c.get("samples") or 0))[:top]
    for c in rows:
        p = c.get("published") or c.get("fitted")
        if not p:
            continue
        ks = c.get("fit_quality")
        table.add_row(
            c["name"],
            f"{c.get('samples') or 0:,}",
            f"{p['p_reuse']:.3f}",
            f"{p['rate']:.4f}",
            f"{1 / p['rate']:.1f}",
            f"{p['life_s']:.1f}",
            "-" if ks is None else f"{ks:.3f}",
            p["source"],
        )
    speed = snap["speed"]
    legend = Text(
        "samples: accesses fitted on; p_reuse: probability a block is used again; rate and "
        "reuse: the fitted reuse rate and mean reuse time of the blocks that are; life: the "
        "window the evictor looks ahead (by default one short window for every category, "
        f"docs/fitting.md). Times are seconds of the demo's clock: the trace runs {speed:g}x "
        f"faster, so 1 s here is {speed:g} s of trace time. KS: largest gap between the "
        "fitted and the observed reuse-time CDF (0 = perfect fit, - = too few samples). "
        "source: fit (the category's own fit, shrunk toward the pooled one), pooled (too "
        "few samples: all categories fitted together), default (built-in), override (set "
        "through the API).",
        style="dim",
    )
    return table, legend

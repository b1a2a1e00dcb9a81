"""``kvwise demo``: the live loop on your machine, with a terminal view.

Owns the demo's options and its live view (fitted parameters per category, the policy
version each worker applied, hit ratios of kvwise vs stock LRU on the same traffic). The
processes are ``controlplane.dev.demo``'s.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from typing import Annotated, Any

import typer


def register(app: typer.Typer) -> None:
    app.command("demo")(demo)


def demo(
    workers: Annotated[int, typer.Option(min=2, max=16, help="Simulated workers (pairs)")] = 4,
    speed: Annotated[float, typer.Option(min=0.1, help="Trace time runs this much faster")] = 30.0,
    duration: Annotated[
        float, typer.Option(min=0, help="Stop after this many seconds (0 = until Ctrl-C)")
    ] = 0.0,
    refit_interval: Annotated[
        float, typer.Option(min=0.5, help="Controller refit period, s")
    ] = 5.0,
    json_out: Annotated[
        bool, typer.Option("--json", help="No live view; final JSON summary")
    ] = False,
) -> None:
    """Run the whole live loop locally: Redis, the controller, and simulated workers.

    Uses KVWISE_REDIS_URL, else a Redis on 127.0.0.1:6379 if one answers, else starts an
    embedded redis-server in a temporary directory. Generates to-C synthetic traces
    (calibrated to the paper; synthetic data), starts the controller on localhost and
    workers in pairs on the same trace: one with kvwise's fitted policy (wa), one with
    stock LRU. Watch the controller fit per-category parameters and every worker apply
    each new version. Ctrl-C stops every process and removes what the demo created.
    """
    from controlplane.cli.common import fail
    from controlplane.dev.demo import DemoSettings, DemoStack

    stack = DemoStack(DemoSettings(workers=workers, speed=speed, refit_interval_s=refit_interval))
    stopping = {"flag": False}

    def on_signal(signum: int, _frame: object) -> None:
        stopping["flag"] = True

    signal.signal(signal.SIGTERM, on_signal)
    view: dict[str, Any] = {}
    try:
        if not json_out:
            typer.echo("kvwise demo: starting Redis, the controller and workers ...", err=True)
        try:
            stack.start()
        except RuntimeError as exc:
            fail(str(exc))
        deadline = time.monotonic() + duration if duration else None
        view = _run_view(stack, stopping, deadline, live=not json_out)
    except KeyboardInterrupt:
        pass
    finally:
        stack.stop()
    if json_out:
        json.dump(view, sys.stdout)
        sys.stdout.write("\n")
    else:
        typer.echo("kvwise demo: stopped every process and removed the demo's data.", err=True)


def _snapshot(stack: Any) -> dict[str, Any]:
    try:
        policy = stack.get("/v1/policy")
        categories = stack.get("/v1/categories")
        agents = stack.get("/v1/agents")
    except Exception as exc:  # the view keeps going while a process restarts
        return {"error": str(exc)}
    return {
        "redis": stack.redis_source,
        "api": stack.api_url,
        "dashboard": f"{stack.api_url}/ui/",
        "capacity_blocks": stack.capacity,
        "policy_version": policy.get("version") if isinstance(policy, dict) else None,
        "categories": categories,
        "agents": [{**a, "evictor": stack.workers.get(a["id"], "?")} for a in agents],
    }


def _run_view(
    stack: Any, stopping: dict[str, bool], deadline: float | None, live: bool
) -> dict[str, Any]:
    from rich.live import Live

    snap: dict[str, Any] = {}
    if not live:
        while not stopping["flag"] and (deadline is None or time.monotonic() < deadline):
            if (msg := stack.failed()) is not None:
                raise SystemExit(msg)
            time.sleep(1.0)
        return _snapshot(stack)
    with Live(refresh_per_second=2, screen=False) as screen:
        while not stopping["flag"] and (deadline is None or time.monotonic() < deadline):
            if (msg := stack.failed()) is not None:
                raise SystemExit(msg)
            snap = _snapshot(stack)
            screen.update(_render(snap))
            time.sleep(1.0)
    return snap


def _render(snap: dict[str, Any]) -> Any:
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    if "error" in snap:
        return Text(f"waiting for the controller: {snap['error']}")
    head = Text.from_markup(
        f"[bold]kvwise demo[/]  policy version [bold cyan]{snap['policy_version']}[/]  "
        f"api {snap['api']}  redis: {snap['redis']}  cache {snap['capacity_blocks']:,} blocks"
        f"  (Ctrl-C to stop)\nOpen the dashboard: [bold]{snap['dashboard']}[/]"
    )
    agents = Table(
        title="Workers (synthetic to-C traffic; pairs replay the same trace)", title_justify="left"
    )
    for col in ("worker", "evictor", "applied version", "hit ratio", "events sent", "dropped"):
        agents.add_column(col, justify="left" if col in ("worker", "evictor") else "right")
    for a in snap["agents"]:
        agents.add_row(
            a["id"],
            a["evictor"],
            str(a["applied_version"]),
            f"{a['hit_ratio']:.4f}",
            f"{a['events_sent']:,}",
            f"{a['events_dropped']:,}",
        )
    cats = Table(title="Fitted parameters per category (top 10 by samples)", title_justify="left")
    for col in (
        "category",
        "samples",
        "p_reuse",
        "rate /s",
        "mean reuse s",
        "life s",
        "KS",
        "source",
    ):
        cats.add_column(col, justify="left" if col in ("category", "source") else "right")
    rows = sorted(snap["categories"], key=lambda c: -(c.get("samples") or 0))[:10]
    for c in rows:
        p = c.get("published") or c.get("fitted")
        if not p:
            continue
        ks = c.get("fit_quality")
        cats.add_row(
            c["name"],
            f"{c.get('samples') or 0:,}",
            f"{p['p_reuse']:.3f}",
            f"{p['rate']:.4f}",
            f"{1 / p['rate']:.1f}",
            f"{p['life_s']:.1f}",
            "-" if ks is None else f"{ks:.3f}",
            p["source"],
        )
    return Group(head, agents, cats)

"""``kvwise worker``: a simulated inference worker that replays a trace through a live agent.

Owns the command's options, signal handling (SIGINT/SIGTERM stop the replay, then the
agent flushes) and output: a status line on stderr every few seconds and a final summary
(one line, or JSON with ``--json``) on stdout. The replay is ``controlplane.dev.simworker``;
the agent is ``agent.runtime.agent.Agent``, configured from ``KVWISE_*`` like a real worker.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Annotated, Any

import typer

from controlplane.cli.common import fail


def register(app: typer.Typer) -> None:
    app.command("worker")(worker)


def worker(
    trace_path: Annotated[
        Path, typer.Option("--trace", help="Bailian or Mooncake JSONL trace (.gz ok)")
    ],
    capacity: Annotated[int, typer.Option(help="Cache size in blocks", min=1)],
    speed: Annotated[
        float, typer.Option(help="Replay speed: trace time divided by this", min=1e-9)
    ] = 1.0,
    worker_id: Annotated[
        str | None, typer.Option("--id", help="Worker id (default: KVWISE_WORKER_ID or host-pid)")
    ] = None,
    policy: Annotated[
        str | None, typer.Option(help="Evictor name (default: KVWISE_EVICTOR)")
    ] = None,
    redis_url: Annotated[
        str | None, typer.Option(help="Redis URL (default: KVWISE_REDIS_URL)")
    ] = None,
    loop: Annotated[
        bool, typer.Option("--loop", help="Repeat the trace forever, shifting its time")
    ] = False,
    status_every: Annotated[
        float, typer.Option(help="Seconds between status lines on stderr (0 = none)")
    ] = 5.0,
    json_out: Annotated[bool, typer.Option("--json", help="Final summary as JSON")] = False,
) -> None:
    """Replay TRACE in real time (divided by --speed) through a kvwise agent.

    Prefix hits are touched, blocks freed tail first, the cache evicts down to --capacity
    after each request, and policies the controller publishes are applied between
    requests. Events go to Redis like a real worker's. Stops at the end of the trace (or
    never, with --loop) or on SIGINT/SIGTERM, after sending what is buffered.

    Example:

      kvwise worker --trace mooncake_trace.jsonl --speed 10 --capacity 20000 --id w1
    """
    from agent.policies import UnknownPolicyError
    from agent.runtime.agent import Agent
    from agent.settings import AgentSettings
    from controlplane.dev.simworker import TraceWorker, WorkerProgress
    from controlplane.traces.reader import TraceError, load_trace

    overrides: dict[str, Any] = {}
    if worker_id:
        overrides["worker_id"] = worker_id
    if policy:
        overrides["evictor"] = policy
    if redis_url:
        overrides["redis_url"] = redis_url
    settings = AgentSettings(**overrides)
    try:
        trace = load_trace(trace_path)
    except (OSError, TraceError) as exc:
        fail(str(exc))
    if trace.n_requests == 0:
        fail(f"{trace_path}: no requests")
    try:
        agent = Agent(settings, capacity=capacity, engine="sim")
    except UnknownPolicyError as exc:
        fail(str(exc))

    stop = threading.Event()
    sim = TraceWorker(agent, trace, speed=speed, loop=loop, stop=stop, policy_name=settings.evictor)

    def report(p: WorkerProgress) -> None:
        typer.echo(_status_line(p), err=True)

    with _stop_on_signals(stop), agent:
        sim.run(report if status_every > 0 else None, every_s=status_every or 5.0)
    result = sim.progress()  # after close: the final flush is counted
    if json_out:
        json.dump({"trace": str(trace_path), **result.to_json()}, sys.stdout)
        sys.stdout.write("\n")
    else:
        typer.echo(_status_line(result))


def _status_line(p: Any) -> str:
    return (
        f"worker {p.worker} [{p.policy}, {p.capacity:,} blocks]: {p.requests:,} requests "
        f"(loop {p.loops}), hit ratio {p.hit_ratio:.4f}, policy v{p.applied_version}, "
        f"events sent {p.events_sent:,} dropped {p.events_dropped:,}, "
        f"rejected {p.rejected}, lag {p.lag_s:.2f}s"
    )


class _stop_on_signals:
    """SIGINT and SIGTERM set ``stop`` (main thread only); the old handlers come back."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop
        self.saved: dict[int, Any] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.stop.set()

    def __enter__(self) -> None:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self.saved[sig] = signal.signal(sig, self._handle)

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self.saved.items():
            signal.signal(sig, handler)

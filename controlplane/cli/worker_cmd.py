"""``kvwise worker``: a simulated inference worker that replays a trace through a live agent.

Owns the command's options and the checks on them (settings, Redis URL, the configured
evictor, ``common.check_evictor``), signal handling
(SIGINT/SIGTERM stop the replay, then the agent flushes) and output: a status line on
stderr every few seconds and a final summary on stdout in every case ("done: ..." or JSON
with ``--json``). Exits 1 when the run could send no event at all (Redis unreachable
throughout). The replay is ``controlplane.dev.simworker``; the agent is
``agent.runtime.agent.Agent``, configured from ``KVWISE_*`` like a real worker.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from agent.runtime.connection import redact
from controlplane.cli.common import (
    KeyPrefixOpt,
    RedisUrlOpt,
    SpeedOpt,
    StatusEveryOpt,
    agent_settings_or_fail,
    check_evictor,
    fail,
    load_trace_or_fail,
    note,
    print_json,
    warn_unknown_variables,
    whole_number,
)

if TYPE_CHECKING:
    from agent.runtime.agent import Agent
    from agent.settings import AgentSettings
    from controlplane.dev.simworker import WorkerProgress
    from controlplane.traces.model import Trace

TraceOpt = Annotated[Path, typer.Option("--trace", help="Bailian or Mooncake JSONL trace (.gz ok)")]
CapacityOpt = Annotated[
    int, typer.Option(parser=whole_number(1), metavar="BLOCKS", help="Cache size in blocks")
]


def _worker_id(text: str) -> str:
    """Typer parser of ``--id``: an empty id is refused, not taken for the default (only
    an unset or empty ``KVWISE_WORKER_ID`` means host-pid)."""
    if not text:
        raise typer.BadParameter(
            "must not be empty (leave --id out for KVWISE_WORKER_ID, else host-pid)"
        )
    return text


WorkerIdOpt = Annotated[
    str | None,
    typer.Option(
        "--id",
        parser=_worker_id,
        metavar="NAME",
        help="Worker id [default: KVWISE_WORKER_ID or host-pid]",
    ),
]
PolicyOpt = Annotated[
    str | None,
    typer.Option(
        metavar="NAME",
        help="Evictor: a policy name or device; wa and device follow the fleet's family "
        "[default: KVWISE_EVICTOR]",
    ),
]
LoopFlag = Annotated[
    bool, typer.Option("--loop", help="Repeat the trace forever, shifting its time")
]
JsonSummaryFlag = Annotated[bool, typer.Option("--json", help="Final summary as JSON")]

_OPTION_OF_FIELD = {
    "worker_id": "--id",
    "evictor": "--policy",
    "redis_url": "--redis-url",
    "key_prefix": "--key-prefix",
}


def register(app: typer.Typer) -> None:
    app.command("worker")(worker)


def worker(
    trace_path: TraceOpt,
    capacity: CapacityOpt,
    speed: SpeedOpt = 1.0,
    worker_id: WorkerIdOpt = None,
    policy: PolicyOpt = None,
    redis_url: RedisUrlOpt = None,
    key_prefix: KeyPrefixOpt = None,
    loop: LoopFlag = False,
    status_every: StatusEveryOpt = 5.0,
    json_out: JsonSummaryFlag = False,
) -> None:
    """Replay TRACE in real time (divided by --speed) through a kvwise agent.

    Prefix hits are touched, blocks freed tail first, the cache evicts down to --capacity
    after each request, and policies the controller publishes are applied between
    requests. Events go to Redis like a real worker's. Stops at the end of the trace (or
    never, with --loop) or on SIGINT/SIGTERM, after sending what is buffered; then prints
    a three-line summary. Exits 1 if no event could be sent (Redis unreachable throughout).

    Example:

        kvwise worker --trace trace.jsonl --speed 10 --capacity 20000 --id w1
    """
    given = {
        "worker_id": worker_id,
        "evictor": policy,
        "redis_url": redis_url,
        "key_prefix": key_prefix,
    }
    settings = agent_settings_or_fail(given, _OPTION_OF_FIELD)
    chosen_by = "KVWISE_EVICTOR" if policy is None else "--policy"
    check_evictor(settings, chosen_by)
    warn_unknown_variables()
    trace = load_trace_or_fail(trace_path)
    agent = _agent(settings, capacity, chosen_by)
    result = _replay(agent, trace, speed, loop, status_every, settings.evictor)
    if json_out:
        print_json({"trace": str(trace_path), **result.to_json()})
    else:
        typer.echo(f"done: {_status_line(result)}")
    dropped = result.agent.events_dropped
    if result.agent.events_sent > 0 and dropped > 0:
        _note_dropped(dropped, settings.buffer_events)
    if result.agent.events_sent == 0 and dropped > 0:
        fail(
            f"sent no event to {redact(settings.redis_url)} ({dropped:,} dropped): "
            "Redis took none for the whole run (the lines above say why)",
            code=1,
        )


def _note_dropped(dropped: int, buffer_events: int) -> None:
    """Say what dropped events cost and what keeps them: the summary's count alone read as
    a detail, while the controller fitted and shadowed without them."""
    note(
        f"{dropped:,} events never reached Redis, so the controller fits and shadows "
        "without them: the agent's buffer (KVWISE_BUFFER_EVENTS, "
        f"{buffer_events:,}) filled faster than Redis took it, or sends failed (the lines "
        "above then say so). A lower --speed sends them all."
    )


def _agent(settings: AgentSettings, capacity: int, chosen_by: str) -> Agent:
    """The worker's agent; its evictor was checked (``check_evictor``). A device evictor
    this machine cannot build (no torch, a device its torch cannot use) fails naming
    where the evictor was chosen (``chosen_by``: ``--policy`` or ``KVWISE_EVICTOR``) and
    ``KVWISE_DEVICE``."""
    from agent.runtime.agent import Agent
    from agent.runtime.family import EvictorUnavailable

    try:
        return Agent(settings, capacity=capacity, engine="sim")
    except EvictorUnavailable as exc:
        fail(f"{chosen_by} {settings.evictor}: {exc}")


def _replay(
    agent: Agent, trace: Trace, speed: float, loop: bool, status_every: float, policy: str
) -> WorkerProgress:
    """Run the replay until it ends or a signal stops it; the agent is closed (its last
    events flushed) before the result is read."""
    from controlplane.cli.signals import SignalFlag, stop_on_signals
    from controlplane.dev.simworker import TraceWorker

    stop = SignalFlag()
    sim = TraceWorker(agent, trace, speed=speed, loop=loop, stop=stop, policy_name=policy)
    _stage_the_policy_in_force(agent)

    def report(p: WorkerProgress) -> None:
        typer.echo(_status_line(p), err=True)

    with stop_on_signals(stop), agent:
        sim.run(report if status_every > 0 else None, every_s=status_every or 5.0)
    return sim.progress()


def _stage_the_policy_in_force(agent: Agent) -> None:
    """One poll of the fleet's policy before the agent's threads start, so the replay's
    first request runs under the document in force (a short replay could end before the
    subscriber's first poll, and run wholly under the default). Redis unreachable: the
    subscriber's loop tries again as it always does."""
    import redis

    try:
        agent.subscriber.check()
    except redis.RedisError as exc:
        typer.echo(f"note: policy in force not read yet ({type(exc).__name__})", err=True)


def _status_line(p: WorkerProgress) -> str:
    """Three lines, each within 80 columns (but for a long worker id): what was replayed
    (the requests, and the passes over the whole trace they completed), then, indented,
    how it went (with the agent's sampled engine-thread time per block) and what the
    agent sent."""
    from agent.runtime.family import family_label

    a = p.agent
    evictor = family_label(p.policy, a.evictor or p.policy)
    return (
        f"worker {a.id} [{evictor}, {a.capacity:,} blocks]: {p.requests:,} "
        f"requests ({p.loops} full pass{'' if p.loops == 1 else 'es'})\n"
        f"  hit ratio {a.hit_ratio:.4f}, applied version {a.applied_version}, lag {p.lag_s:.2f}s, "
        f"agent {a.engine_time.seconds_per_block * 1e9:.0f} ns/block\n"
        f"  events sent {a.events_sent:,} dropped {a.events_dropped:,}, rejected {a.rejected}"
    )

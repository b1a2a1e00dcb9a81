"""``kvwise trace record``: record live workers' requests as a Bailian trace.

Owns the command's options and the checks on them (settings, Redis URL, key prefix, a
file created beside the output, Redis answering, workers to record), the wait for a first
worker when none is live at the start (up to ``--wait``, a look every
``WAIT_LOOK_EVERY_S``; its streams are then read from the wait's start), the recording
loop's timing (``--duration`` counted from the first worker, until it, ``--max-requests``
or SIGINT/SIGTERM, then what was gathered is written to that file and renamed to the
output; without ``--worker``, a look for workers started since every
``NEW_WORKERS_EVERY_S``), status lines on stderr, the one-line summary on stdout and the
exit codes (2: nothing could start, no worker within the wait included; 1: Redis failed
mid-run, after writing what was gathered, or no whole request was seen, or SIGINT/SIGTERM
came while it waited). Tailing the streams is
``controlplane.service.trace_recording``; the trace is ``controlplane.traces.recorded``,
written by ``controlplane.traces.writer``. It must never write to Redis.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer

from agent.runtime.connection import redact
from controlplane.cli.common import (
    BlockTokensOpt,
    KeyPrefixOpt,
    RedisUrlOpt,
    StatusEveryOpt,
    agent_settings_or_fail,
    counted,
    fail,
    is_stream,
    listed,
    non_negative,
    note,
    positive,
    say,
    whole_number,
)

if TYPE_CHECKING:
    from agent.runtime.connection import RedisClient
    from agent.settings import AgentSettings
    from agent.wire import Keys
    from controlplane.cli.signals import SignalFlag
    from controlplane.service.trace_recording import (
        NewWorkers,
        RecordedRequest,
        StreamTail,
        WorkerChoice,
    )
    from controlplane.traces.recorded import RecordedRequests

MAX_REQUESTS = 100_000
"""Requests gathered by default before the recording stops: every request is held until
the end, about 12 KiB for one of 143 blocks (2,300 tokens) half of them new, so some
1.2 GB at most by default; ``--max-requests 0`` lifts the bound."""

IDLE_WAIT_S = 0.1
"""Wait after a read that found nothing new, before reading again."""

WAIT_S = 300.0
"""Seconds ``--wait`` waits by default for a first worker when none is live at the start:
enough for a vLLM server started after the recording to load its model."""

WAIT_LOOK_EVERY_S = 0.5
"""Seconds between two looks for a first worker while it waits (one ``SCAN`` of the
heartbeat keys and a read of the new ones each, as ``NewWorkers`` looks)."""

NEW_WORKERS_EVERY_S = 2.0
"""Seconds between two looks for workers started since the recording did (one ``SCAN`` of
the heartbeat keys each; without ``--worker`` only)."""

OTHERS_SHOWN = 10
"""Live workers named, at most, in the error for a --worker with no heartbeat."""
_OPTION_OF_FIELD = {"redis_url": "--redis-url", "key_prefix": "--key-prefix"}


OutputOpt = Annotated[
    Path, typer.Option("--output", "-o", help="Bailian JSONL file to write (.gz: gzip)")
]
DurationOpt = Annotated[
    float | None,
    typer.Option(
        parser=positive,
        metavar="SECONDS",
        help="Wall-clock seconds to record, from the first worker (a --wait is not counted) "
        "[default: Ctrl-C]",
    ),
]
WaitOpt = Annotated[
    float,
    typer.Option(
        parser=non_negative,
        metavar="SECONDS",
        help="With no worker live at the start, wait this long for the first one's heartbeat "
        "(0 = fail at once)",
    ),
]
WorkerOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--worker",
        metavar="ID",
        help="Record this worker (repeatable) [default: every worker with a heartbeat, and "
        "those that start while it records]",
    ),
]
MaxRequestsOpt = Annotated[
    int,
    typer.Option(
        parser=whole_number(0),
        metavar="N",
        help="Stop after N requests (each held until the end; 0 = no bound)",
    ),
]


@dataclass
class _Run:
    """One recording as it goes."""

    tail: StreamTail
    gathered: RecordedRequests
    max_requests: int
    started: float
    newcomers: NewWorkers | None
    """Where workers started since are found (None: ``--worker`` named those to record)."""
    next_look: float = 0.0
    """When to look for them next (``time.monotonic``)."""
    failure: str = ""
    """Why Redis stopped the recording (empty: it did not)."""
    said_not_read: bool = False
    """Whether heartbeat keys past the workers it reads were said (once) on stderr."""

    @property
    def full(self) -> bool:
        return 0 < self.max_requests <= len(self.gathered)

    def seconds(self) -> float:
        return time.monotonic() - self.started


def record(
    output: OutputOpt,
    duration: DurationOpt = None,
    wait: WaitOpt = WAIT_S,
    worker: WorkerOpt = None,
    max_requests: MaxRequestsOpt = MAX_REQUESTS,
    redis_url: RedisUrlOpt = None,
    key_prefix: KeyPrefixOpt = None,
    block_tokens: BlockTokensOpt = 16,
    status_every: StatusEveryOpt = 5.0,
) -> None:
    """Record the requests live workers serve, from their agents' event streams, as a
    Bailian trace that replay, simulate and trace stats read.

    Reads the streams only (from their newest entry on; the controller's reads are
    untouched), rebuilds each worker's whole requests and, at the end (--duration,
    --max-requests, or Ctrl-C), writes them: times from the first request, block ids
    renumbered in order of first sight, the category as type and turn (docs/traces.md,
    "Recording your own traffic").

    Started before any worker (then start or restart the servers), it waits up to --wait
    for the first one's heartbeat; --duration counts from there.

    Examples:

        kvwise trace record --duration 600 -o mine.jsonl.gz
        kvwise trace record --wait 900 --duration 600 -o mine.jsonl.gz
    """
    from controlplane.cli.signals import SignalFlag, stop_on_signals

    given = {"redis_url": redis_url, "key_prefix": key_prefix}
    settings = agent_settings_or_fail(given, _OPTION_OF_FIELD)
    partial = _claim(output)
    try:
        client, keys = _connect(settings)
        stop = SignalFlag()
        with stop_on_signals(stop):
            with _redis_failure_fails():
                choice, waited = _choose(_Redis(client, keys, settings), worker or [], wait, stop)
                run = _start(client, keys, choice, max_requests, watch=not worker, waited=waited)
            typer.echo(_starting_line(choice.record, duration, max_requests), err=True)
            _loop(run, stop, duration, status_every)
        _finish(run)
        _write(run, (partial, output), block_tokens)
    finally:
        partial.unlink(missing_ok=True)


def _claim(output: Path) -> Path:
    """A new empty file beside ``output``, its name ending like it (``.gz``: gzip): the
    trace is written there and then renamed, so a folder that takes no file is said before
    the recording, not after it, and an interrupted write leaves no cut ``output``."""
    folder = output.parent
    if not folder.is_dir():
        fail(f"--output: {folder} is not a folder")
    if output.is_dir():
        fail(f"--output: {output} is a folder: it takes a file name")
    if is_stream(output):  # renamed over, /dev/stdout would be replaced, not written
        fail(f"--output: {output} is not a file: the trace is written to a file, then renamed")
    try:
        fd, name = tempfile.mkstemp(dir=folder, prefix=".kvwise-record-", suffix=output.name)
    except OSError as exc:
        fail(f"--output: cannot create a file in {folder} ({exc.strerror or exc})")
    os.close(fd)
    return Path(name)


def _connect(settings: AgentSettings) -> tuple[RedisClient, Keys]:
    """A client that answered a ping, and the keys under the prefix (the settings checked
    the prefix)."""
    from agent.runtime.connection import connect, describe_redis_error
    from agent.wire import Keys

    keys = Keys(settings.key_prefix)
    client = connect(
        settings.redis_url,
        timeout_s=settings.redis_timeout_s,
        retries=1,
        cluster=settings.redis_cluster,
    )
    try:
        client.ping()
    except Exception as exc:  # any failure to answer, said in Redis's own words
        fail(f"Redis at {redact(settings.redis_url)} does not answer ({describe_redis_error(exc)})")
    return client, keys


@contextmanager
def _redis_failure_fails() -> Iterator[None]:
    """A Redis error before the recording starts is one error line (exit code 2)."""
    from redis.exceptions import RedisError

    from agent.runtime.connection import describe_redis_error

    try:
        yield
    except RedisError as exc:
        fail(describe_redis_error(exc))


@dataclass(frozen=True)
class _Redis:
    """Where the workers are looked for."""

    client: RedisClient
    keys: Keys
    settings: AgentSettings


def _workers(at: _Redis, wanted: list[str], *, waits: bool) -> WorkerChoice:
    """The workers to record and those left out (said, one line each); none to record is
    the error unless it ``waits`` for one (the workers named and missing are then said
    after the wait, those that do not report requests whole now)."""
    from controlplane.service.trace_recording import choose_workers

    choice = choose_workers(at.client, at.keys, wanted)
    if choice.record:
        _say_missing(choice, at.keys)
    _say_not_whole(choice)
    if not choice.record and not waits:
        _no_worker(choice, at)
    return choice


def _say_missing(choice: WorkerChoice, keys: Keys) -> None:
    for w in choice.missing:
        say(f"worker {w}: no heartbeat under prefix {keys.prefix!r}: skipped", lead="warning: ")


def _no_worker(choice: WorkerChoice, at: _Redis, wait: float = 0) -> NoReturn:
    """The error for no worker to record (after a wait of ``wait`` seconds, if any)."""
    where = f"under prefix {at.keys.prefix!r} at {redact(at.settings.redis_url)}"
    where += f" within --wait {wait:g} s" if wait else ""
    if choice.not_whole:
        _say_missing(choice, at.keys)
        fail(f"no worker to record {where}: none reports its requests whole")
    if choice.missing:
        named = ", ".join(choice.missing)
        instead = "no other worker has one (is an agent running?)"
        if choice.others:
            instead = f"live workers there: {listed(choice.others, OTHERS_SHOWN)}"
        fail(f"no worker to record: no heartbeat of --worker {named} {where}; {instead}")
    fail(f"no worker to record: no agent heartbeat {where} (is an agent running?)")


@dataclass(frozen=True)
class _Waited:
    """The first workers found by the wait, and what found them."""

    choice: WorkerChoice
    tail: StreamTail
    """Reading the workers to record from the wait's start on."""
    newcomers: NewWorkers


def _choose(
    at: _Redis, wanted: list[str], wait: float, stop: SignalFlag
) -> tuple[WorkerChoice, _Waited | None]:
    """The workers to record: those live now, else (``wait`` > 0) the first to come."""
    first = _workers(at, wanted, waits=wait > 0)
    if first.record:
        return first, None
    waited = _wait(at, wanted, (first, wait), stop)
    return waited.choice, waited


def _wait(
    at: _Redis, wanted: list[str], start: tuple[WorkerChoice, float], stop: SignalFlag
) -> _Waited:
    """The first workers to record (``wanted`` only, if any), once a look finds one, after
    ``start``: the choice at the start (none to record) and the seconds to wait. The tail,
    started with the wait, reads their streams from its start, so that the requests a
    worker served before it was noticed are kept. No worker within the wait is the error;
    a signal meanwhile ends the command (exit code 1, as a recording stopped with nothing
    recorded)."""
    from controlplane.service.trace_recording import NewWorkers, StreamTail, WorkerChoice

    (first, seconds), keys = start, at.keys
    whose = f"a heartbeat of --worker {', '.join(wanted)}" if wanted else "a worker's heartbeat"
    typer.echo(
        f"waiting up to {seconds:g} s for {whose} under prefix {keys.prefix!r} at "
        f"{redact(at.settings.redis_url)} (Ctrl-C to stop)",
        err=True,
    )
    tail = StreamTail(at.client, keys, [])
    newcomers = NewWorkers(at.client, keys, [*first.not_whole, *first.others])
    found: list[str] = []
    not_whole, others = list(first.not_whole), list(first.others)
    end = time.monotonic() + seconds
    while not found and time.monotonic() < end:
        if stop.wait(min(WAIT_LOOK_EVERY_S, max(end - time.monotonic(), 0.0))):
            tail.notice.withdraw()
            fail("stopped while waiting for a worker: nothing recorded, nothing written", code=1)
        tail.poll()  # renews the recording's notice; no stream is read yet
        look = newcomers.look()
        found = [w for w in look.record if not wanted or w in wanted]
        fresh = [w for w in look.not_whole if not wanted or w in wanted]
        _say_not_whole(WorkerChoice([], fresh, []))
        not_whole += fresh
        others += [w for w in (*look.record, *look.not_whole) if wanted and w not in wanted]
    left = sorted(w for w in dict.fromkeys(wanted) if w not in found and w not in not_whole)
    choice = WorkerChoice(sorted(found), sorted(not_whole), left, sorted(others))
    if not found:
        tail.notice.withdraw()
        _no_worker(choice, at, seconds)
    _say_missing(choice, keys)
    return _Waited(choice, tail, newcomers)


def _say_not_whole(choice: WorkerChoice) -> None:
    for w in choice.not_whole:
        say(
            f"worker {w}: its agent does not report requests whole (SGLang's radix cache "
            "does not): its requests cannot be rebuilt; skipped",
            lead="warning: ",
        )


def _start(
    client: RedisClient,
    keys: Keys,
    choice: WorkerChoice,
    max_requests: int,
    *,
    watch: bool,
    waited: _Waited | None,
) -> _Run:
    """The recording, before its first read; ``watch``: it takes on workers started since;
    ``waited``: the wait's tail and looks go on (its workers read from the wait's start)."""
    from controlplane.service.trace_recording import NewWorkers, StreamTail
    from controlplane.traces.recorded import RecordedRequests

    if waited:
        for w in choice.record:
            waited.tail.add(w)
        newcomers = waited.newcomers if watch else None
        return _Run(waited.tail, RecordedRequests(), max_requests, 0.0, newcomers)
    seen = [*choice.record, *choice.not_whole]
    newcomers = NewWorkers(client, keys, seen) if watch else None
    tail = StreamTail(client, keys, choice.record)
    return _Run(tail, RecordedRequests(), max_requests, 0.0, newcomers)


def _starting_line(workers: list[str], duration: float | None, max_requests: int) -> str:
    until = f"for {duration:g} s" if duration is not None else "until Ctrl-C"
    if max_requests:
        until += f" or {counted(max_requests, 'request')}"
    return f"recording {counted(len(workers), 'worker')} ({', '.join(workers)}) {until}"


def _loop(run: _Run, stop: SignalFlag, duration: float | None, status_every: float) -> None:
    """Read until the duration is up, enough requests are gathered, a signal came or Redis
    failed; a status line every ``status_every`` seconds."""
    from redis.exceptions import RedisError

    from agent.runtime.connection import describe_redis_error

    run.started = time.monotonic()
    run.next_look = run.started + NEW_WORKERS_EVERY_S
    end = run.started + duration if duration is not None else float("inf")
    next_status = run.started + (status_every or float("inf"))
    while not stop.is_set() and not run.full and time.monotonic() < end:
        try:
            _take_on_new_workers(run)
            found = run.tail.poll()
        except RedisError as exc:
            run.failure = describe_redis_error(exc)
            return
        _gather(run, found)
        if time.monotonic() >= next_status:
            typer.echo(_status_line(run), err=True)
            next_status += status_every
        if not found:
            stop.wait(min(IDLE_WAIT_S, max(end - time.monotonic(), 0.0)))


def _take_on_new_workers(run: _Run) -> None:
    """Once every ``NEW_WORKERS_EVERY_S``, the workers started since are recorded too (a
    line each on stderr); those whose requests cannot be rebuilt are said and left out."""
    if run.newcomers is None or time.monotonic() < run.next_look:
        return
    run.next_look = time.monotonic() + NEW_WORKERS_EVERY_S
    choice = run.newcomers.look()
    _say_not_whole(choice)
    _say_not_read(run)
    for w in choice.record:
        run.tail.add(w)
        typer.echo(
            f"worker {w} joined: recording it too ({counted(len(run.tail.workers), 'worker')})",
            err=True,
        )


def _say_not_read(run: _Run) -> None:
    """Say once, the first time a look finds them, that new heartbeat keys past the
    workers it reads at most are not read: the workers they name are not recorded."""
    from controlplane.service.trace_recording import MAX_WORKERS_READ

    if run.said_not_read or run.newcomers is None or not run.newcomers.not_read:
        return
    run.said_not_read = True
    keys = counted(run.newcomers.not_read, "new heartbeat key")
    note(
        f"{keys} past the {MAX_WORKERS_READ:,} workers it reads at most "
        "are not read: the workers they name are not recorded"
    )


def _gather(run: _Run, found: list[RecordedRequest]) -> None:
    for request in found:
        if run.full:
            return
        run.gathered.add(request.ts, request.category, request.blocks)


def _status_line(run: _Run) -> str:
    n, s = len(run.gathered), run.seconds()
    rate = n / max(s, 1e-9)
    return f"recorded {counted(n, 'request')} in {s:.0f} s ({rate:.1f}/s), {_dropped(run)}"


def _dropped(run: _Run) -> str:
    """What was left out, in three counts: stream entries gone before they were read (the
    gaps in the workers' sequence numbers: trimmed by the controller or the agent's cap),
    runs of events that made no whole request (events lost, or a request cut by the start
    or end), and whole requests refused because a hash repeats among their blocks (the
    engine's hashes, not the recording, are at fault); a count of zero is left out, so
    that the usual line fits a terminal."""
    trimmed, incomplete = run.tail.counts.trimmed, run.tail.counts.incomplete
    repeating = run.gathered.refused
    dropped = [f"{_entries(trimmed)} trimmed before they were read"] if trimmed else []
    dropped += [counted(incomplete, "incomplete run")] if incomplete else []
    dropped += [f"{counted(repeating, 'request')} repeating a block hash"] if repeating else []
    return f"dropped {', '.join(dropped)}" if dropped else "dropped none"


def _entries(n: int) -> str:
    return counted(n, "stream entry", "stream entries")


def _finish(run: _Run) -> None:
    """The runs still held become requests (unless Redis failed: they stay unread)."""
    if not run.failure:
        _gather(run, run.tail.finish())


def _write(run: _Run, files: tuple[Path, Path], block_tokens: int) -> None:
    """The trace written to the claimed file (``files``: it and ``--output``), then renamed."""
    from controlplane.traces.writer import write_bailian

    partial, output = files
    seconds, c = run.seconds(), run.tail.counts
    if c.bad_entries:
        bad = counted(c.bad_entries, "bad entry", "bad entries")
        say(f"skipped {bad} ({'; '.join(c.bad_reasons)})")
    if c.trimmed:
        say(
            f"{_entries(c.trimmed)} trimmed before they were read: the controller trims "
            "what it has read once KVWISE_STREAM_TRIM_GRACE_S old, the agents at their "
            "stream_maxlen; the recording fell behind them",
            lead="warning: ",
        )
    if not len(run.gathered):
        fail(_nothing_line(run, seconds), code=1)
    try:
        write_bailian(
            run.gathered.trace(output.name, block_tokens), partial, final_name=output.name
        )
        os.replace(partial, output)
    except OSError as exc:
        fail(f"{output}: {exc.strerror or exc}")
    typer.echo(
        f"wrote {output}: {counted(len(run.gathered), 'request')} from "
        f"{counted(len(run.tail.workers), 'worker')} over {seconds:.1f} s; {_dropped(run)}"
    )
    if run.failure:
        fail(f"stopped early, Redis failed: {run.failure}", code=1)


def _nothing_line(run: _Run, seconds: float) -> str:
    if run.failure:
        return f"Redis failed before any whole request was seen: {run.failure}; nothing written"
    entries = _entries(run.tail.counts.entries)
    return f"no whole request in {seconds:.1f} s ({entries} read): nothing written"

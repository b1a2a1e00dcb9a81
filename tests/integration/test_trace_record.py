"""``kvwise trace record`` against a real Redis: a live agent's known requests come back, read
by the trace reader, with their times, shared prefixes and categories; a worker started
while it records is taken on; a worker that does not report requests whole is said and
skipped; no worker and no Redis are one-line errors."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

import numpy as np
import pytest
import redis
from typer.testing import CliRunner

from agent.runtime.agent import Agent
from agent.runtime.connection import redact
from agent.wire import EventKind, Keys, encode_batch
from controlplane.cli import app
from controlplane.dev.embedded_redis import free_port
from controlplane.dev.simworker import TraceWorker
from controlplane.service.settings import ControllerSettings
from controlplane.service.trace_recording import (
    MAX_WORKERS_READ,
    NewWorkers,
    StreamTail,
    WorkerChoice,
)
from controlplane.traces.model import Trace
from controlplane.traces.reader import load_trace
from tests.conftest import REPO
from tests.integration.agent_fixtures import fast_settings
from tests.integration.controller_fixtures import controller
from tests.waiting import wait_until
from tests.wire_samples import agent_status, event_batch

pytestmark = pytest.mark.integration

HIT, INSERT = int(EventKind.HIT), int(EventKind.INSERT)
SPEED = 20.0
"""Trace time divided by this in the live run."""


def known_trace() -> Trace:
    """30 requests 0.1 s apart: three system prompts, conversations that extend their own
    previous prompt (turn 2), two types. Ids chain the prefix (a conversation keeps its
    system prompt), as a live engine's block hashes do, so reading it back keeps them."""
    requests, types, turns = [], [], []
    for i in range(30):
        system = [1000 * (i // 2 % 3) + j for j in range(3)]
        own = [50_000 + 10 * (i // 2) + j for j in range(1 + i % 2)]  # turn 2 extends turn 1
        requests.append(system + own)
        types.append("text" if i % 3 else "image")
        turns.append(1 + i % 2)
    times = [0.1 * i for i in range(30)]
    return Trace.from_requests(requests, times, types=types, turns=turns)


def start_recording(
    args: list[str], env: dict[str, str], *, until: str = "recording "
) -> tuple[subprocess.Popen[str], str]:
    """``kvwise trace record`` in its own process, once it says a line starting ``until``
    (by default: it is recording), and what it said on stderr until then."""
    cmd = [sys.executable, "-m", "controlplane", "trace", "record", *args]
    full = {**os.environ, "COLUMNS": "200", **env}
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stderr is not None
    said = []
    for line in proc.stderr:
        said.append(line)
        if line.startswith(until):
            return proc, "".join(said)
    raise AssertionError(f"never said {until!r}: {''.join(said)}")


class Lines:
    """The lines a pipe gives, gathered by a thread as they come (a test waits on them)."""

    def __init__(self, pipe: IO[str]) -> None:
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(pipe,), daemon=True)
        self._thread.start()

    def _read(self, pipe: IO[str]) -> None:
        for line in pipe:
            self.lines.append(line)

    def text(self) -> str:
        return "".join(self.lines)

    def recorded(self) -> int:
        """The requests the last status line counts (0 before the first)."""
        counts = re.findall(r"^recorded (\d+) request", self.text(), flags=re.M)
        return int(counts[-1]) if counts else 0

    def seconds(self) -> int:
        """The seconds the last status line counts (0 before the first)."""
        counts = re.findall(r"^recorded \d+ requests? in (\d+) s", self.text(), flags=re.M)
        return int(counts[-1]) if counts else 0

    def close(self) -> str:
        self._thread.join(timeout=20)
        return self.text()


class Recording:
    """``kvwise trace record -o OUT --duration SECONDS`` on a test's Redis, started (it said
    it records, or ``until``), its stderr gathered as it comes; ``stop`` is its Ctrl-C."""

    def __init__(
        self,
        out: Path,
        seconds: int,
        redis_url: str,
        key_prefix: str,
        *,
        more: tuple[str, ...] = (),
        until: str = "recording ",
    ) -> None:
        args = ["-o", str(out), "--duration", str(seconds), "--status-every", "0.1", *more]
        self.proc, said = start_recording(
            [*args, "--redis-url", redis_url, "--key-prefix", key_prefix], {}, until=until
        )
        assert self.proc.stderr is not None and self.proc.stdout is not None
        self.said, self.lines = said, Lines(self.proc.stderr)

    def stop(self) -> tuple[int, str, str]:
        """Ctrl-C: its exit code, stdout and all it said on stderr."""
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(timeout=20)
        assert self.proc.stdout is not None
        return self.proc.returncode, self.proc.stdout.read(), self.said + self.lines.close()


def test_records_a_live_agents_requests_as_a_trace(
    tmp_path: Path, redis_url: str, key_prefix: str
) -> None:
    trace = known_trace()
    out = tmp_path / "mine.jsonl.gz"
    whole = Agent(fast_settings(redis_url, key_prefix, worker_id="w1"), capacity=1000)
    radix = Agent(
        fast_settings(redis_url, key_prefix, worker_id="w2"), capacity=10, whole_requests=False
    )
    keys, r = Keys(key_prefix), redis.Redis.from_url(redis_url)
    with whole, radix:
        wait_until(lambda: r.exists(keys.agent("w1"), keys.agent("w2")) == 2, what="heartbeats")
        recording = Recording(out, 30, redis_url, key_prefix)
        TraceWorker(whole, trace, speed=SPEED).run()
    stream = keys.events_stream("w1")
    # Every request read but the last, which is held until the end (on a loaded machine
    # the recording may lag the agent: a Ctrl-C at once would cut it short).
    read = recording.lines.recorded
    wait_until(lambda: read() >= trace.n_requests - 1, timeout=30, what="reads")
    code, stdout, stderr = recording.stop()
    assert code == 0, stderr
    assert "recording 1 worker (w1) for 30 s or 100,000 requests" in stderr
    assert "worker w2: its agent does not report requests whole" in stderr
    assert "requests cannot be rebuilt; skipped" in stderr
    assert stdout.startswith(f"wrote {out}: 30 requests from 1 worker over ")
    assert stdout.strip().endswith("dropped none")
    assert not r.exists(f"{key_prefix}ingest:{{w1}}")  # read-only: no ledger, no group
    assert r.xinfo_groups(stream) == []
    assert not r.exists(keys.recording)  # its notice to the controller withdrawn

    assert [p.name for p in tmp_path.iterdir()] == [out.name]  # written, then renamed
    head = out.read_bytes()  # gzip's FNAME names the file, not its temporary (RFC 1952)
    assert head[10 : head.index(b"\0", 10)] == b"mine.jsonl"
    got = load_trace(out)
    assert got.n_requests == trace.n_requests and got.source_format == "bailian"
    want_times = (trace.timestamps - trace.timestamps[0]) / SPEED
    np.testing.assert_allclose(got.timestamps, want_times, atol=1e-4)
    assert [got.category_names[c] for c in got.categories] == [
        trace.category_names[c] for c in trace.categories
    ]
    assert np.array_equal(got.lengths, trace.lengths)
    # The same block where the input had the same block, and only there.
    assert np.array_equal(got.blocks, trace.blocks)
    assert got.hashes.max() < got.n_unique  # small ids


def test_a_running_controller_takes_no_request_from_the_recording(
    tmp_path: Path, redis_url: str, key_prefix: str
) -> None:
    """The controller's ingest trimmed what it acknowledged at once: a recording beside it
    lost the entries it had not read yet (on a user's vLLM, 222 requests of 240)."""
    trace = known_trace()
    out = tmp_path / "mine.jsonl"
    grace = ControllerSettings.model_fields["stream_trim_grace_s"].default
    keys, r = Keys(key_prefix), redis.Redis.from_url(redis_url)
    with controller(redis_url, key_prefix, stream_trim_grace_s=grace) as running:
        with Agent(fast_settings(redis_url, key_prefix, worker_id="w1"), capacity=1000) as agent:
            wait_until(lambda: r.exists(keys.agent("w1")), what="w1's heartbeat")
            recording = Recording(out, 60, redis_url, key_prefix)
            TraceWorker(agent, trace, speed=SPEED).run()
        batches = running.ingestor.counters
        wait_until(lambda: recording.lines.recorded() >= trace.n_requests - 1, what="reads")
        code, stdout, text = recording.stop()
    assert code == 0, text
    assert batches.batches > 1  # the controller read the same entries meanwhile
    assert stdout.startswith(f"wrote {out}: 30 requests from 1 worker over ")
    assert stdout.strip().endswith("dropped none")


def test_a_worker_started_while_recording_is_taken_on(
    tmp_path: Path, redis_url: str, key_prefix: str
) -> None:
    """A replica scaled up mid-recording: noticed, said, and its requests recorded, those it
    served before it was noticed too (its stream is read from the recording's start)."""
    trace = known_trace()
    out = tmp_path / "mine.jsonl"
    keys, r = Keys(key_prefix), redis.Redis.from_url(redis_url)
    first = Agent(fast_settings(redis_url, key_prefix, worker_id="w1"), capacity=1000)
    with first:
        wait_until(lambda: r.exists(keys.agent("w1")), what="w1's heartbeat")
        recording = Recording(out, 60, redis_url, key_prefix)
        with Agent(fast_settings(redis_url, key_prefix, worker_id="w3"), capacity=1000) as late:
            TraceWorker(late, trace, speed=SPEED).run()
        lines = recording.lines
        wait_until(lambda: "worker w3 joined" in lines.text(), timeout=30, what="w3 joining")
        # The last request of a worker is held until the recording ends: all others are in.
        wait_until(lambda: lines.recorded() >= trace.n_requests - 1, timeout=30, what="reads")
        code, stdout, text = recording.stop()
    assert code == 0, text
    assert "recording 1 worker (w1) for 60 s" in text
    assert "worker w3 joined: recording it too (2 workers)" in text
    assert stdout.startswith(f"wrote {out}: 30 requests from 2 workers over ")
    got = load_trace(out)
    assert got.n_requests == trace.n_requests
    assert np.array_equal(got.blocks, trace.blocks)


def test_a_request_repeating_a_block_hash_is_not_counted_as_incomplete(
    tmp_path: Path, redis_url: str, key_prefix: str
) -> None:
    """A whole request whose blocks repeat a hash is refused (the trace reader would refuse
    its line) and said as such, not as an incomplete run (which means events were lost).
    No engine hashes a prompt that way: the test writes the worker's entries itself."""
    out = tmp_path / "mine.jsonl"
    keys, r = Keys(key_prefix), redis.Redis.from_url(redis_url)
    status = agent_status(id="w1", whole_requests=True, updated_at=time.time())
    r.set(keys.agent("w1"), status.to_json(), ex=60)
    recording = Recording(out, 60, redis_url, key_prefix)
    # Three requests, their new blocks released tail first: [1, 2, 3], [4, 5, 4] (a hash
    # repeats), then [1, 2, 6] (two hits), held until the end as a worker's last is.
    batch = event_batch(
        worker="w1",
        ts=[1.0] * 3 + [2.0] * 3 + [3.0] * 3,
        block=[3, 2, 1, 4, 5, 4, 1, 2, 6],
        offset=[2, 1, 0, 2, 1, 0, 0, 1, 2],
        kind=[INSERT] * 6 + [HIT, HIT, INSERT],
    )
    r.xadd(keys.events_stream("w1"), encode_batch(batch))  # type: ignore[arg-type]
    said = recording.lines.text
    wait_until(lambda: "1 request repeating a block hash" in said(), what="the refusal")
    code, stdout, text = recording.stop()
    assert code == 0, text
    assert stdout.startswith(f"wrote {out}: 2 requests from 1 worker over ")
    assert stdout.strip().endswith("dropped 1 request repeating a block hash")
    assert load_trace(out).n_requests == 2


def test_entries_trimmed_before_they_were_read_are_counted(redis_url: str, key_prefix: str) -> None:
    """A controller's trim took entries the tail had not read: they were lost silently.
    The gaps in the worker's sequence numbers say how many, a resent batch is no gap, and
    an agent's new epoch counts from its first batch."""
    keys, r = Keys(key_prefix), redis.Redis.from_url(redis_url)
    stream = keys.events_stream("w1")

    def add(seq: int, epoch: str = "e") -> bytes:
        batch = event_batch(
            worker="w1", seq=seq, epoch=epoch, ts=1.0, block=seq, offset=0, kind=INSERT
        )
        return r.xadd(stream, encode_batch(batch))  # type: ignore[arg-type,no-any-return]

    add(1)  # before the recording: where it counts from
    tail = StreamTail(r, keys, ["w1"])
    add(2), add(3)
    r.xtrim(stream, minid=add(4), approximate=False)  # 2 and 3 trimmed unread, as ingest does
    tail.poll()
    assert tail.counts.trimmed == 2
    add(4), add(6)  # 4 resent (no gap), then 5 lost
    add(3, epoch="f")  # the agent restarted: its batches 1 and 2 lost
    tail.poll()
    assert tail.counts.entries == 4 and tail.counts.trimmed == 2 + 1 + 2


def test_a_recording_says_the_entries_trimmed_before_it_read_them(
    tmp_path: Path, redis_url: str, key_prefix: str
) -> None:
    """The summary said "dropped none" for a recording that had lost entries."""
    out = tmp_path / "mine.jsonl"
    keys, r = Keys(key_prefix), redis.Redis.from_url(redis_url)
    status = agent_status(id="w1", whole_requests=True, updated_at=time.time())
    r.set(keys.agent("w1"), status.to_json(), ex=60)
    stream = keys.events_stream("w1")
    one = {"ts": 1.0, "block": 7, "offset": 0, "kind": INSERT}
    r.xadd(stream, encode_batch(event_batch(worker="w1", seq=1, **one)))  # type: ignore[arg-type]
    recording = Recording(out, 60, redis_url, key_prefix)
    two = {"ts": 2.0, "block": 8, "offset": 0, "kind": INSERT}
    r.xadd(stream, encode_batch(event_batch(worker="w1", seq=5, **two)))  # type: ignore[arg-type]
    said = recording.lines.text
    wait_until(lambda: "3 stream entries trimmed before they were read" in said(), what="it")
    code, stdout, text = recording.stop()
    assert code == 0, text
    assert stdout.strip().endswith("dropped 3 stream entries trimmed before they were read")
    assert "warning: 3 stream entries trimmed before they were read: the controller" in text


def test_no_worker_is_one_error_line(redis_url: str, key_prefix: str, tmp_path: Path) -> None:
    """With ``--wait 0``, as before there was a wait: the error at once, nothing else said."""
    args = ["trace", "record", "-o", str(tmp_path / "t.jsonl"), "--duration", "1", "--wait", "0"]
    args += ["--redis-url", redis_url, "--key-prefix", key_prefix]
    started = time.monotonic()
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2
    assert res.stderr.startswith("error: no worker to record: no agent heartbeat under prefix")
    assert res.stderr.strip().endswith("(is an agent running?)") and "--wait" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert time.monotonic() - started < 5
    assert list(tmp_path.iterdir()) == []


def test_a_recording_started_before_any_worker_records_the_first_one_to_come(
    tmp_path: Path, redis_url: str, key_prefix: str
) -> None:
    """An operator starts the recording, then the servers: it exited 2 ("no worker to
    record"). It waits for the first worker, says so once, and records it, the requests it
    served before the wait's next look included (read from the wait's start); a worker
    whose requests cannot be rebuilt does not end the wait. --duration counts from the
    first worker."""
    trace = known_trace()
    out = tmp_path / "mine.jsonl"
    keys, r = Keys(key_prefix), redis.Redis.from_url(redis_url)
    radix = agent_status(id="w2", whole_requests=False, updated_at=time.time())
    r.set(keys.agent("w2"), radix.to_json(), ex=60)
    more = ("--wait", "60")
    recording = Recording(out, 60, redis_url, key_prefix, more=more, until="waiting ")
    said = recording.said
    assert said.count("worker w2: its agent does not report requests whole") == 1
    assert said.splitlines()[-1] == (
        f"waiting up to 60 s for a worker's heartbeat under prefix {key_prefix!r} at "
        f"{redact(redis_url)} (Ctrl-C to stop)"
    )
    time.sleep(1.5)  # three looks: w2 is no worker to record, nor said again
    lines = recording.lines
    assert "recording " not in lines.text() and recording.proc.poll() is None
    with Agent(fast_settings(redis_url, key_prefix, worker_id="w1"), capacity=1000) as agent:
        TraceWorker(agent, trace, speed=SPEED).run()  # before the wait's next look, likely
        wait_until(lambda: "recording " in lines.text(), timeout=30, what="the recording")
    wait_until(lambda: lines.recorded() >= trace.n_requests - 1, timeout=30, what="reads")
    code, stdout, text = recording.stop()
    assert code == 0, text
    assert text.count("waiting up to") == 1 and text.count("does not report requests") == 1
    assert "recording 1 worker (w1) for 60 s" in text
    assert stdout.startswith(f"wrote {out}: 30 requests from 1 worker over ")
    assert stdout.strip().endswith("dropped none")
    got = load_trace(out)
    assert got.n_requests == trace.n_requests
    assert np.array_equal(got.blocks, trace.blocks)
    assert not r.exists(keys.recording)


def test_a_recording_waiting_for_named_workers_takes_only_them(
    tmp_path: Path, redis_url: str, key_prefix: str
) -> None:
    """With --worker, the wait ends on a named worker's heartbeat, not another's; a named
    one still missing then is said and skipped, as at the start."""
    keys, r = Keys(key_prefix), redis.Redis.from_url(redis_url)
    more = ("--wait", "60", "--worker", "w2", "--worker", "w3")
    recording = Recording(tmp_path / "t.jsonl", 60, redis_url, key_prefix, more=more, until="wait")
    assert "for a heartbeat of --worker w2, w3 under prefix" in recording.said
    other = agent_status(id="w1", whole_requests=True, updated_at=time.time())
    r.set(keys.agent("w1"), other.to_json(), ex=60)
    time.sleep(1.5)  # three looks
    lines = recording.lines
    assert "recording " not in lines.text() and recording.proc.poll() is None
    named = agent_status(id="w2", whole_requests=True, updated_at=time.time())
    r.set(keys.agent("w2"), named.to_json(), ex=60)
    wait_until(lambda: "recording " in lines.text(), timeout=30, what="the recording")
    code, _, text = recording.stop()
    assert code == 1, text  # stopped with nothing recorded
    assert "recording 1 worker (w2) for 60 s" in text
    assert "warning: worker w3: no heartbeat under prefix" in text
    assert "worker w1" not in text


def test_no_worker_within_the_wait_is_the_error_naming_it(
    redis_url: str, key_prefix: str, tmp_path: Path
) -> None:
    args = ["trace", "record", "-o", str(tmp_path / "t.jsonl"), "--wait", "1.5"]
    args += ["--redis-url", redis_url, "--key-prefix", key_prefix]
    started = time.monotonic()
    res = CliRunner().invoke(app, args)
    assert time.monotonic() - started >= 1.5
    assert res.exit_code == 2
    said = res.stderr.strip().splitlines()
    assert said[0].startswith("waiting up to 1.5 s for a worker's heartbeat under prefix")
    assert said[1].startswith("error: no worker to record: no agent heartbeat under prefix")
    assert said[1].endswith(" within --wait 1.5 s (is an agent running?)")
    assert len(said) == 2
    assert list(tmp_path.iterdir()) == []
    assert not redis.Redis.from_url(redis_url).exists(Keys(key_prefix).recording)


def test_ctrl_c_while_waiting_ends_cleanly_with_nothing_written(
    redis_url: str, key_prefix: str, tmp_path: Path
) -> None:
    """Waiting by default (no --wait): a Ctrl-C ends it as one with nothing recorded does."""
    args = ["-o", str(tmp_path / "t.jsonl"), "--redis-url", redis_url, "--key-prefix", key_prefix]
    proc, said = start_recording(args, {}, until="waiting ")
    assert said.startswith("waiting up to 300 s for a worker's heartbeat")
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=20)
    assert proc.returncode == 1, stderr
    assert (
        stderr == "error: stopped while waiting for a worker: nothing recorded, nothing written\n"
    )
    assert list(tmp_path.iterdir()) == []
    assert not redis.Redis.from_url(redis_url).exists(Keys(key_prefix).recording)


def test_unreachable_redis_is_one_error_line(tmp_path: Path) -> None:
    url = f"redis://kvwise:hunter2@127.0.0.1:{free_port()}/0"
    args = ["trace", "record", "-o", str(tmp_path / "t.jsonl"), "--redis-url", url]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2
    assert res.stderr.startswith("error: Redis at redis://kvwise:***@127.0.0.1:")
    assert "does not answer (redis unavailable: " in res.stderr
    assert "hunter2" not in res.stderr and len(res.stderr.strip().splitlines()) == 1


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_an_output_that_cannot_be_created_fails_before_redis_is_asked(tmp_path: Path) -> None:
    """/proc/self is a folder in which not even root creates a file: said at once, not after
    a recording (Redis here would not answer: it is never reached)."""
    url = f"redis://127.0.0.1:{free_port()}/0"
    res = CliRunner().invoke(
        app, ["trace", "record", "-o", "/proc/self/t.jsonl", "--redis-url", url]
    )
    assert res.exit_code == 2
    assert res.stderr.startswith("error: --output: cannot create a file in /proc/self (")


@pytest.mark.skipif(not Path("/dev/stdout").exists(), reason="needs /dev/stdout")
def test_an_output_that_is_no_file_fails_before_redis_is_asked() -> None:
    """``-o /dev/stdout`` claimed a file in /dev and, at the end, renamed it over the link:
    as root that replaced /dev/stdout itself. A device, a pipe or a name under /dev is
    refused at once (Redis here would not answer: it is never reached)."""
    url = f"redis://127.0.0.1:{free_port()}/0"
    res = CliRunner().invoke(app, ["trace", "record", "-o", "/dev/stdout", "--redis-url", url])
    assert res.exit_code == 2
    assert res.stderr == (
        "error: --output: /dev/stdout is not a file: the trace is written to a file, then renamed\n"
    )


def test_new_workers_are_read_bounded_and_seen_up_to_the_cap(
    redis_url: str, key_prefix: str
) -> None:
    """``NewWorkers.look`` read every new heartbeat whole (a 2 MB one parsed, and listed)
    and its set of keys seen grew with every heartbeat key any process wrote. A heartbeat is
    read as the controller's listing reads it (too large: refused), and at most
    ``MAX_WORKERS_READ`` workers are seen; the keys past them are counted, not read."""
    keys, r = Keys(key_prefix), redis.Redis.from_url(redis_url)
    huge = agent_status(id="big", last_rejection="x" * 2_000_000)
    r.set(keys.agent("big"), huge.to_json(), px=60_000)
    newcomers = NewWorkers(r, keys, seen=["w0000"])
    assert newcomers.look() == WorkerChoice([], [], [])  # "big" refused for its size
    assert newcomers.not_read == 0
    pipe = r.pipeline(transaction=False)
    for n in range(1, MAX_WORKERS_READ + 50):
        pipe.set(keys.agent(f"w{n:04}"), agent_status(id=f"w{n:04}").to_json(), px=60_000)
    pipe.execute()
    choice = newcomers.look()
    # "big", first by key, is read again (its agent may rewrite it) and refused again
    assert len(choice.record) + len(choice.not_whole) == MAX_WORKERS_READ - 2
    assert newcomers.not_read == 51
    assert len(newcomers._seen) == MAX_WORKERS_READ - 1
    assert newcomers.look() == WorkerChoice([], [], []) and newcomers.not_read == 51


def test_heartbeat_keys_past_the_cap_are_said_once(
    tmp_path: Path, redis_url: str, key_prefix: str
) -> None:
    """``NewWorkers.not_read`` was counted but never shown: workers past the cap were left
    out of the recording without a word."""
    keys, r = Keys(key_prefix), redis.Redis.from_url(redis_url)
    whole = agent_status(id="w0000", whole_requests=True)
    r.set(keys.agent("w0000"), whole.to_json(), px=60_000)
    recording = Recording(tmp_path / "mine.jsonl", 60, redis_url, key_prefix)
    pipe = r.pipeline(transaction=False)
    for n in range(1, MAX_WORKERS_READ + 50):
        pipe.set(keys.agent(f"w{n:04}"), agent_status(id=f"w{n:04}").to_json(), px=60_000)
    pipe.execute()
    lines = recording.lines
    wait_until(lambda: "note: " in lines.text(), timeout=30, what="the note")
    said_at = lines.seconds()
    # two more looks (every NEW_WORKERS_EVERY_S, by the recording's own status lines)
    wait_until(lambda: lines.seconds() >= said_at + 5, timeout=30, what="two more looks")
    _, _, text = recording.stop()
    assert text.count("note: ") == 1
    assert (
        "note: 50 new heartbeat keys past the 1,024 workers it reads at most are not read: the "
        "workers they name are not recorded" in " ".join(text.split())
    )


@pytest.mark.parametrize("wait", ["0", "1"])
def test_a_named_worker_without_a_heartbeat_is_the_error_listing_the_live_ones(
    redis_url: str, key_prefix: str, tmp_path: Path, wait: str
) -> None:
    """``--worker nosuch`` while other workers heartbeat said "no agent heartbeat under
    prefix ... (is an agent running?)"; it names the worker and those that are there."""
    keys, r = Keys(key_prefix), redis.Redis.from_url(redis_url)
    for n in range(12):
        status = agent_status(id=f"w{n:02}", whole_requests=True, updated_at=time.time())
        r.set(keys.agent(f"w{n:02}"), status.to_json(), ex=60)
    args = ["trace", "record", "-o", str(tmp_path / "t.jsonl"), "--duration", "3"]
    args += ["--redis-url", redis_url, "--key-prefix", key_prefix]
    res = CliRunner().invoke(app, [*args, "--worker", "nosuch", "--wait", wait])
    assert res.exit_code == 2, res.stderr
    error = [line for line in res.stderr.splitlines() if line.startswith("error: ")]
    assert error == [
        f"error: no worker to record: no heartbeat of --worker nosuch under prefix "
        f"{key_prefix!r} at {redact(redis_url)}{' within --wait 1 s' if wait == '1' else ''}; "
        "live workers there: w00, w01, w02, w03, w04, w05, w06, w07, w08, w09, and 2 more"
    ]
    assert "warning" not in res.stderr  # the error names it: said once
    assert list(tmp_path.iterdir()) == []

"""``kvwise worker`` against a real Redis: a short replay whose stream entries decode, carry
consecutive sequence numbers and account for every event; SIGTERM stops it cleanly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import redis
from typer.testing import CliRunner

from agent.policies.lru import LRUPolicy
from agent.wire import EventKind, Keys, decode_batch
from controlplane.cli import app
from controlplane.replay.engine import replay_hits
from controlplane.service.store import PolicyStore
from controlplane.traces.reader import load_trace
from tests.conftest import REPO

pytestmark = pytest.mark.integration


def write_trace(path: Path, n: int = 400, seed: int = 3) -> Path:
    """A small Bailian-format trace: shared prefixes, two types, a few turns, 0.01 s apart."""
    rng = np.random.default_rng(seed)
    with path.open("w") as f:
        for i in range(n):
            prefix = int(rng.integers(0, 6)) * 100
            ids = [prefix + j for j in range(int(rng.integers(1, 5)))]
            ids += [10_000 + i * 10 + j for j in range(int(rng.integers(1, 4)))]
            row = {
                "chat_id": i,
                "parent_chat_id": -1,
                "timestamp": round(i * 0.01, 3),
                "input_length": 16 * len(ids),
                "output_length": 8,
                "type": str(rng.choice(["text", "image"])),
                "turn": int(rng.integers(1, 3)),
                "hash_ids": ids,
            }
            f.write(json.dumps(row) + "\n")
    return path


def test_worker_replays_a_trace_into_decodable_batches(
    tmp_path: Path, redis_url: str, key_prefix: str
) -> None:
    trace_path = write_trace(tmp_path / "t.jsonl")
    env = {"KVWISE_KEY_PREFIX": key_prefix, "KVWISE_BATCH_EVENTS": "100"}
    args = ["worker", "--trace", str(trace_path), "--speed", "50", "--capacity", "30"]
    args += ["--id", "sim-1", "--policy", "lru", "--redis-url", redis_url, "--json"]
    res = CliRunner().invoke(app, args, env=env)
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout.strip().splitlines()[-1])

    trace = load_trace(trace_path)
    want = int(replay_hits(trace, LRUPolicy(), 30).sum())
    assert summary["requests"] == trace.n_requests == 400 and summary["loops"] == 1
    assert summary["hits"] == want and summary["accesses"] == trace.n_accesses
    assert summary["worker"] == "sim-1" and summary["policy"] == "lru"

    r = redis.Redis.from_url(redis_url)
    entries = r.xrange(Keys(key_prefix).events_stream("sim-1"))
    batches = [decode_batch(fields) for _, fields in entries]
    assert [b.seq for b in batches] == list(range(1, len(batches) + 1))
    assert len({b.epoch for b in batches}) == 1
    assert sum(len(b) for b in batches) == summary["events_sent"] > 0
    assert summary["events_dropped"] == 0
    names = set(batches[-1].categories)
    assert names == {"unknown", *trace.category_names}
    kinds = np.concatenate([b.kind for b in batches])
    inserted = int((kinds == EventKind.INSERT).sum())
    assert inserted - int((kinds == EventKind.EVICT).sum()) <= 30
    assert inserted == trace.n_accesses - int((kinds == EventKind.HIT).sum())
    status = json.loads(r.get(Keys(key_prefix).agent("sim-1")) or b"{}")
    assert status["accesses"] == trace.n_accesses and status["events_sent"] > 0
    r.close()


def test_the_json_summary_names_the_worker_once(
    tmp_path: Path, redis_url: str, key_prefix: str
) -> None:
    """The agent's counters join the replay's in one flat object: the id is its ``worker``
    field alone, not repeated as the heartbeat's ``id``."""
    trace_path = write_trace(tmp_path / "t.jsonl", n=20)
    args = ["worker", "--trace", str(trace_path), "--speed", "100", "--capacity", "30"]
    args += ["--id", "sim-5", "--policy", "lru", "--redis-url", redis_url, "--json"]
    res = CliRunner().invoke(app, args, env={"KVWISE_KEY_PREFIX": key_prefix})
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert [k for k, v in summary.items() if v == "sim-5"] == ["worker"]
    assert "id" not in summary and summary["engine"] == "sim"


def test_the_key_prefix_option_wins_over_the_variable(
    tmp_path: Path, redis_url: str, key_prefix: str
) -> None:
    """The worker took its prefix from ``KVWISE_KEY_PREFIX`` only, though ``trace record``
    has ``--key-prefix``: a worker for a controller under its own prefix needed the
    variable, and its --help said nothing of it."""
    trace_path = write_trace(tmp_path / "t.jsonl", n=20)
    other = key_prefix + "other:"
    args = ["worker", "--trace", str(trace_path), "--speed", "100", "--capacity", "30"]
    args += ["--id", "sim-6", "--redis-url", redis_url, "--key-prefix", key_prefix]
    res = CliRunner().invoke(app, args, env={"KVWISE_KEY_PREFIX": other})
    assert res.exit_code == 0, res.output
    r = redis.Redis.from_url(redis_url)
    assert r.xlen(Keys(key_prefix).events_stream("sim-6")) > 0
    assert not r.exists(Keys(other).events_stream("sim-6"))


def test_worker_ends_with_one_summary_line(tmp_path: Path, redis_url: str, key_prefix: str) -> None:
    trace_path = write_trace(tmp_path / "t.jsonl", n=50)
    args = ["worker", "--trace", str(trace_path), "--speed", "100", "--capacity", "30"]
    args += ["--id", "sim-3", "--policy", "lru", "--redis-url", redis_url]
    res = CliRunner().invoke(app, args, env={"KVWISE_KEY_PREFIX": key_prefix})
    assert res.exit_code == 0, res.output
    (line, how, sent_line) = res.stdout.strip().splitlines()
    assert line == "done: worker sim-3 [lru, 30 blocks]: 50 requests (1 full pass)"
    assert how.startswith("  hit ratio ") and how.endswith(" ns/block")
    assert int(how.split(" agent ")[1].split()[0]) >= 0  # sampled: 0 until a call is timed
    assert max(len(how), len(sent_line)) <= 80
    line = how + sent_line
    sent = int(line.split("events sent ")[1].split()[0].replace(",", ""))
    assert sent > 0 and "dropped 0," in line and "applied version 0" in line


def test_dropped_events_are_explained(tmp_path: Path, redis_url: str, key_prefix: str) -> None:
    """A replay faster than the agent's buffer drains ended with 'dropped N' in the summary
    and nothing more, though the controller fitted and shadowed without those events."""
    trace_path = write_trace(tmp_path / "t.jsonl", n=400)
    args = ["worker", "--trace", str(trace_path), "--speed", "1000", "--capacity", "30"]
    args += ["--id", "sim-6", "--policy", "lru", "--redis-url", redis_url]
    env = {"KVWISE_KEY_PREFIX": key_prefix, "KVWISE_BUFFER_EVENTS": "16"}
    res = CliRunner().invoke(app, args, env=env)
    assert res.exit_code == 0, res.output
    sent_line = res.stdout.strip().splitlines()[-1]
    dropped = int(sent_line.split(" dropped ")[1].split()[0].rstrip(",").replace(",", ""))
    assert dropped > 0, sent_line
    said = " ".join(res.stderr.split())
    assert f"note: {dropped:,} events never reached Redis" in said, res.stderr
    assert "KVWISE_BUFFER_EVENTS, 16" in said and "A lower --speed" in said
    assert max(len(line) for line in res.stderr.splitlines()) <= 80


@pytest.mark.parametrize(
    ("policy", "shown"), [("device", "device -> s3fifo (fleet)"), ("lru", "lru")]
)
def test_the_summary_says_when_the_fleets_family_replaced_the_requested_one(
    tmp_path: Path, redis_url: str, key_prefix: str, policy: str, shown: str
) -> None:
    """``device`` follows the fleet's pin (and says so); a baseline is a fixed control."""
    store = PolicyStore(redis.Redis.from_url(redis_url), Keys(key_prefix), history_size=10)
    store.pin_evictor("s3fifo")
    trace_path = write_trace(tmp_path / "t.jsonl", n=50)
    args = ["worker", "--trace", str(trace_path), "--speed", "100", "--capacity", "30"]
    args += ["--id", "sim-4", "--policy", policy, "--redis-url", redis_url]
    res = CliRunner().invoke(app, args, env={"KVWISE_KEY_PREFIX": key_prefix})
    assert res.exit_code == 0, res.output
    assert res.stdout.startswith(f"done: worker sim-4 [{shown}, 30 blocks]: 50 requests")


def test_a_device_worker_runs_the_device_evictor_and_hits_as_wa_does(
    tmp_path: Path, redis_url: str, key_prefix: str
) -> None:
    """``--policy device`` ran the CPU ``wa`` and said ``[wa, ...]``; it runs the torch
    evictor on ``KVWISE_DEVICE`` (the same victims: the same hit ratio), and a device this
    torch cannot use is one error line naming the variable, not a ``wa`` run instead."""
    pytest.importorskip("torch")
    trace_path = write_trace(tmp_path / "t.jsonl", n=200)
    env = {"KVWISE_KEY_PREFIX": key_prefix, "KVWISE_DEVICE": "cpu"}
    runs = {}
    for policy in ("device", "wa"):
        args = ["worker", "--trace", str(trace_path), "--speed", "200", "--capacity", "30"]
        args += ["--id", f"sim-{policy}", "--policy", policy, "--redis-url", redis_url]
        res = CliRunner().invoke(app, args, env=env)
        assert res.exit_code == 0, res.output
        runs[policy] = res.stdout.splitlines()
    assert runs["device"][0].startswith("done: worker sim-device [device, 30 blocks]: 200 ")
    assert runs["wa"][0].startswith("done: worker sim-wa [wa, 30 blocks]: 200 ")
    hits = [runs[policy][1].split(", applied")[0] for policy in ("device", "wa")]
    assert hits[0] == hits[1] and hits[0] != "  hit ratio 0.0000", hits
    args = ["worker", "--trace", str(trace_path), "--capacity", "30", "--policy", "device"]
    res = CliRunner().invoke(app, args, env={**env, "KVWISE_DEVICE": "cuda:99"})
    assert res.exit_code == 2
    assert "error: --policy device: KVWISE_DEVICE=cuda:99: device 'cuda:99' cannot be used" in (
        res.output
    )


def test_worker_rejects_unknown_policy_and_missing_trace(tmp_path: Path) -> None:
    trace_path = write_trace(tmp_path / "t.jsonl", n=3)
    runner = CliRunner()
    res = runner.invoke(
        app, ["worker", "--trace", str(trace_path), "--capacity", "5", "--policy", "nope"]
    )
    assert res.exit_code == 2 and "unknown policy 'nope'" in res.output
    assert "lru, s3fifo, sieve, wa, device" in res.output  # every name --policy accepts
    res = runner.invoke(app, ["worker", "--trace", str(tmp_path / "no.jsonl"), "--capacity", "5"])
    assert res.exit_code == 2


@pytest.mark.slow
def test_sigterm_stops_a_looping_worker_after_flushing(
    tmp_path: Path, redis_url: str, key_prefix: str
) -> None:
    trace_path = write_trace(tmp_path / "t.jsonl", n=200)
    env = {**os.environ, "KVWISE_KEY_PREFIX": key_prefix, "KVWISE_REDIS_URL": redis_url}
    cmd = [sys.executable, "-c", "from controlplane.cli import main; main()"]
    cmd += ["worker", "--trace", str(trace_path), "--speed", "5", "--capacity", "40"]
    cmd += ["--id", "sim-2", "--policy", "lru", "--loop", "--json", "--status-every", "0.2"]
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    r = redis.Redis.from_url(redis_url)
    stream = Keys(key_prefix).events_stream("sim-2")
    try:
        deadline = time.monotonic() + 30
        while r.xlen(stream) < 2:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no events from the worker"
            threading.Event().wait(0.05)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    summary = json.loads(out.strip().splitlines()[-1])
    assert 0 < summary["requests"] < 10 * 200  # stopped by the signal, not the trace
    assert "hit ratio" in err  # the periodic status line
    batches = [decode_batch(f) for _, f in r.xrange(stream)]
    assert sum(len(b) for b in batches) == summary["events_sent"]
    assert [b.seq for b in batches] == list(range(1, len(batches) + 1))
    r.close()


def test_a_sigterm_during_the_wait_stops_it() -> None:
    """A real SIGTERM to this process while its main thread waits on the stop: the handler
    sets it (taking no lock: a handler runs on the main thread, which may hold any lock
    at that moment) and the wait returns at once."""
    from controlplane.cli.signals import SignalFlag, stop_on_signals

    stop = SignalFlag()
    before = signal.getsignal(signal.SIGTERM)
    with stop_on_signals(stop):
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM)).start()
        t0 = time.monotonic()
        assert stop.wait(30)
        assert time.monotonic() - t0 < 5
    assert signal.getsignal(signal.SIGTERM) == before


def test_the_signal_flag_waits_until_set_or_timed_out() -> None:
    from controlplane.cli.signals import SignalFlag

    flag = SignalFlag()
    t0 = time.monotonic()
    assert not flag.wait(0.15)
    assert time.monotonic() - t0 >= 0.15
    threading.Timer(0.1, flag.set).start()
    assert flag.wait(10) and time.monotonic() - t0 < 5

"""``kvwise demo --json`` as a user runs it (Redis, a controller and simulated workers as
processes): its final summary carries the shadow evaluation's capacity curves, one per
policy, at every multiple of the workers' capacity."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
DEMO_ARGS = ("--workers", "2", "--duration", "30", "--json")


def test_demo_summary_shows_shadow_curves(redis_url: str) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "controlplane", "demo", *DEMO_ARGS],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "KVWISE_REDIS_URL": redis_url},
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert max(len(line) for line in res.stderr.splitlines()) <= 80, res.stderr
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["interrupted"] is False
    shadow = summary["shadow"]
    assert shadow["enabled"] is True
    (group,) = shadow["groups"]  # the demo's workers share one capacity
    assert group["capacity"] == summary["capacity_blocks"]
    assert sorted(group["workers"]) == sorted(a["id"] for a in summary["agents"])
    assert group["requests_seen"] > 0
    # The summary is read once the workers stopped: their final counters, all ingested.
    for agent in summary["agents"]:
        assert agent["events_sent"] == agent["events_ingested"] > 0, agent
    assert [c["policy"] for c in group["curves"]] == ["wa", "lru", "s3fifo", "arc"]
    for curve in group["curves"]:
        ratios = [p["hit_ratio"] for p in curve["points"]]
        assert [p["multiple"] for p in curve["points"]] == shadow["ladder"]
        assert all(0.0 <= r <= 1.0 for r in ratios)
    assert any(p["hit_ratio"] > 0 for c in group["curves"] for p in c["points"])


def test_demo_into_a_file_prints_the_whole_summary_on_stdout(redis_url: str) -> None:
    """Output to a file or a pipe gets no live view (a cut-down frame, sized for a
    terminal it does not have) but the whole summary, once, on stdout."""
    res = subprocess.run(
        [sys.executable, "-m", "controlplane", "demo", "--workers", "2", "--duration", "15"],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "KVWISE_REDIS_URL": redis_url},
    )
    assert res.returncode == 0, res.stderr[-3000:]
    titles = ("Workers (synthetic", "Fitted parameters per category", "What each policy would")
    for title in titles:
        assert res.stdout.count(title) == 1, res.stdout
    assert "taller terminal" not in res.stdout + res.stderr
    assert "stopped every process" in res.stderr


def test_a_ctrl_c_ends_the_demo_with_exit_code_130_and_says_so(redis_url: str) -> None:
    """A Ctrl-C ended the demo with exit code 0 (a replay's is 130), and its JSON still
    gave the URLs of the controller it had stopped."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "controlplane", "demo", "--workers", "2", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "KVWISE_REDIS_URL": redis_url},
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as at a terminal
    )
    assert proc.stderr is not None
    said = [proc.stderr.readline() for _ in range(7)]  # up to "on synthetic to-C traces"
    assert "synthetic to-C traces" in said[-1], said
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C sends: the whole group
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-3000:]
    assert err.strip().splitlines()[-1] == (
        "kvwise demo: interrupted; stopped every process and removed the demo's data."
    )
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["interrupted"] is True
    assert "api" not in summary and "dashboard" not in summary  # the controller is gone


def test_a_deployments_tokens_in_the_environment_leave_the_demo_open(redis_url: str) -> None:
    """An operator who exported a cluster controller's tokens (``kvwise bench serve`` reads
    them) ran a demo whose controller demanded them: its own reads were refused, and the
    summary was one error line instead of the fitted policy and the workers."""
    tokens = {"KVWISE_API_TOKEN": "deploy-write-1", "KVWISE_API_READ_TOKEN": "deploy-read-1"}
    args = ("demo", "--workers", "2", "--duration", "8", "--json")
    res = subprocess.run(
        [sys.executable, "-m", "controlplane", *args],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "KVWISE_REDIS_URL": redis_url, **tokens},
    )
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert "error" not in summary, summary
    assert summary["policy_version"] >= 1
    assert sorted(a["id"] for a in summary["agents"]) == ["lru-1", "wa-1"]

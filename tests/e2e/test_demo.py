"""``kvwise demo --json`` as a user runs it (Redis, a controller and simulated workers as
processes): its final summary carries the shadow evaluation's capacity curves, one per
policy, at every multiple of the workers' capacity."""

from __future__ import annotations

import json
import os
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

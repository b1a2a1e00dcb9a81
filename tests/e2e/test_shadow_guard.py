"""The refit guard end to end: real Redis, a controller and simulated workers as separate
processes. A first controller publishes a fit; a second one, started with shrinkage
forced beyond any category's data (``KVWISE_SHRINKAGE_SAMPLES``: every category gets the
pooled curve, a fit that ranks blocks worse on this traffic), must not publish its fit:
the shadow replays the same sampled requests through both documents, the candidate
scores lower by more than the margin, and the refusal is logged once with both figures,
counted on /metrics and shown on GET /v1/shadow."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from agent.wire import Keys
from controlplane.traces.synth import synthesize
from controlplane.traces.writer import write_bailian
from tests.e2e.procs import Stack, get
from tests.waiting import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture
def stack(tmp_path: Path, redis_url: str) -> Iterator[Stack]:
    with Stack.running(tmp_path, redis_url, "guard") as s:
        yield s


def _guard_count(url: str, outcome: str) -> float:
    text = httpx.get(url + "/metrics", timeout=5).text
    m = re.search(rf'^kvwise_refit_guard_total{{outcome="{outcome}"}} (\S+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


def _version_in_force(stack: Stack) -> int:
    """The version in force, read from Redis (the controller that published it stopped)."""
    raw = redis.Redis.from_url(stack.redis_url).get(Keys(stack.prefix).policy_current)
    assert raw is not None
    return int(raw)


def test_guard_refuses_a_fit_that_scores_worse_in_the_shadow(stack: Stack, tmp_path: Path) -> None:
    trace = synthesize("to-c", duration_s=600, qps=3, seed=7)
    path = tmp_path / "toc.jsonl"
    write_bailian(trace, path)
    capacity = max(100, trace.n_unique // 10)
    shadow = {"KVWISE_SHADOW_RATE": "0.25", "KVWISE_GUARD_MIN_ACCESSES": "20000"}
    ctl_a, url_a = stack.controller("ctl-a", **shadow)
    for i in range(2):
        stack.worker(f"w{i}", path, capacity)
    # A fit judged on enough of the workers' traffic is in force.
    wait_until(lambda: _guard_count(url_a, "passed") >= 2, timeout=120, what="judged fits")
    ctl_a.stop()
    good = _version_in_force(stack)

    # The second controller's fits pull every category onto the pooled curve (shrinkage
    # beyond any category's data: one curve for all, which ranks blocks as lru does); its
    # first refit comes once the shadow holds enough of the workers' requests to judge it.
    bad_fit = {"KVWISE_SHRINKAGE_SAMPLES": "1e12"}
    ctl_b, url_b = stack.controller("ctl-b", KVWISE_REFIT_INTERVAL_S="15", **bad_fit, **shadow)
    wait_until(lambda: _guard_count(url_b, "refused") >= 2, timeout=120, what="two refused fits")
    assert get(url_b, "/v1/policy")["version"] == good
    verdict = get(url_b, "/v1/shadow")["guard"]
    assert verdict["outcome"] == "refused", verdict
    assert verdict["in_force_version"] == good
    assert verdict["candidate_hit_ratio"] < verdict["in_force_hit_ratio"] - verdict["margin"]
    log = ctl_b.output()
    told = [line for line in log.splitlines() if "refit published nothing: refused" in line]
    assert len(told) == 1, log[-3000:]  # a run of refusals is told once
    figures = re.search(r"hit ratio ([0-9.]+) against ([0-9.]+) of version (\d+)", told[0])
    assert figures is not None, told[0]
    candidate, in_force, version = figures.groups()
    assert float(candidate) < float(in_force) and int(version) == good

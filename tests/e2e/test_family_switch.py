"""The evictor family end to end: real Redis, a controller and simulated workers as
separate processes. An operator pins a baseline through the REST API; the worker that
follows the document switches on hot reload, without a restart (its process and its
cached blocks stay), and says so in its heartbeat, on ``GET /v1/agents`` and on
``/metrics``; the worker configured with ``lru`` (a control) keeps it. Releasing the
pin brings the follower back to ``wa``."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from controlplane.traces.synth import synthesize
from controlplane.traces.writer import write_bailian
from tests.e2e.procs import Stack, get
from tests.waiting import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture
def stack(tmp_path: Path, redis_url: str) -> Iterator[Stack]:
    with Stack.running(tmp_path, redis_url, "family") as s:
        yield s


def _families(url: str) -> dict[str, str]:
    return {a["id"]: a["evictor"] for a in get(url, "/v1/agents")}


def _family_gauge(url: str, agent: str) -> str | None:
    text = httpx.get(url + "/metrics", timeout=5).text
    m = re.search(rf'^kvwise_agent_evictor{{agent="{agent}",family="(\w+)"}} 1\.0$', text, re.M)
    return m.group(1) if m else None


def test_a_pinned_family_reaches_the_following_worker_and_back(
    stack: Stack, tmp_path: Path
) -> None:
    trace = synthesize("to-c", duration_s=300, qps=3, seed=5)
    path = tmp_path / "toc.jsonl"
    write_bailian(trace, path)
    capacity = max(100, trace.n_unique // 10)
    _, url = stack.controller("ctl")
    follower = stack.worker("w-wa", path, capacity, KVWISE_EVICTOR="wa")
    control = stack.worker("w-lru", path, capacity, KVWISE_EVICTOR="lru")
    wait_until(lambda: _families(url) == {"w-wa": "wa", "w-lru": "lru"}, timeout=60)

    pinned = httpx.put(url + "/v1/policy/evictor", json={"family": "s3fifo"}, timeout=10)
    assert pinned.status_code == 200, pinned.text
    assert pinned.json()["evictor"] == "s3fifo"
    wait_until(lambda: _families(url) == {"w-wa": "s3fifo", "w-lru": "lru"}, timeout=60)
    wait_until(lambda: _family_gauge(url, "w-wa") == "s3fifo", timeout=30)
    assert get(url, "/v1/policy/evictor")["pinned"] == "s3fifo"
    assert follower.alive() and control.alive()  # hot reload: no restart

    unknown = httpx.put(url + "/v1/policy/evictor", json={"family": "mru"}, timeout=10)
    assert unknown.status_code == 422
    assert "s3fifo" in unknown.text  # the error lists the known families

    released = httpx.delete(url + "/v1/policy/evictor", timeout=10)
    assert released.json()["evictor"] == "wa"
    wait_until(lambda: _families(url) == {"w-wa": "wa", "w-lru": "lru"}, timeout=60)
    stack.stop_all()
    assert stack.summary(follower)["accesses"] > 0

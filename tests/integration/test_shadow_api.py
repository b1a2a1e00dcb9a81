"""``GET /v1/shadow`` on a real controller (real Redis, real HTTP) after a simulated worker
(``kvwise worker``) replayed a trace: per-policy curves at every capacity multiple, equal,
at a sampling rate of 1, to the offline replay of the same trace; and the same figures on
/metrics, served at once while the shadow is busy."""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from agent.policies import create
from agent.policies.wa import WAPolicy
from agent.policy_document import PolicyDocument
from controlplane.cli import app
from controlplane.replay.engine import replay_hits
from controlplane.traces.reader import load_trace
from controlplane.traces.synth import synthesize
from tests.agent_stream import agent_batches
from tests.integration.controller_fixtures import live_settings, running_controller
from tests.integration.test_worker_cmd import write_trace
from tests.waiting import wait_until

pytestmark = pytest.mark.integration
CAPACITY = 30
BUSY_S = 20.0
"""How long the busy shadow holds its lock: a scrape that waits for it takes this long."""


def test_shadow_answers_with_per_policy_curves_after_a_worker_ran(
    tmp_path: Path, redis_url: str, key_prefix: str
) -> None:
    trace_path = write_trace(tmp_path / "t.jsonl", n=400)
    trace = load_trace(trace_path)
    settings = live_settings(
        redis_url=redis_url,
        key_prefix=key_prefix,
        lease_ttl_s=5,
        shadow_rate=1.0,
        shadow_window_s=86_400,
    )
    with running_controller(settings) as rc:
        env = {"KVWISE_KEY_PREFIX": key_prefix, "KVWISE_BATCH_EVENTS": "100"}
        args = ["worker", "--trace", str(trace_path), "--speed", "50"]
        args += ["--capacity", str(CAPACITY), "--id", "sim-1", "--policy", "lru"]
        args += ["--redis-url", redis_url, "--json"]
        res = CliRunner().invoke(app, args, env=env)
        assert res.exit_code == 0, res.output
        worker = json.loads(res.stdout.strip().splitlines()[-1])

        def replayed_all() -> bool:
            groups = rc.client.get("/v1/shadow").json()["groups"]
            return bool(groups) and groups[0]["requests_seen"] == trace.n_requests

        wait_until(replayed_all, timeout=30, what="the shadow to replay every request")
        body: dict[str, Any] = rc.client.get("/v1/shadow").json()
        metrics = rc.client.get("/metrics").text
        in_force = PolicyDocument.model_validate(rc.client.get("/v1/policy").json())
        spec = rc.client.get("/openapi.json").json()

    assert body["enabled"] is True and body["rate"] == 1.0
    assert body["ladder"] == [0.25, 0.5, 1.0, 2.0, 4.0]
    assert body["policy_version"] == in_force.version
    (group,) = body["groups"]
    assert group["capacity"] == CAPACITY and group["workers"] == ["sim-1"]
    assert group["accesses_seen"] == group["sampled_accesses"] == trace.n_accesses
    assert group["incomplete_runs"] == 0 and group["whole_requests"] is True
    curves = {c["policy"]: c["points"] for c in group["curves"]}
    assert list(curves) == ["wa", "lru", "s3fifo", "arc"]
    for name, points in curves.items():
        assert [p["multiple"] for p in points] == body["ladder"]
        for p in points:
            size = p["capacity"]
            policy = (
                WAPolicy(size, category_names=trace.category_names, doc=in_force)
                if name == "wa"
                else create(name, size)
            )
            want = int(replay_hits(trace, policy, size).sum()) / trace.n_accesses
            assert p["hit_ratio"] == pytest.approx(want, abs=1e-12), (name, size)
            assert p["sampled_hit_ratio"] == pytest.approx(want, abs=1e-12)  # rate 1
            assert p["ci_low"] <= p["hit_ratio"] <= p["ci_high"]
    # The worker ran lru at its capacity: the shadow's lru at 1x is what it saw.
    lru_1x = curves["lru"][2]
    own = worker["hits"] / worker["accesses"]
    assert lru_1x["hit_ratio"] == pytest.approx(own, abs=1e-12)
    # What the worker's events say of its own cache, over all requests and the sample.
    assert group["observed_hit_ratio"] == pytest.approx(own, abs=1e-12)
    assert group["sampled_observed_hit_ratio"] == pytest.approx(own, abs=1e-12)
    sample = re.search(
        rf'^kvwise_shadow_hit_ratio{{capacity="{CAPACITY}",multiple="1",policy="lru"}} (\S+)$',
        metrics,
        re.M,
    )
    assert sample is not None and float(sample.group(1)) == pytest.approx(lru_1x["hit_ratio"])
    schema = spec["paths"]["/v1/shadow"]["get"]["responses"]["200"]["content"]
    assert schema["application/json"]["schema"]["$ref"].endswith("/ShadowView")


def test_a_scrape_does_not_wait_for_the_busy_shadow(redis_url: str, key_prefix: str) -> None:
    """While the shadow holds its lock (as it does warming new miniatures with a window's
    requests: seconds on a busy host), /metrics answers at once with the shadow's gauges
    as last set."""
    trace = synthesize("to-c", duration_s=60, qps=3, seed=7)
    settings = live_settings(redis_url=redis_url, key_prefix=key_prefix, shadow_rate=1.0)
    with running_controller(settings) as rc:
        shadow = rc.controller.shadow
        evaluator = shadow.evaluator
        assert evaluator is not None
        evaluator.set_capacities({"w1": CAPACITY})
        for batch in agent_batches(trace, CAPACITY):
            shadow.apply(batch)
        (group,) = shadow.view().groups  # a read of the view sets the gauges
        want = {c.policy: c.points[2].hit_ratio for c in group.curves}  # at 1x
        busy, release = threading.Event(), threading.Event()

        def hold() -> None:
            with evaluator._lock:
                busy.set()
                release.wait(BUSY_S)

        holder = threading.Thread(target=hold, daemon=True)
        holder.start()
        busy.wait(5)
        try:
            t0 = time.monotonic()
            response = rc.client.get("/metrics", timeout=2 * BUSY_S)
            took = time.monotonic() - t0
        finally:
            release.set()
            holder.join()
    assert response.status_code == 200
    assert took < BUSY_S / 2, f"/metrics took {took:.1f} s behind the busy shadow"
    for policy, ratio in want.items():
        labels = f'capacity="{CAPACITY}",multiple="1",policy="{policy}"'
        sample = re.search(rf"^kvwise_shadow_hit_ratio{{{labels}}} (\S+)$", response.text, re.M)
        assert sample is not None and float(sample.group(1)) == pytest.approx(ratio)

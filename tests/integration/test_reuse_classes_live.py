"""Reuse classes end to end on real Redis: an agent with ``reuse_classes`` (the
simulated worker's requests) feeds a real controller, whose refit publishes a curve of
its own for each category's reuse class (``w/re``) beside the category's."""

from __future__ import annotations

import pytest

from agent.reuse_classes import REUSE_GHOST_CAPACITIES
from agent.runtime.agent import Agent
from agent.settings import AgentSettings
from controlplane.dev.simworker import TraceWorker
from controlplane.service.settings import ControllerSettings
from controlplane.traces.synth import synthesize
from tests.integration.controller_fixtures import running_controller
from tests.waiting import wait_until

pytestmark = pytest.mark.integration


def test_the_controller_fits_each_reuse_class_its_own_curve(
    redis_url: str, key_prefix: str
) -> None:
    trace = synthesize("to-b", duration_s=120, qps=6, seed=3)
    controller = ControllerSettings(
        redis_url=redis_url, key_prefix=key_prefix, refit_interval_s=3600, min_samples=50
    )
    agent_settings = AgentSettings(
        enable=True,
        redis_url=redis_url,
        key_prefix=key_prefix,
        worker_id="classes",
        reuse_classes=True,
        flush_interval_s=0.05,
    )
    with running_controller(controller) as ctl:
        with Agent(agent_settings, capacity=trace.n_unique // 20) as agent:
            TraceWorker(agent, trace, speed=1e6).run()
        sent = agent.events_sent  # closing flushed every event
        assert sent > 0 and agent.events_dropped == 0

        def ingested() -> bool:
            return ctl.controller.ingestor.counters.events >= sent

        wait_until(ingested, timeout=30, what="the controller to ingest the events")
        outcome = ctl.controller.refit(manual=True)
        assert outcome.version is not None, outcome
        doc = ctl.client.get("/v1/policy").json()
        # Its heartbeat (the last, sent at close) says it files by reuse class, with
        # the default ghost, so the shadow's ``wa`` of its group files the same way.
        me = {a["id"]: a for a in ctl.client.get("/v1/agents").json()}["classes"]
    assert me["reuse_classes"] is True
    assert me["reuse_ghost_blocks"] == REUSE_GHOST_CAPACITIES * (trace.n_unique // 20)
    fitted = {n for n, c in doc["categories"].items() if c["source"] == "fit"}
    returns = {n for n in fitted if n.endswith("/re")}
    assert returns and {n.removesuffix("/re") for n in returns} <= set(doc["categories"])
    re, first = doc["categories"]["api_1/re"], doc["categories"]["api_1"]
    assert (re["p_reuse"], re["rate"]) != (first["p_reuse"], first["rate"])

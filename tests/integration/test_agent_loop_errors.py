"""Background loops failing by a bug, seen from the controller: an agent's, by the
heartbeat's ``*_unexpected_errors`` counts in GET /v1/agents and in
``kvwise_agent_loop_unexpected_errors{agent,loop}``, and a heartbeat of an agent that
predates the counts, still listed; the controller's own ingest loop, in the counter
``kvwise_ingest_unexpected_errors_total``; over real HTTP with a real Redis."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import replace

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from agent.runtime.agent import Agent
from agent.wire import Events, Keys
from tests.integration.agent_fixtures import fast_settings
from tests.integration.controller_fixtures import (
    RunningController,
    good_batch,
    live_settings,
    running_controller,
    send,
)
from tests.waiting import wait_until
from tests.wire_samples import agent_status

pytestmark = pytest.mark.integration

LOOPS = ("publisher", "subscriber", "heartbeat")


@pytest.fixture
def ctl(redis_url: str, key_prefix: str) -> Iterator[RunningController]:
    with running_controller(live_settings(redis_url=redis_url, key_prefix=key_prefix)) as rc:
        yield rc


def loop_errors_exported(ctl: RunningController, agent: str) -> dict[str, float]:
    """``kvwise_agent_loop_unexpected_errors`` of ``agent`` in a scrape, by loop."""
    families = text_string_to_metric_families(ctl.client.get("/metrics").text)
    family = next(f for f in families if f.name == "kvwise_agent_loop_unexpected_errors")
    return {s.labels["loop"]: s.value for s in family.samples if s.labels["agent"] == agent}


def ingest_errors_exported(ctl: RunningController) -> float:
    """``kvwise_ingest_unexpected_errors_total`` in a scrape: a counter, one series."""
    families = text_string_to_metric_families(ctl.client.get("/metrics").text)
    family = next(f for f in families if f.name == "kvwise_ingest_unexpected_errors")
    assert family.type == "counter"
    (sample,) = family.samples
    assert sample.name == "kvwise_ingest_unexpected_errors_total"
    return sample.value


def listed(ctl: RunningController) -> dict[str, dict[str, object]]:
    return {a["id"]: a for a in ctl.client.get("/v1/agents").json()}


def test_heartbeat_counts_reach_the_listing_and_the_gauge_and_an_old_one_is_listed(
    ctl: RunningController, redis_url: str
) -> None:
    keys = Keys(ctl.controller.settings.key_prefix)
    r = redis.Redis.from_url(redis_url)
    failing = agent_status(
        id="w-new", publisher_unexpected_errors=12, subscriber_unexpected_errors=3
    )
    r.set(keys.agent("w-new"), failing.to_json(), ex=30)
    old = json.loads(replace(failing, id="w-old").to_json())
    for loop in LOOPS:
        del old[f"{loop}_unexpected_errors"]
    r.set(keys.agent("w-old"), json.dumps(old), ex=30)
    answer = ctl.client.get("/v1/agents")
    assert answer.headers["Kvwise-Heartbeats-Refused"] == "0"
    agents = {a["id"]: a for a in answer.json()}
    assert set(agents) == {"w-new", "w-old"}
    assert [agents["w-new"][f"{loop}_unexpected_errors"] for loop in LOOPS] == [12, 3, 0]
    assert [agents["w-old"][f"{loop}_unexpected_errors"] for loop in LOOPS] == [0, 0, 0]
    assert loop_errors_exported(ctl, "w-new") == {"publisher": 12, "subscriber": 3, "heartbeat": 0}
    assert loop_errors_exported(ctl, "w-old") == dict.fromkeys(LOOPS, 0)


def test_a_live_agents_failing_publisher_is_counted_at_the_controller(
    ctl: RunningController, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A publisher whose every round raises goes on (its thread lives, the heartbeat
    beats) and the controller shows its count rising."""
    settings = fast_settings(redis_url, ctl.controller.settings.key_prefix, worker_id="w-bug")

    def broken_collect() -> list[Events]:
        raise RuntimeError("a bug in the publisher")

    with Agent(settings, capacity=64) as agent:
        monkeypatch.setattr(agent.publisher, "collect", broken_collect)

        def failing_seen() -> dict[str, object] | None:
            shown = listed(ctl).get("w-bug")
            return shown if shown and int(shown["publisher_unexpected_errors"]) >= 3 else None

        shown = wait_until(failing_seen, what="three publisher errors in /v1/agents")
        assert agent.publisher.running
        assert shown["subscriber_unexpected_errors"] == shown["heartbeat_unexpected_errors"] == 0
        exported = loop_errors_exported(ctl, "w-bug")
        assert exported["publisher"] >= shown["publisher_unexpected_errors"]
        assert exported["subscriber"] == exported["heartbeat"] == 0
        monkeypatch.undo()  # the last flush at close works
        # A round failing as the patch went may still count: a good send comes after it.
        agent.free([2, 1], [1, 0], time.time(), "chat")
        wait_until(lambda: agent.events_sent >= 2, what="the publisher sending again")
        seen = agent.publisher.unexpected_errors
        agent.free([4, 3], [1, 0], time.time(), "chat")
        wait_until(lambda: agent.events_sent >= 4, what="the publisher sending on")
        assert agent.publisher.unexpected_errors == seen


def test_an_ingest_pass_failing_by_a_bug_is_counted_in_the_metrics(
    ctl: RunningController, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ingest whose every pass raises goes on (its thread lives) and /metrics shows its
    count rising; fixed, it ingests again and the count stays."""
    ingestor = ctl.controller.ingestor
    wait_until(lambda: ingestor.running, what="the leader ingesting")
    assert ingest_errors_exported(ctl) == 0

    def broken_pass() -> int:
        raise RuntimeError("a bug in ingest")

    monkeypatch.setattr(ingestor, "poll_once", broken_pass)
    wait_until(
        lambda: ingest_errors_exported(ctl) >= 3,
        what="three failed ingest passes in /metrics",
    )
    assert ingestor.running
    monkeypatch.undo()
    keys = Keys(ctl.controller.settings.key_prefix)
    send(redis.Redis.from_url(redis_url), keys, good_batch("w-after", 1))
    wait_until(lambda: ingestor.counters.batches == 1, what="ingest working again")
    failed = ingest_errors_exported(ctl)
    assert failed == ingestor.unexpected_errors >= 3
    send(redis.Redis.from_url(redis_url), keys, good_batch("w-after", 2))
    wait_until(lambda: ingestor.counters.batches == 2, what="a second batch ingested")
    assert ingest_errors_exported(ctl) == failed

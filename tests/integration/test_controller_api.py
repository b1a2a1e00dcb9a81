"""The controller over real HTTP with a real Redis: policy reads, token-guarded mutations,
overrides, rollback, refit from ingested events, dead letters, agents, metrics, OpenAPI."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis

from agent.runtime.agent import Agent
from agent.wire import WIRE_SCHEMA_VERSION, Keys
from tests.conftest import delete_prefix
from tests.integration.agent_fixtures import fast_settings
from tests.integration.controller_fixtures import (
    AUTH,
    TOKEN,
    RunningController,
    live_settings,
    reuse_batch,
    running_controller,
    send,
)
from tests.waiting import wait_until
from tests.wire_samples import agent_status

pytestmark = pytest.mark.integration


@pytest.fixture
def ctl(redis_url: str, key_prefix: str) -> Iterator[RunningController]:
    settings = live_settings(
        redis_url=redis_url,
        key_prefix=key_prefix,
        api_token=TOKEN,
        min_samples=100,
        lease_ttl_s=5,
    )
    with running_controller(settings) as rc:
        yield rc


def test_health_readiness_and_initial_policy(ctl: RunningController) -> None:
    c = ctl.client
    assert c.get("/healthz").json()["status"] == "ok"
    assert c.get("/readyz").status_code == 200
    doc = c.get("/v1/policy").json()
    assert doc["version"] == 1
    assert doc["categories"] == {}
    assert [v["version"] for v in c.get("/v1/policy/versions").json()] == [1]
    assert c.get("/v1/policy/versions/1").json()["version"] == 1
    missing = c.get("/v1/policy/versions/99")
    assert missing.status_code == 404
    assert missing.json()["error"] == "unknown_version"


def test_a_version_not_kept_is_said_alike_by_reading_it_and_rolling_back_to_it(
    ctl: RunningController,
) -> None:
    """GET /v1/policy/versions/N said "version N is not kept" without the hint that
    POST /v1/policy/rollback gives for the same N: both now say the same thing."""
    read = ctl.client.get("/v1/policy/versions/99")
    rolled = ctl.client.post("/v1/policy/rollback", json={"version": 99}, headers=AUTH)
    assert (
        read.json()
        == rolled.json()
        == {
            "error": "unknown_version",
            "reason": "version 99 is not kept (see GET /v1/policy/versions)",
        }
    )
    assert (read.status_code, rolled.status_code) == (404, 404)


def test_a_change_while_redis_has_lost_the_policy_waits_for_the_restore(
    ctl: RunningController, redis_url: str, key_prefix: str
) -> None:
    """Redis restarted empty: an override put while the leader waits for the heartbeats
    would publish over the state it restores (numbered from nothing, without the pin
    before it). It is refused (503) until the restore is in, which keeps the pin."""
    c, memory = ctl.client, ctl.controller.memory
    pinned = c.put("/v1/policy/overrides/t", json={"rate": 0.5}, headers=AUTH)
    assert pinned.json()["version"] == 2
    memory.restore_wait_s = 60  # the leader waits: the workers' heartbeats come back
    delete_prefix(redis_url, key_prefix)  # Redis restarted empty
    refused = c.put("/v1/policy/overrides/u", json={"rate": 0.7}, headers=AUTH)
    assert (refused.status_code, refused.json()["error"]) == (503, "policy_restoring")
    memory.restore_wait_s = 0
    wait_until(lambda: c.get("/v1/policy").status_code == 200, what="the restore")
    restored = c.get("/v1/policy").json()
    assert restored["version"] == 3 and restored["categories"]["t"]["rate"] == 0.5
    assert c.get("/v1/policy/overrides").json() == {"t": {"rate": 0.5}}


def test_mutations_need_the_token(ctl: RunningController) -> None:
    c = ctl.client
    for method, path, body in [
        ("PUT", "/v1/policy/overrides/text_1", {"life_s": 9}),
        ("DELETE", "/v1/policy/overrides/text_1", None),
        ("POST", "/v1/policy/rollback", {"version": 1}),
        ("POST", "/v1/policy/refit", None),
    ]:
        r = c.request(method, path, json=body)
        assert r.status_code == 401, (method, path)
        assert r.json() == {"error": "unauthorized", "reason": "missing bearer token"}
        assert r.headers["WWW-Authenticate"] == 'Bearer realm="kvwise"'
        r = c.request(method, path, json=body, headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401
        assert r.json() == {"error": "unauthorized", "reason": "wrong bearer token"}
        assert r.headers["WWW-Authenticate"] == 'Bearer realm="kvwise", error="invalid_token"'
    assert c.get("/v1/policy").json()["version"] == 1


def test_override_rollback_and_errors(ctl: RunningController) -> None:
    c = ctl.client
    r = c.put("/v1/policy/overrides/text_1", json={"life_s": 42, "p_reuse": 0.7}, headers=AUTH)
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["version"] == 2
    assert doc["categories"]["text_1"]["life_s"] == 42
    assert doc["categories"]["text_1"]["source"] == "override"
    assert c.get("/v1/policy/overrides").json() == {"text_1": {"life_s": 42, "p_reuse": 0.7}}
    bad = c.put("/v1/policy/overrides/text_1", json={"rate": -3}, headers=AUTH)
    assert bad.status_code == 422
    assert "rate" in bad.json()["reason"]
    empty = c.put("/v1/policy/overrides/text_1", json={}, headers=AUTH)
    assert empty.status_code == 422
    r = c.post("/v1/policy/rollback", json={"version": 1}, headers=AUTH)
    assert r.status_code == 200
    assert r.json()["version"] == 3
    assert r.json()["categories"] == {}
    assert c.post("/v1/policy/rollback", json={"version": 77}, headers=AUTH).status_code == 404


def test_releasing_what_is_not_pinned_answers_as_releasing_the_evictor_pin(
    ctl: RunningController,
) -> None:
    """Releasing an override never pinned was a 404 while releasing no evictor pin was a
    200: both answer 200 with the document in force, ``Kvwise-Published: false``, so an
    operator's script may release what it pinned without reading first."""
    c = ctl.client
    c.put("/v1/policy/overrides/kept", json={"rate": 0.5}, headers=AUTH)  # v2
    for path in (
        "/v1/policy/overrides/nope",
        "/v1/policy/overrides?category=..",
        "/v1/policy/evictor",
    ):
        released = c.delete(path, headers=AUTH)
        assert released.status_code == 200, (path, released.text)
        assert (released.json()["version"], released.headers["Kvwise-Published"]) == (2, "false")
    assert c.get("/v1/policy/overrides").json() == {"kept": {"rate": 0.5}}
    assert [v["version"] for v in c.get("/v1/policy/versions").json()] == [2, 1]


def test_the_override_in_force_put_again_publishes_nothing(ctl: RunningController) -> None:
    """Three identical PUTs published v2, v3 and v4, reloading every worker each time,
    whereas pinning the evictor family pinned already publishes nothing."""
    c = ctl.client
    answers = [
        c.put("/v1/policy/overrides/text_1", json={"rate": 0.5, "life_s": 9}, headers=AUTH)
        for _ in range(3)
    ]
    assert [a.status_code for a in answers] == [200, 200, 200]
    assert [a.json()["version"] for a in answers] == [2, 2, 2]
    assert [a.headers["Kvwise-Published"] for a in answers] == ["true", "false", "false"]
    part = c.put("/v1/policy/overrides/text_1", json={"rate": 0.5}, headers=AUTH)  # merged: same
    assert (part.json()["version"], part.headers["Kvwise-Published"]) == (2, "false")
    assert [v["version"] for v in c.get("/v1/policy/versions").json()] == [2, 1]
    changed = c.put("/v1/policy/overrides/text_1", json={"rate": 0.6}, headers=AUTH)
    assert (changed.json()["version"], changed.headers["Kvwise-Published"]) == (3, "true")


def test_every_change_says_whether_it_published(ctl: RunningController) -> None:
    """Pinning or releasing the evictor family, releasing an override and rolling back
    answer ``Kvwise-Published`` as an override's PUT does: a script tells a change that
    was in force already from one that published without comparing versions."""
    c = ctl.client

    def published(answer: httpx.Response) -> tuple[int, str]:
        assert answer.status_code == 200, answer.text
        return answer.json()["version"], answer.headers["Kvwise-Published"]

    assert published(c.put("/v1/policy/evictor", json={"family": "s3fifo"}, headers=AUTH)) == (
        2,
        "true",
    )
    assert published(c.put("/v1/policy/evictor", json={"family": "s3fifo"}, headers=AUTH)) == (
        2,
        "false",
    )
    assert published(c.delete("/v1/policy/evictor", headers=AUTH)) == (3, "true")
    assert published(c.delete("/v1/policy/evictor", headers=AUTH)) == (3, "false")
    assert published(c.put("/v1/policy/overrides/t", json={"rate": 0.5}, headers=AUTH)) == (
        4,
        "true",
    )
    assert published(c.delete("/v1/policy/overrides/t", headers=AUTH)) == (5, "true")
    assert published(c.post("/v1/policy/rollback", json={"version": 4}, headers=AUTH)) == (
        6,
        "true",
    )


def test_refit_from_ingested_events(ctl: RunningController, redis_url: str) -> None:
    c = ctl.client
    keys = Keys(ctl.controller.settings.key_prefix)
    r = redis.Redis.from_url(redis_url)
    # Too little data: the guard refuses, and says why.
    out = c.post("/v1/policy/refit", headers=AUTH).json()
    assert out["published"] is False
    assert "min_samples" in out["reason"]
    now = time.time() - 60
    for seq in (1, 2, 3):
        send(
            r,
            keys,
            reuse_batch(
                "w1", seq, category="text_1", n=3000, rate=0.5, p=0.6, t0=now + seq * 5, seed=seq
            ),
        )
    wait_until(lambda: ctl.controller.ingestor.counters.batches >= 3)
    out = c.post("/v1/policy/refit", headers=AUTH).json()
    assert out["published"] is True, out
    doc = c.get("/v1/policy").json()
    assert doc["version"] == out["version"]
    text1 = doc["categories"]["text_1"]
    assert text1["source"] in ("fit", "pooled")
    assert text1["samples"] > 0
    cats = {x["name"]: x for x in c.get("/v1/categories").json()}
    assert cats["text_1"]["published_version"] == doc["version"]
    detail = c.get("/v1/categories/text_1").json()
    assert detail["cdf"] is not None
    assert c.get("/v1/categories/nope").status_code == 404
    # Pinned before any access of it: the pooled fit's parameters, none of its samples
    # (they read as the busiest category's, on the dashboard and in the metrics).
    assert c.put("/v1/policy/overrides/chat", json={"rate": 0.5}, headers=AUTH).is_success
    chat = c.get("/v1/categories/chat").json()["published"]
    assert (chat["source"], chat["rate"], chat["samples"]) == ("override", 0.5, 0)
    assert chat["fit_quality"] is None
    assert 'kvwise_category_samples{category="chat"} 0.0' in c.get("/metrics").text
    assert ctl.controller.ingestor.counters.gaps.get("w1") == 0
    # A gap: batch 5 arrives without batch 4.
    send(
        r, keys, reuse_batch("w1", 5, category="text_1", n=10, rate=0.5, p=0.5, t0=now + 30, seed=9)
    )
    wait_until(lambda: ctl.controller.ingestor.counters.gaps.get("w1") == 1)


def test_a_scheduled_refit_with_no_new_access_publishes_nothing(
    ctl: RunningController, redis_url: str
) -> None:
    """With no traffic only the censored ages grow: a scheduled refit then publishes no
    version (every worker would reload for nothing); a manual one still fits, and new
    accesses make the next scheduled one fit again."""
    controller = ctl.controller
    keys = Keys(controller.settings.key_prefix)
    r = redis.Redis.from_url(redis_url)
    now = time.time() - 60
    batch = reuse_batch("w1", 1, category="text_1", n=3000, rate=0.5, p=0.6, t0=now, seed=1)
    send(r, keys, batch)
    wait_until(lambda: controller.ingestor.counters.batches >= 1)
    # The window's categories are counted from the first batch on, not at a checkpoint.
    assert controller.metrics.registry.get_sample_value("kvwise_window_categories") == 1
    assert controller.refit(manual=False).published
    current = controller.store.current()
    assert current is not None and "(1 new category" in current.note, current.note
    quiet = controller.refit(manual=False)
    assert not quiet.published
    # ... and says what the refit that last ran said: here, it published.
    said = "unchanged: no new accesses since the last refit (published version "
    assert quiet.reason.startswith(said), quiet.reason
    fitted = ("published", "unchanged: largest relative change")
    assert controller.refit(manual=True).reason.startswith(fitted)
    batch = reuse_batch("w1", 2, category="text_1", n=3000, rate=0.5, p=0.6, t0=now + 5, seed=2)
    send(r, keys, batch)
    wait_until(lambda: controller.ingestor.counters.batches >= 2)
    assert controller.refit(manual=False).reason.startswith(fitted)


def _published_over(ctl: RunningController, redis_url: str) -> int:
    """Refit ``ctl`` from one batch of ``text_1`` and damage the version it published."""
    controller, r = ctl.controller, redis.Redis.from_url(redis_url)
    keys = Keys(controller.settings.key_prefix)
    now = time.time() - 60
    send(r, keys, reuse_batch("w1", 1, category="text_1", n=3000, rate=0.5, p=0.6, t0=now, seed=1))
    wait_until(lambda: controller.ingestor.counters.batches >= 1)
    first = ctl.client.post("/v1/policy/refit", headers=AUTH).json()
    assert first["published"] is True, first
    r.set(keys.policy_doc(first["version"]), b"{damaged")
    return int(first["version"])


def test_a_refit_publishes_over_a_refused_document_in_force(
    ctl: RunningController, redis_url: str
) -> None:
    """A refit whose parameters had not changed published nothing even while the document
    in force was refused (damaged: agents refuse it and keep their last for good); the
    next refit now republishes."""
    controller, c = ctl.controller, ctl.client
    version = _published_over(ctl, redis_url)
    assert c.get("/v1/policy").status_code == 503
    refused = ("kvwise_policy_state_refused_total", {"part": "document"})
    assert controller.metrics.registry.get_sample_value(*refused) == 1
    again = c.post("/v1/policy/refit", headers=AUTH).json()
    assert again["published"] is True and again["version"] == version + 1, again
    assert c.get("/v1/policy").json()["version"] == again["version"]


def test_a_refused_document_in_force_is_named_so_and_leaves_the_controller_ready(
    ctl: RunningController, redis_url: str
) -> None:
    """GET /v1/policy answered a refused document in force as "not stored" (the key is
    there): it says it is refused and why; the controller stays ready (it can publish
    over it, and out of its Service it would cut operators off the API that does)."""
    version = _published_over(ctl, redis_url)
    answer = ctl.client.get("/v1/policy")
    assert answer.status_code == 503 and answer.json()["error"] == "policy_refused"
    reason = answer.json()["reason"]
    assert reason.startswith(f"stored version {version} refused: policy: document:"), reason
    assert reason.endswith("; the next publication replaces it")
    one = ctl.client.get(f"/v1/policy/versions/{version}")
    assert one.status_code == 404
    assert one.json()["reason"].startswith(f"stored version {version} refused: policy:")
    rolled = ctl.client.post("/v1/policy/rollback", json={"version": version}, headers=AUTH)
    assert (rolled.status_code, rolled.json()) == (404, one.json())
    assert ctl.client.get("/readyz").status_code == 200


def test_a_held_rollback_is_released_by_a_manual_refit_which_says_so(
    ctl: RunningController, redis_url: str
) -> None:
    controller = ctl.controller
    keys = Keys(controller.settings.key_prefix)
    now = time.time() - 60
    batch = reuse_batch("w1", 1, category="text_1", n=3000, rate=0.5, p=0.6, t0=now, seed=1)
    r = redis.Redis.from_url(redis_url)
    send(r, keys, batch)
    wait_until(lambda: controller.ingestor.counters.batches >= 1)
    assert controller.refit(manual=False).published
    controller.store.rollback(1, hold=True)
    batch = reuse_batch("w1", 2, category="text_1", n=3000, rate=0.5, p=0.6, t0=now + 5, seed=2)
    send(r, keys, batch)
    wait_until(lambda: controller.ingestor.counters.batches >= 2)
    held = controller.refit(manual=False)
    assert not held.published and held.reason.startswith("held: after a rollback")
    status = ctl.client.get("/v1/policy/refit").json()
    assert status["held"] is True and status["last"]["reason"] == held.reason
    released = controller.refit(manual=True)
    assert released.reason.endswith("; the rollback hold is released")
    assert not controller.store.held()
    status = ctl.client.get("/v1/policy/refit").json()
    assert status["held"] is False and status["last"]["reason"] == released.reason
    assert not controller.refit(manual=True).reason.endswith("hold is released")


def test_a_category_fitted_but_not_published_names_no_published_version(
    ctl: RunningController, redis_url: str
) -> None:
    """A category the fit has and the document in force lacks (refits held after a
    rollback to the built-in version) has no published values and so no version they come
    from: it was given the version in force, which the dashboard showed beside *fitted, not
    published*."""
    controller = ctl.controller
    keys = Keys(controller.settings.key_prefix)
    batch = reuse_batch(
        "w1", 1, category="text_1", n=3000, rate=0.5, p=0.6, t0=time.time() - 60, seed=1
    )
    send(redis.Redis.from_url(redis_url), keys, batch)
    wait_until(lambda: controller.ingestor.counters.batches >= 1)
    fitted = controller.refit(manual=False)
    assert fitted.published
    (summary,) = ctl.client.get("/v1/categories").json()
    assert summary["published_version"] == fitted.version
    controller.store.rollback(1, hold=True)
    assert not controller.refit(manual=False).published
    (summary,) = ctl.client.get("/v1/categories").json()
    detail = ctl.client.get("/v1/categories/text_1").json()
    for answer in (summary, detail):
        assert answer["fitted"] is not None and answer["published"] is None
        assert answer["published_version"] is None


def test_a_refit_that_failed_is_tried_again_with_no_new_access(
    ctl: RunningController, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refit cut short (Redis gone while it read the base document) has published
    nothing: the next scheduled one fits the same accesses again, not "unchanged"."""
    controller = ctl.controller
    keys = Keys(controller.settings.key_prefix)
    now = time.time() - 60
    batch = reuse_batch("w1", 1, category="text_1", n=3000, rate=0.5, p=0.6, t0=now, seed=1)
    send(redis.Redis.from_url(redis_url), keys, batch)
    wait_until(lambda: controller.ingestor.counters.batches >= 1)

    def outage() -> None:
        raise redis.ConnectionError("Redis went away while the refit read the base")

    with monkeypatch.context() as patch:
        patch.setattr(controller.store, "base", outage)
        with pytest.raises(redis.ConnectionError):
            controller.refit(manual=False)
    assert controller.refit(manual=False).published


def test_a_refit_with_the_shadow_off_is_counted_as_off(redis_url: str, key_prefix: str) -> None:
    settings = live_settings(
        redis_url=redis_url, key_prefix=key_prefix, min_samples=100, shadow_enabled=False
    )
    with running_controller(settings) as rc:
        keys = Keys(key_prefix)
        r = redis.Redis.from_url(redis_url)
        now = time.time() - 60
        send(
            r,
            keys,
            reuse_batch("w1", 1, category="text_1", n=3000, rate=0.5, p=0.6, t0=now, seed=1),
        )
        wait_until(lambda: rc.controller.ingestor.counters.batches >= 1)
        assert rc.controller.refit(manual=True).published
        count = rc.controller.metrics.registry.get_sample_value
        assert count("kvwise_refit_guard_total", {"outcome": "off"}) == 1
        assert count("kvwise_refit_guard_total", {"outcome": "passed"}) == 0


def test_each_replica_says_its_role_once(
    redis_url: str, key_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The leader says it leads; a standby says it is one (and that it serves reads)."""
    caplog.set_level(logging.INFO, logger="controlplane.service.controller")
    settings = live_settings(redis_url=redis_url, key_prefix=key_prefix, lease_ttl_s=5)
    with running_controller(settings.model_copy(update={"consumer_name": "ctl-a"})) as a:
        wait_until(lambda: a.controller.lease.is_leader, what="a leader")
        with running_controller(settings.model_copy(update={"consumer_name": "ctl-b"})) as b:

            def standby_said() -> bool:
                return any("is a standby" in r.getMessage() for r in caplog.records)

            wait_until(standby_said, what="the standby")
            assert any("ctl-a" in r.getMessage() for r in caplog.records if "standby" in r.msg)
            assert not b.controller.lease.is_leader
            time.sleep(1.5)  # more lease ticks: said once
            messages = [r.getMessage() for r in caplog.records]
            assert sum("is a standby" in m for m in messages) == 1
            assert sum("is the leader" in m for m in messages) == 1


def test_a_replica_that_cannot_reach_redis_does_not_call_itself_a_standby(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No answer from Redis says nothing of who leads: the role is said once one comes."""
    from controlplane.service.controller import Controller
    from controlplane.service.settings import ControllerSettings

    caplog.set_level(logging.INFO, logger="controlplane.service.controller")
    unreachable = ControllerSettings(redis_url="redis://127.0.0.1:1/0", consumer_name="ctl-x")
    controller = Controller(unreachable)
    controller._tick_lease()
    assert not controller.lease.is_leader
    assert not any("is a standby" in r.getMessage() for r in caplog.records)


def test_malformed_batch_goes_to_dead_letter_and_ingest_continues(
    ctl: RunningController, redis_url: str
) -> None:
    keys = Keys(ctl.controller.settings.key_prefix)
    r = redis.Redis.from_url(redis_url)
    r.xadd(
        keys.events_stream("w9"),
        {
            "v": str(WIRE_SCHEMA_VERSION),
            "w": "w9",
            "e": "x",
            "s": "1",
            "c": "[]",
            "n": "3",
            "d": b"short",
        },
    )
    send(
        r,
        keys,
        reuse_batch("w9", 2, category="file_1", n=50, rate=1.0, p=0.2, t0=time.time(), seed=4),
    )
    wait_until(lambda: ctl.controller.ingestor.counters.batches >= 1)
    wait_until(lambda: r.xlen(keys.dead_letter) == 1)
    ((_entry_id, fields),) = r.xrange(keys.dead_letter)
    assert fields[b"reason"].startswith(b"d: ")
    assert fields[b"stream"] == keys.events_stream("w9").encode()
    assert ctl.controller.ingestor.counters.dead_letters == 1
    # Nothing is left pending: both entries were acknowledged.
    wait_until(lambda: ctl.controller.ingestor.pending() == 0)


def test_agents_metrics_and_openapi(ctl: RunningController, redis_url: str) -> None:
    c = ctl.client
    keys = Keys(ctl.controller.settings.key_prefix)
    r = redis.Redis.from_url(redis_url)
    status = agent_status(engine="sim", started_at=time.time(), updated_at=time.time())
    r.set(keys.agent("w1"), status.to_json(), ex=30)
    r.set(keys.agent("broken"), "{not json", ex=30)
    answer = c.get("/v1/agents")
    agents = answer.json()
    assert [a["id"] for a in agents] == ["w1"]
    assert answer.headers["Kvwise-Agents-Not-Listed"] == "0"
    assert answer.headers["Kvwise-Heartbeats-Refused"] == "1"  # the broken one
    assert agents[0]["applied_version"] == 1
    assert agents[0]["events_dropped"] == 2
    text = c.get("/metrics").text
    assert "kvwise_policy_version 1.0" in text
    assert 'kvwise_agent_applied_version{agent="w1"} 1.0' in text
    assert 'kvwise_agent_staged_version{agent="w1"} 1.0' in text
    assert "kvwise_leader 1.0" in text
    assert "kvwise_agent_heartbeats_refused 1.0" in text
    spec = c.get("/openapi.json").json()
    for path in [
        "/v1/policy",
        "/v1/policy/versions",
        "/v1/policy/versions/{version}",
        "/v1/policy/refit",
        "/v1/policy/rollback",
        "/v1/policy/overrides/{category}",
        "/v1/categories",
        "/v1/categories/{name}",
        "/v1/category",
        "/v1/agents",
        "/healthz",
        "/readyz",
        "/metrics",
    ]:
        assert path in spec["paths"], path
    assert c.get("/docs").status_code == 200
    json.dumps(spec)
    agent_fields = spec["components"]["schemas"]["AgentView"]["properties"]
    undescribed = [name for name, prop in agent_fields.items() if not prop.get("description")]
    assert len(agent_fields) > 30 and undescribed == []  # the heartbeat's and ingest's
    assert agent_fields["capacity"]["description"] == "Blocks the engine's cache holds."
    # The headers the docs make part of the answer are in the description too.
    agents_headers = spec["paths"]["/v1/agents"]["get"]["responses"]["200"]["headers"]
    assert set(agents_headers) == {
        "Kvwise-Agents-Not-Listed",
        "Kvwise-Heartbeats-Refused",
        "Kvwise-Ledgers-Refused",
    }
    changes = [
        ("/v1/policy/overrides/{category}", "put"),
        ("/v1/policy/overrides/{category}", "delete"),
        ("/v1/policy/overrides", "put"),
        ("/v1/policy/overrides", "delete"),
        ("/v1/policy/evictor", "put"),
        ("/v1/policy/evictor", "delete"),
        ("/v1/policy/rollback", "post"),
    ]
    for path, method in changes:
        success = spec["paths"][path][method]["responses"]["200"]
        assert set(success["headers"]) == {"Kvwise-Published"}, (path, method)
        assert success["content"]["application/json"]["schema"] == {
            "$ref": "#/components/schemas/PolicyDocument"
        }


def test_a_heartbeat_integer_past_64_bits_is_refused_and_metrics_still_answer(
    ctl: RunningController, redis_url: str
) -> None:
    """Heartbeat integers were taken at any size: a count of 10**400 failed the gauge it
    was set on (OverflowError), so /metrics answered 500 while that heartbeat lived. Such
    a heartbeat is refused and counted as other unreadable ones; the rest are listed."""
    keys = Keys(ctl.controller.settings.key_prefix)
    r = redis.Redis.from_url(redis_url)
    r.set(keys.agent("w1"), agent_status(id="w1").to_json(), ex=30)
    for field in ("events_dropped", "applied_version", "heartbeat_unexpected_errors"):
        huge = {**json.loads(agent_status(id=field).to_json()), field: 10**400}
        r.set(keys.agent(field), json.dumps(huge), ex=30)
    scrape = ctl.client.get("/metrics")
    assert scrape.status_code == 200
    assert "kvwise_agent_heartbeats_refused 3.0" in scrape.text
    assert 'kvwise_agent_applied_version{agent="w1"} 1.0' in scrape.text
    answer = ctl.client.get("/v1/agents")
    assert [a["id"] for a in answer.json()] == ["w1"]
    assert answer.headers["Kvwise-Heartbeats-Refused"] == "3"


def test_a_live_agents_engine_time_is_served_in_agents_and_metrics(
    ctl: RunningController, redis_url: str
) -> None:
    """The engine-thread time an agent's hooks took (a timed sample) reaches the
    controller in the heartbeat: per worker in /v1/agents and /metrics."""
    settings = fast_settings(redis_url, ctl.controller.settings.key_prefix, worker_id="w-cost")
    with Agent(settings, capacity=64) as agent:
        for r in range(2000):
            blocks = list(range(8 * r, 8 * r + 8))
            agent.free(blocks[::-1], range(7, -1, -1), time.time(), "chat")
            agent.evict(max(len(agent.policy) - agent.capacity, 0), time.time())

        def served() -> dict[str, Any] | None:
            shown = [a for a in ctl.client.get("/v1/agents").json() if a["id"] == "w-cost"]
            return shown[0] if shown and shown[0]["engine_calls"] == 4000 else None

        shown = wait_until(served, what="the agent's engine time in /v1/agents")
    assert 0 < shown["engine_sampled_calls"] < 4000
    assert 0 < shown["engine_seconds_per_block"] < shown["engine_seconds_per_call"] < 1e-3
    assert shown["engine_seconds"] > 0
    text = ctl.client.get("/metrics").text
    for name in ("seconds", "seconds_per_call", "seconds_per_block"):
        line = next(
            (
                x
                for x in text.splitlines()
                if x.startswith(f'kvwise_agent_engine_{name}{{agent="w-cost"}}')
            ),
            "",
        )
        assert line and float(line.split()[-1]) == pytest.approx(shown[f"engine_{name}"]), name


def test_a_refit_posted_to_a_standby_names_the_leader_to_post_it_to(
    redis_url: str, key_prefix: str
) -> None:
    """What deploy.md tells an operator releasing a rollback's hold: a standby answers 409
    ``not_leader`` naming the leader's pod and process; the leader's /healthz says so."""
    settings = live_settings(
        redis_url=redis_url, key_prefix=key_prefix, lease_ttl_s=5, api_token=TOKEN
    )
    with running_controller(settings.model_copy(update={"consumer_name": "ctl-a"})) as a:
        wait_until(lambda: a.controller.lease.is_leader, what="a leader")
        with running_controller(settings.model_copy(update={"consumer_name": "ctl-b"})) as b:
            refused = b.client.post("/v1/policy/refit", headers=AUTH)
            assert refused.status_code == 409
            body = refused.json()
            assert body["error"] == "not_leader"
            assert (
                body["reason"]
                == f"this replica does not refit; leader: {a.controller.lease.holder}"
            )
            assert a.controller.lease.holder.startswith("ctl-a/")
            assert (
                a.client.get("/healthz").json()["leader"],
                b.client.get("/healthz").json()["leader"],
            ) == (True, False)
            assert a.client.post("/v1/policy/refit", headers=AUTH).status_code == 200

"""A Redis restarted empty under a running controller (its own redis-server, stopped and
started again on the same port): what the leader restores, under which number, and what
a worker that held a version then does. Each test failed before its fix."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import redis

from agent.policy_document import PolicyDocument
from agent.runtime.agent import Agent
from agent.wire import Keys
from controlplane.dev.embedded_redis import EmbeddedRedis
from controlplane.service.controller import Controller
from controlplane.service.store import PolicyStore
from tests.integration.agent_fixtures import fast_settings
from tests.integration.controller_fixtures import live_settings, running_controller
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

LEASE_TTL_S = 9.0
"""A lease tick (which reads the store's state) every 3 s: a change made just after one is
not read before the restart that follows it at once."""


def _restart_empty(server: EmbeddedRedis) -> None:
    server.stop()
    server.start()  # no persistence: it comes back empty


def _just_read(c: Controller) -> None:
    """Wait for a lease tick's read of version 1 (the next one is ``LEASE_TTL_S`` / 3 away)."""
    wait_until(lambda: c.store_state is not None, what="the state read")


def _applies(agent: Agent, version: int) -> bool:
    """Take what the agent staged (the engine's part), then whether ``version`` is in force."""
    agent.apply_pending()
    return agent.applied_version == version


def _restored(client: httpx.Client) -> PolicyDocument:
    def current() -> PolicyDocument | None:
        answer = client.get("/v1/policy")
        return PolicyDocument.model_validate(answer.json()) if answer.status_code == 200 else None

    return wait_until(current, timeout=20, what="a version in force again")


def test_what_this_replica_published_just_before_the_restart_is_restored(
    tmp_path: Path, key_prefix: str
) -> None:
    """Its last-read state was the lease tick's: an evictor pin (v2) and an override (v3)
    made just before Redis restarted empty came back as "v2's fit, 0 overrides" under v3
    again (a number agents had applied with the override), or as v2 (backwards)."""
    with EmbeddedRedis(tmp_path) as server:
        settings = live_settings(
            redis_url=server.url, key_prefix=key_prefix, lease_ttl_s=LEASE_TTL_S, restore_wait_s=0
        )
        with running_controller(settings) as rc:
            _just_read(rc.controller)
            pinned = rc.client.put("/v1/policy/evictor", json={"family": "lru"}).json()
            assert pinned["version"] == 2
            pinned = rc.client.put("/v1/policy/overrides/text_1", json={"rate": 0.5}).json()
            assert pinned["version"] == 3
            _restart_empty(server)
            restored = _restored(rc.client)
            assert restored.version == 4
            assert restored.note.startswith("restored after Redis lost its state: v3's fit")
            assert restored.evictor == "lru"
            assert restored.categories["text_1"].rate == 0.5
            assert rc.client.get("/v1/policy/overrides").json() == {"text_1": {"rate": 0.5}}


def test_a_restored_version_is_numbered_after_the_one_a_worker_holds(
    tmp_path: Path, key_prefix: str
) -> None:
    """A version published through another replica after this leader's last read, and
    applied by a worker, got its number reused by the restore for another document: the
    worker kept its own under that number and reported itself in sync."""
    with EmbeddedRedis(tmp_path) as server:
        settings = live_settings(
            redis_url=server.url, key_prefix=key_prefix, lease_ttl_s=LEASE_TTL_S, restore_wait_s=1
        )
        with (
            running_controller(settings) as rc,
            Agent(fast_settings(server.url, key_prefix), capacity=100) as agent,
        ):
            _just_read(rc.controller)
            other_replica = PolicyStore(redis.Redis.from_url(server.url), Keys(key_prefix))
            held = other_replica.set_override("text_1", {"rate": 0.5}).document
            wait_until(lambda: _applies(agent, held.version), what="the other replica's version")
            _restart_empty(server)
            restored = _restored(rc.client)
            assert restored.version > held.version
            wait_until(lambda: _applies(agent, restored.version), what="the restored version")
            assert agent.document == restored

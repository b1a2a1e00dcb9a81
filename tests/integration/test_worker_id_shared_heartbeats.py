"""Two agents given one worker id, one of them idle (no traffic, so no events): ingest's
ledger sees one epoch and flags nothing, while both overwrite the id's heartbeat, so
``GET /v1/agents`` showed either one's figures in turn and nothing said so.

Real agents beat into a real Redis every 0.1 s, half a beat apart; a real controller reads
them with its shadow job (called here, read after read). The watch's clock moves 7 s per
read, as far apart as the job's reads are on average and more, so that the 30 s a start
must beat on after another's first sighting pass in a moment. The first test failed before
the fix (nothing read the starts); the second holds it to a restart being no conflict."""

from __future__ import annotations

import logging
import time

import pytest
import redis

from agent.runtime.agent import Agent
from agent.wire import AgentStatus, Keys
from controlplane.service.agents import AgentReader, AgentView
from controlplane.service.controller import SHADOW_JITTER_S, SHADOW_REFRESH_S, Controller
from controlplane.service.heartbeat_watch import HOLD_S, HeartbeatWatch
from tests.integration.agent_fixtures import fast_settings
from tests.integration.controller_fixtures import controller
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

WORKER = "w1"
"""The worker id both agents are given (``fast_settings``')."""
READ_S = 7.0
"""How far apart the watch takes two reads."""
SHARED_LOG = "agents write heartbeats under it"


class ReadClock:
    """The watch's clock: ``READ_S`` further at each read."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += READ_S
        return self.now


def watched(c: Controller) -> None:
    """``c``'s heartbeat watch on a ``ReadClock``."""
    c.heartbeat_conflicts.watch = HeartbeatWatch(ReadClock())


def view(r: redis.Redis, keys: Keys) -> AgentView:
    """``GET /v1/agents``'s view of ``WORKER``, as any replica reads it."""
    (agent,) = AgentReader(r, keys, max_agents=10).read().agents
    return agent


def read_once(c: Controller) -> int:
    """One run of the shadow job; the heartbeat flag of ``WORKER`` it left (0: none)."""
    c._refresh_shadow()
    return c.heartbeat_conflicts.flagged.get(WORKER, 0)


def serve(agent: Agent, requests: int) -> None:
    """``requests`` distinct requests of 20 blocks each, through ``agent``."""
    for i in range(requests):
        blocks = list(range(i * 20 + 19, i * 20 - 1, -1))
        agent.free(blocks, range(19, -1, -1), time.time(), "text_1")
        agent.evict(len(agent.policy) - agent.capacity, time.time())


def beating(r: redis.Redis, keys: Keys, agent: Agent) -> None:
    """Wait until ``agent``'s beat is the one under ``WORKER``'s key."""

    def shown() -> bool:
        raw = r.get(keys.agent(WORKER))
        return raw is not None and AgentStatus.from_json(raw).started_at == agent.started_at

    wait_until(shown, what="the agent's beat under the key")


def test_an_idle_agent_beside_a_serving_one_under_its_id_is_flagged(
    redis_url: str, key_prefix: str, r: redis.Redis, keys: Keys, caplog: pytest.LogCaptureFixture
) -> None:
    """Flagged 2 in the listing (``id_conflict`` and ``heartbeat_id_conflict``), the gauge
    and the log (once), though the ledger sees one epoch; once the idle one stops, the flag
    falls after the hold (said once), its key removed."""
    caplog.set_level(logging.INFO)
    settings = fast_settings(redis_url, key_prefix)
    with controller(redis_url, key_prefix, before_start=watched) as c:
        job = c.scheduler.get_job("shadow")
        assert job.trigger.jitter == SHADOW_JITTER_S  # reads at no fixed phase
        assert job.trigger.interval_length == SHADOW_REFRESH_S / 2
        with Agent(settings, capacity=500) as busy:
            time.sleep(settings.heartbeat_interval_s / 2)  # half a beat apart
            with Agent(settings, capacity=500) as idle:
                assert busy.started_at != idle.started_at
                serve(busy, 50)
                wait_until(lambda: c.ingestor.counters.events >= 1000, what="busy's events")
                assert wait_until(lambda: read_once(c), what="the flag") == 2
                shown = view(r, keys)
                assert (shown.id_conflict, shown.heartbeat_id_conflict) == (2, 2)
                assert shown.events_ingested >= 1000
                assert r.hget(keys.ingest_state(WORKER), "id_conflict") == b"0"  # one epoch
                assert 0 < r.pttl(keys.heartbeat_conflict(WORKER)) <= HOLD_S * 1000
                c.refresh_gauges()
                gauge = "kvwise_agent_heartbeat_id_conflict"
                assert c.metrics.registry.get_sample_value(gauge, {"agent": WORKER}) == 2
            beating(r, keys, busy)
            reads = int(HOLD_S / READ_S) + 2  # the idle one's last sighting past the hold
            flags = [read_once(c) for _ in range(reads)]
            assert flags[0] == 2 and flags[-1] == 0
            assert r.exists(keys.heartbeat_conflict(WORKER)) == 0
            assert view(r, keys).id_conflict == 0
    warned = [m for m in caplog.messages if SHARED_LOG in m]
    assert len(warned) == 1, warned
    assert f"worker id {WORKER!r}: 2 agents" in warned[0] and "KVWISE_WORKER_ID" in warned[0]
    assert sum("no longer several agents beating" in m for m in caplog.messages) == 1


def test_a_restart_is_not_flagged_even_with_the_old_agent_beating_beside_the_new_briefly(
    redis_url: str, key_prefix: str, r: redis.Redis, keys: Keys, caplog: pytest.LogCaptureFixture
) -> None:
    """An agent replaced by its successor (A, then B), the old one closing a few reads
    after the new one started (its last beat written as it closes): one agent, no flag."""
    settings = fast_settings(redis_url, key_prefix)
    with controller(redis_url, key_prefix, before_start=watched) as c:
        old = Agent(settings, capacity=500).start()
        serve(old, 10)
        assert not any(read_once(c) for _ in range(20))
        with Agent(settings, capacity=500) as new:
            beating(r, keys, new)
            assert not any(read_once(c) for _ in range(2))  # 14 s beside it at most
            old.close()
            beating(r, keys, new)
            assert not any(read_once(c) for _ in range(100))
            assert view(r, keys).id_conflict == 0
            assert r.exists(keys.heartbeat_conflict(WORKER)) == 0
    assert not [m for m in caplog.messages if SHARED_LOG in m]


@pytest.mark.parametrize("written", ["banana", "9" * 40, "hash"])
def test_a_flag_written_by_another_hand_reads_0_and_is_said_once(
    redis_url: str,
    key_prefix: str,
    r: redis.Redis,
    keys: Keys,
    caplog: pytest.LogCaptureFixture,
    written: str,
) -> None:
    """Any process may write the flag's key: not a count, too long, or not a string, the
    listing shows 0 for it (the others as usual) and says so once while it lists the
    worker."""
    status = AgentStatus(id=WORKER, engine="sim", capacity=10, started_at=1.0)
    r.set(keys.agent(WORKER), status.to_json(), px=60_000)
    if written == "hash":
        r.hset(keys.heartbeat_conflict(WORKER), "agents", "2")
    else:
        r.set(keys.heartbeat_conflict(WORKER), written)
    reader = AgentReader(r, keys, max_agents=10)
    for _ in range(2):
        (agent,) = reader.read().agents
        assert (agent.id_conflict, agent.heartbeat_id_conflict) == (0, 0)
    told = [m for m in caplog.messages if "heartbeat conflict flag" in m]
    assert len(told) == 1, told
    assert WORKER in told[0]

"""Agent processes under one worker id, told by the instances hash their heartbeats keep:
an idle replica beside a serving one (no events, so ingest's ledger sees one epoch) was
unflagged while both overwrote the id's heartbeat, and ``GET /v1/agents`` showed either
one's figures in turn.

Real agents beat into a real Redis every 0.1 s; a real controller lists them and tends the
hashes with its shadow job (called here). The first test waits the real 30 s grace; the
others start an agent ``RAN_S`` back (its ``started_at`` moved before it first beats, as a
process that has run that long) so that the grace has passed at once. A crashed process's
record is written as it would have left it (``AgentInstance``, the agents' own encoding)."""

from __future__ import annotations

import logging
import time

import pytest
import redis

from agent.runtime.agent import Agent
from agent.settings import AgentSettings
from agent.wire import AgentInstance, AgentStatus, Keys
from controlplane.service.agent_instances import GRACE_S, MAX_INSTANCES_READ
from controlplane.service.agents import AgentReader, AgentView
from controlplane.service.controller import SHADOW_REFRESH_S
from tests.integration.agent_fixtures import fast_settings
from tests.integration.controller_fixtures import controller
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

WORKER = "w1"
"""The worker id the agents are given (``fast_settings``')."""
RAN_S = 120.0
"""How long an agent started back has run when it first beats."""
SHARED_LOG = "agent processes beat under it at once"
FELL_LOG = "no longer several agent processes beating under it"


def view(r: redis.Redis, keys: Keys) -> AgentView:
    """``GET /v1/agents``'s view of ``WORKER``, as any replica reads it (a fresh reader)."""
    (agent,) = AgentReader(r, keys, max_agents=10).read().agents
    return agent


def shared(r: redis.Redis, keys: Keys) -> int:
    return view(r, keys).heartbeat_id_conflict


def started_back(settings: AgentSettings, ran_s: float = RAN_S) -> Agent:
    """A started agent that has run ``ran_s`` by its first beat."""
    agent = Agent(settings, capacity=500)
    agent.started_at -= ran_s
    return agent.start()


def serve(agent: Agent, requests: int) -> None:
    """``requests`` distinct requests of 20 blocks each, through ``agent``."""
    for i in range(requests):
        blocks = list(range(i * 20 + 19, i * 20 - 1, -1))
        agent.free(blocks, range(19, -1, -1), time.time(), "text_1")
        agent.evict(len(agent.policy) - agent.capacity, time.time())


def recorded(r: redis.Redis, keys: Keys, agent: Agent) -> bool:
    return r.hexists(keys.instances(WORKER), agent.epoch) == 1


def crashed_record(last_beat_ago_s: float, ran_s: float = RAN_S) -> str:
    """The record a process beating every 0.1 s left when it died ``last_beat_ago_s`` ago,
    after running ``ran_s``."""
    last = time.time() - last_beat_ago_s
    return AgentInstance(last - ran_s, last, 0.1).to_field()


def test_an_idle_agent_beside_a_serving_one_is_flagged_once_they_beat_together_30_s(
    redis_url: str, key_prefix: str, r: redis.Redis, keys: Keys, caplog: pytest.LogCaptureFixture
) -> None:
    """Unflagged until the idle one has beaten beside the other for 30 s, then flagged 2
    within a beat (the listing's ``id_conflict`` and ``heartbeat_id_conflict``, the gauge,
    the leader's log once), though the ledger sees one epoch; 0 again as soon as the idle
    one closes (its last beat removes its record), said once."""
    caplog.set_level(logging.INFO)
    settings = fast_settings(redis_url, key_prefix)
    with controller(redis_url, key_prefix) as c:
        job = c.scheduler.get_job("shadow")
        assert job.trigger.interval_length == SHADOW_REFRESH_S and not job.trigger.jitter
        with Agent(settings, capacity=500) as busy, Agent(settings, capacity=500) as idle:
            serve(busy, 50)
            wait_until(lambda: recorded(r, keys, busy) and recorded(r, keys, idle), what="both")
            while not (flag := shared(r, keys)):
                assert time.time() - idle.started_at < GRACE_S + 3, "not flagged in time"
                time.sleep(0.2)
            after_s = time.time() - idle.started_at
            assert GRACE_S < after_s < GRACE_S + 2, after_s
            assert flag == 2
            wait_until(lambda: c.ingestor.counters.events >= 1000, what="busy's events")
            shown = view(r, keys)
            assert (shown.id_conflict, shown.heartbeat_id_conflict) == (2, 2)
            assert r.hget(keys.ingest_state(WORKER), "id_conflict") == b"0"  # one epoch
            c._refresh_shadow()
            c._refresh_shadow()
            assert c.instance_conflicts.flagged == {WORKER: 2}
            c.refresh_gauges()
            gauge = "kvwise_agent_heartbeat_id_conflict"
            assert c.metrics.registry.get_sample_value(gauge, {"agent": WORKER}) == 2
            idle.close()
            assert not recorded(r, keys, idle) and recorded(r, keys, busy)
            assert view(r, keys).id_conflict == 0
            c._refresh_shadow()
            assert c.instance_conflicts.flagged == {}
    warned = [m for m in caplog.messages if SHARED_LOG in m]
    assert len(warned) == 1, warned
    assert f"worker id {WORKER!r}: 2 agent processes" in warned[0]
    assert "KVWISE_WORKER_ID" in warned[0]
    assert sum(FELL_LOG in m for m in caplog.messages) == 1


def test_a_restart_is_not_flagged_even_with_the_old_agent_beating_beside_the_new_briefly(
    redis_url: str, key_prefix: str, r: redis.Redis, keys: Keys, caplog: pytest.LogCaptureFixture
) -> None:
    """An agent that has run for minutes, its successor started beside it (both beating
    for a few seconds, as a closing process may), then the old one closed: one agent
    throughout, nothing said."""
    settings = fast_settings(redis_url, key_prefix)
    with controller(redis_url, key_prefix) as c:
        old = started_back(settings)
        serve(old, 10)
        wait_until(lambda: recorded(r, keys, old), what="the old agent's record")
        with Agent(settings, capacity=500) as new, old:
            wait_until(lambda: recorded(r, keys, new), what="the new agent's record")
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline:  # both beating, 3 s
                assert shared(r, keys) == 0
                c._refresh_shadow()
                time.sleep(0.2)
            assert recorded(r, keys, old), "the old one beat throughout"
            old.close()
            assert r.hkeys(keys.instances(WORKER)) == [new.epoch.encode()]
            c._refresh_shadow()
            assert view(r, keys).id_conflict == 0
    assert not [m for m in caplog.messages if SHARED_LOG in m]


def test_a_crashed_agents_record_is_removed_and_its_successor_not_flagged(
    redis_url: str, key_prefix: str, r: redis.Redis, keys: Keys
) -> None:
    """A process that died without its last beat leaves its record; the one after it (on
    the same clock) finds it stale two periods on, and the leader removes it."""
    settings = fast_settings(redis_url, key_prefix)
    r.hset(keys.instances(WORKER), "crashed", crashed_record(last_beat_ago_s=0.05))
    with controller(redis_url, key_prefix) as c, Agent(settings, capacity=500) as new:
        wait_until(lambda: recorded(r, keys, new), what="the new agent's record")
        assert shared(r, keys) == 0
        time.sleep(2 * 0.1 + 1.5)  # two of the crashed one's periods and the slack
        c._refresh_shadow()
        assert r.hkeys(keys.instances(WORKER)) == [new.epoch.encode()]
        assert shared(r, keys) == 0


def test_three_agents_count_three_and_one_closing_leaves_two(
    redis_url: str, key_prefix: str, r: redis.Redis, keys: Keys
) -> None:
    settings = fast_settings(redis_url, key_prefix)
    agents = [started_back(settings) for _ in range(3)]
    try:
        wait_until(lambda: all(recorded(r, keys, a) for a in agents), what="three records")
        assert wait_until(lambda: shared(r, keys) == 3, what="three counted")
        agents[0].close()
        assert shared(r, keys) == 2
    finally:
        for agent in agents:
            agent.close()
    assert r.exists(keys.instances(WORKER)) == 0  # each removed its own record


def test_a_crash_looping_worker_cannot_grow_its_hash_past_what_the_leader_removes(
    redis_url: str, key_prefix: str, r: redis.Redis, keys: Keys, caplog: pytest.LogCaptureFixture
) -> None:
    """Forty records of crashed starts beside a live agent: a listing reads
    ``MAX_INSTANCES_READ`` of them at most (the rest counted, said once) and each run of
    the leader's job removes the stale ones it read, until the live one's alone is left."""
    settings = fast_settings(redis_url, key_prefix)
    key = keys.instances(WORKER)
    r.hset(key, mapping={f"crash-{i}": crashed_record(60 + i) for i in range(40)})
    with Agent(settings, capacity=500) as live:
        wait_until(lambda: recorded(r, keys, live), what="the live agent's record")
        reader = AgentReader(r, keys, max_agents=10)
        for _ in range(2):
            read = reader.read().instances[WORKER]
            assert read.unread == 41 - MAX_INSTANCES_READ
            assert (read.conflict, len(read.stale)) == (0, MAX_INSTANCES_READ)
        unread = [m for m in caplog.messages if "left unread" in m]
        assert len(unread) == 1, unread
        assert f"{41 - MAX_INSTANCES_READ} fields past {MAX_INSTANCES_READ}" in unread[0]
        with controller(redis_url, key_prefix) as c:
            runs = 0
            while r.hlen(key) > 1:
                c._refresh_shadow()
                runs += 1
                assert runs <= 10, f"{r.hlen(key)} fields left"
        assert r.hkeys(key) == [live.epoch.encode()]
        assert view(r, keys).heartbeat_id_conflict == 0


@pytest.mark.parametrize("written", ["banana", "9" * 100, "long-name", "a string key"])
def test_a_record_written_by_another_hand_reads_as_nothing_and_is_said_once(
    redis_url: str,
    key_prefix: str,
    r: redis.Redis,
    keys: Keys,
    caplog: pytest.LogCaptureFixture,
    written: str,
) -> None:
    """Any process may write the hash: a value not a record, too long, a field name too
    long, or a key of another type reads as nothing (two live agents beside a bad record
    still count two; a key of another type, none), said once while the worker is listed."""
    key = keys.instances(WORKER)
    if written == "a string key":
        r.set(key, "2")
    elif written == "long-name":
        r.hset(key, "e" * 100, crashed_record(0))
    else:
        r.hset(key, "other", written)
    settings = fast_settings(redis_url, key_prefix)
    agents = [started_back(settings) for _ in range(2)]
    try:
        reader = AgentReader(r, keys, max_agents=10)
        if written == "a string key":
            wait_until(lambda: r.exists(keys.agent(WORKER)) == 1, what="a heartbeat")
            assert all(reader.read().agents[0].heartbeat_id_conflict == 0 for _ in range(3))
        else:
            wait_until(lambda: all(recorded(r, keys, a) for a in agents), what="records")
            assert all(reader.read().agents[0].heartbeat_id_conflict == 2 for _ in range(3))
    finally:
        for agent in agents:
            agent.close()
    told = [m for m in caplog.messages if "instances hash of" in m]
    assert len(told) == 1, told
    assert repr(WORKER) in told[0]


def test_an_agent_that_predates_the_instances_hash_is_not_flagged_by_it(
    r: redis.Redis, keys: Keys, caplog: pytest.LogCaptureFixture
) -> None:
    """Its heartbeat alone (no hash): listed with 0, nothing said (ingest's ledger still
    finds such agents by their events)."""
    status = AgentStatus(id=WORKER, engine="sim", capacity=10, started_at=1.0)
    r.set(keys.agent(WORKER), status.to_json(), px=60_000)
    shown = view(r, keys)
    assert (shown.id_conflict, shown.heartbeat_id_conflict) == (0, 0)
    assert not [m for m in caplog.messages if "instances hash" in m]


def test_each_beat_records_the_process_in_the_same_round_trip_and_ttl_as_the_heartbeat(
    redis_url: str, key_prefix: str, r: redis.Redis, keys: Keys
) -> None:
    settings = fast_settings(redis_url, key_prefix)
    with Agent(settings, capacity=500) as agent:
        wait_until(lambda: recorded(r, keys, agent), what="its record")
        raw = r.hget(keys.instances(WORKER), agent.epoch)
        assert raw is not None
        record = AgentInstance.from_field(raw)
        assert record.started_at == pytest.approx(agent.started_at, abs=1e-3)
        assert record.interval_s == settings.heartbeat_interval_s
        assert record.updated_at <= time.time()
        assert 0 < r.pttl(keys.instances(WORKER)) <= settings.heartbeat_ttl_s * 1000
    assert r.exists(keys.instances(WORKER)) == 0

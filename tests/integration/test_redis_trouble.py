"""The controller and agents when Redis is in trouble (issue 9 and issue 14, B9): down at
start, out of memory, and a URL that is not one. Each is said once, by name; the service
raises the ``redis.RedisError`` (the API's 503), never a traceback per call."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
import redis

from agent.runtime.agent import Agent
from agent.runtime.connection import RedisState, RedisUrlError
from agent.settings import AgentSettings
from agent.wire import Keys
from controlplane.dev.embedded_redis import EmbeddedRedis, free_port
from controlplane.service.controller import Controller
from controlplane.service.settings import ControllerSettings
from tests.integration.agent_fixtures import fast_settings
from tests.integration.controller_fixtures import good_batch, live_settings, send
from tests.tcp_relay import Relay
from tests.waiting import wait_until

pytestmark = pytest.mark.integration


def settings(url: str, prefix: str, **extra: object) -> ControllerSettings:
    return live_settings(
        redis_url=url, key_prefix=prefix, lease_ttl_s=0.6, ingest_block_ms=50, **extra
    )


def test_redis_down_is_said_once_and_each_call_is_redis_unavailable(
    key_prefix: str, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    port = free_port()
    c = Controller(settings(f"redis://127.0.0.1:{port}/0", key_prefix))
    with caplog.at_level(logging.INFO):
        c.start()
        try:
            for call in (c.store.current, c.store.versions, c.agents, c.categories):
                with pytest.raises(redis.ConnectionError):
                    call()
                assert c.health.report.state is RedisState.UNREACHABLE
                assert c.health.report.reason.startswith("redis unavailable: ")
            ok, reason = c.ready()
            assert not ok and reason.startswith("redis unavailable")
            time.sleep(1.5)  # several lease ticks while down: still one warning
            down = [r for r in caplog.records if "redis unavailable" in r.getMessage()]
            assert len(down) == 1, [r.getMessage() for r in down]
            assert not any(r.exc_info for r in caplog.records), "a traceback was logged"
            with EmbeddedRedis(tmp_path, port=port):
                wait_until(lambda: c.ready()[0], timeout=15, what="ready once Redis answers")
                assert c.store.current_version() == 1
                back = [r for r in caplog.records if "answers again" in r.getMessage()]
                assert len(back) == 1
                c.stop()
        finally:
            c.stop()


def test_out_of_memory_is_reported_as_such(key_prefix: str, tmp_path: Path) -> None:
    with EmbeddedRedis(tmp_path) as server:
        r = redis.Redis.from_url(server.url)
        agent = Agent(
            fast_settings(server.url, key_prefix, heartbeat_ttl_s=1.0),
            capacity=10,
        )
        c = Controller(settings(server.url, key_prefix))
        c.start()
        with agent:
            wait_until(lambda: [a.id for a in c.agents()] == ["w1"], what="the heartbeat")
            # Below what it holds: every write that needs memory is refused.
            used = int(r.info("memory")["used_memory"])
            r.config_set("maxmemory-policy", "noeviction")
            r.config_set("maxmemory", used // 2)
            ok, reason = c.ready()
            assert not ok and reason.startswith("redis out of memory"), reason
            assert c.health.report.state is RedisState.OUT_OF_MEMORY
            gauge = c.metrics.registry.get_sample_value(
                "kvwise_redis_state", {"state": "out_of_memory"}
            )
            assert gauge == 1
            # Refused heartbeats no longer empty /v1/agents: the last one is kept alive.
            wait_until(
                lambda: agent.heartbeat.failures >= 3,
                what=f"refused heartbeats ({agent.heartbeat.beats} {agent.heartbeat.last_error})",
            )
            time.sleep(1.2)  # past the heartbeat's TTL
            assert [a.id for a in c.agents()] == ["w1"]
            assert "out of memory" in agent.heartbeat.last_error
            r.config_set("maxmemory", 0)
            wait_until(lambda: c.ready()[0], what="ready once memory is free")
        c.stop()


def test_a_malformed_url_is_one_clear_error() -> None:
    for build in (
        lambda: Controller(ControllerSettings(redis_url="notaurl")),
        lambda: Agent(AgentSettings(redis_url="notaurl"), capacity=4),
    ):
        with pytest.raises(RedisUrlError) as err:
            build()
        message = str(err.value)
        assert "'notaurl'" in message and "redis://" in message and "\n" not in message
    with pytest.raises(RedisUrlError, match="malformed") as err:
        Controller(ControllerSettings(redis_url="redis://:s3cret@host:notaport/0"))
    assert "s3cret" not in str(err.value)  # no password in the message


def test_close_again_waits_for_the_threads_the_first_left_running(
    key_prefix: str, tmp_path: Path
) -> None:
    """A close that timed out, then another: the second said True at once (already
    closed) while a thread still waited on Redis and the client was never closed."""
    with EmbeddedRedis(tmp_path) as server:
        s = fast_settings(server.url, key_prefix, redis_timeout_s=0.5)
        agent = Agent(s, capacity=10).start()
        wait_until(lambda: agent.heartbeat.beats > 0, what="a first heartbeat")
        redis.Redis.from_url(server.url).client_pause(20_000, all=False)  # writes hang
        assert not agent.close(timeout=0.1)
        assert agent.heartbeat.running, "the last heartbeat waits on Redis"
        assert agent.close(timeout=10.0)
        assert not any(t.running for t in (agent.publisher, agent.subscriber, agent.heartbeat))


def test_close_keeps_to_its_timeout_while_redis_hangs(key_prefix: str, tmp_path: Path) -> None:
    """A Redis that takes connections and stops answering writes at shutdown: the last
    heartbeat was written from the caller after the threads had ended, unbounded by
    ``timeout`` (two socket timeouts and a retry: 4 s for a close of 1 s)."""
    with EmbeddedRedis(tmp_path) as server:
        s = fast_settings(server.url, key_prefix, redis_timeout_s=2.0)
        agent = Agent(s, capacity=10).start()
        wait_until(lambda: agent.heartbeat.beats > 0, what="a first heartbeat")
        redis.Redis.from_url(server.url).client_pause(20_000, all=False)  # writes hang
        started = time.monotonic()
        done = agent.close(timeout=1.0)
        took = time.monotonic() - started
        assert took < 1.5, f"close(timeout=1.0) took {took:.1f} s"
        assert not done, "a write was still pending: close must say so"


def test_writes_resume_after_a_failover_behind_one_address(key_prefix: str, tmp_path: Path) -> None:
    """A failover behind one address (a Service, a DNS name): the old primary, now a
    replica, refused every write on the pooled connections (READONLY) until the process
    restarted; redis-py reconnects after connection errors only."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with EmbeddedRedis(tmp_path / "a") as old, EmbeddedRedis(tmp_path / "b") as new:
        relay = Relay(old.port)
        agent = Agent(fast_settings(relay.url, key_prefix), capacity=10).start()
        try:
            wait_until(lambda: agent.heartbeat.beats > 0, what="a first heartbeat")
            redis.Redis.from_url(old.url).replicaof("127.0.0.1", new.port)  # demoted
            wait_until(lambda: agent.heartbeat.last_error.startswith("redis is a read-only"))
            relay.target_port = new.port  # the address names the new primary
            agent.free([3, 2, 1], [2, 1, 0], time.time(), "text_1")
            wait_until(lambda: agent.events_sent == 3, what="events on the new primary")
            key = Keys(key_prefix).agent("w1")
            wait_until(lambda: redis.Redis.from_url(new.url).exists(key), what="a heartbeat")
        finally:
            agent.close()
            relay.close()


def test_the_controller_writes_again_after_a_failover_behind_one_address(
    key_prefix: str, tmp_path: Path
) -> None:
    """The controller's side of the failover above: its lease tick, probe and ingest were
    refused (READONLY) on the pooled connections to the old primary until a restart, so
    no replica led and nothing was ingested on the new primary."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with EmbeddedRedis(tmp_path / "a") as old, EmbeddedRedis(tmp_path / "b") as new:
        relay = Relay(old.port)
        c = Controller(settings(relay.url, key_prefix))
        c.start()
        try:
            wait_until(lambda: c.lease.is_leader and c.ingestor.running, what="leadership")
            redis.Redis.from_url(old.url).replicaof("127.0.0.1", new.port)  # demoted
            wait_until(lambda: c.health.report.state is RedisState.READ_ONLY, what="read-only")
            relay.target_port = new.port  # the address names the new primary
            on_new = redis.Redis.from_url(new.url)
            keys = Keys(key_prefix)
            wait_until(lambda: on_new.exists(keys.leader), timeout=15, what="a lease on new")
            wait_until(lambda: c.lease.is_leader and c.ingestor.running, what="leading again")
            send(on_new, keys, good_batch("w1", 1))
            wait_until(lambda: c.ingestor.counters.batches == 1, what="ingest on new")
            wait_until(lambda: c.ready()[0], timeout=15, what="ready on the new primary")
        finally:
            c.stop()
            relay.close()

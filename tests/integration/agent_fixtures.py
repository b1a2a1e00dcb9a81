"""Agent settings for live tests: short intervals and timeouts, so a test waits little."""

from __future__ import annotations

from typing import Any

from agent.settings import AgentSettings

FAST: dict[str, Any] = {
    "evictor": "lru",
    "worker_id": "w1",
    "flush_interval_s": 0.05,
    "poll_interval_s": 0.2,
    "heartbeat_interval_s": 0.1,
    "heartbeat_ttl_s": 5.0,
    "redis_timeout_s": 0.5,
    "reconnect_max_s": 0.2,
}
"""The settings of a live test's agent beside its Redis: worker ``w1`` under ``lru``, with
the short intervals and timeouts."""


def fast_settings(redis_url: str, prefix: str, **update: object) -> AgentSettings:
    base = AgentSettings(redis_url=redis_url, key_prefix=prefix, **FAST)
    return base.model_copy(update=update)

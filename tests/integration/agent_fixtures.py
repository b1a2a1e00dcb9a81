"""Agent settings for live tests: short intervals and timeouts, so a test waits little."""

from __future__ import annotations

from agent.settings import AgentSettings


def fast_settings(redis_url: str, prefix: str, **update: object) -> AgentSettings:
    base = AgentSettings(
        redis_url=redis_url,
        key_prefix=prefix,
        evictor="lru",
        worker_id="w1",
        flush_interval_s=0.05,
        poll_interval_s=0.2,
        heartbeat_interval_s=0.1,
        heartbeat_ttl_s=5.0,
        redis_timeout_s=0.5,
        reconnect_max_s=0.2,
    )
    return base.model_copy(update=update)

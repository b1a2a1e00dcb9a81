"""The heartbeat thread: this agent's ``AgentStatus`` under ``Keys.agent(id)`` with a TTL.

Owns the period and the expiry of the heartbeat key: written at start and every
``heartbeat_interval_s`` with ``heartbeat_ttl_s``, so a worker that dies silently
disappears from the controller's view, and once more when stopped (on its thread, so
``close`` keeps to its timeout) with ``LAST_BEAT_TTL_S``, so a closed one leaves it soon.
It must never be called from the engine thread; it only reads counters through
``status``.
"""

from __future__ import annotations

from collections.abc import Callable

import redis

from agent.runtime.connection import RedisClient
from agent.runtime.loop import AgentLoop
from agent.settings import AgentSettings
from agent.wire import AgentStatus

LAST_BEAT_TTL_S = 10.0
"""TTL of a beat written once stopped (at most ``heartbeat_ttl_s``): a closed worker leaves
the controller's view this soon, its final counters readable meanwhile (the demo reads
them for up to 5 s after stopping its workers)."""


class Heartbeat(AgentLoop):
    """Writes ``status()`` every interval from a daemon thread."""

    def __init__(
        self, settings: AgentSettings, client: RedisClient, status: Callable[[], AgentStatus]
    ) -> None:
        super().__init__("heartbeat", settings, client, interval_s=settings.heartbeat_interval_s)
        self._status = status
        self.beats = 0

    def beat(self) -> bool:
        """Write the status once; False (logged once per outage) if Redis refused it."""
        return self.run_step()

    def step(self) -> None:
        status = self._status()
        ttl_s = self.settings.heartbeat_ttl_s
        if self.stopping:  # the last beat: a worker closing, not one gone silent
            ttl_s = min(ttl_s, LAST_BEAT_TTL_S)
        key, ttl_ms = self.keys.agent(status.id), max(1, round(ttl_s * 1000))
        try:
            self.client.set(key, status.to_json(), px=ttl_ms)
        except redis.exceptions.OutOfMemoryError:
            # Redis refuses writes that need memory, not PEXPIRE: the last heartbeat stays
            # (with its old counters), so the controller still lists this serving worker.
            self.client.pexpire(key, ttl_ms)
            raise
        self.beats += 1

    def outage_note(self) -> str:
        return "the last heartbeat expires after its TTL (kept alive if Redis is only full)"

    def next_wait(self) -> float:
        return self.interval_s  # a beat is one small write: no backoff needed

    def finish(self) -> None:
        """A last beat with the final counters, on this thread once it is stopped (the
        agent stops it after the publisher's last flush), so ``close`` waits for it no
        longer than its ``timeout``. Skipped while Redis is failing: it would only wait out
        another timeout."""
        if self.failures == 0:
            self.beat()

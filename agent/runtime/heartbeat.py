"""The heartbeat thread: this agent's ``AgentStatus`` under ``Keys.agent(id)`` with a TTL.

Owns the period and the expiry of the heartbeat key: written at start, every
``heartbeat_interval_s`` and once more at close, each time with ``heartbeat_ttl_s``, so a
worker that dies silently disappears from the controller's view. It must never be called
from the engine thread; it only reads counters through ``status``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import redis

from agent.settings import AgentSettings
from agent.wire import AgentStatus, Keys

log = logging.getLogger(__name__)


class Heartbeat:
    """Writes ``status()`` every interval from a daemon thread."""

    def __init__(
        self, settings: AgentSettings, client: redis.Redis, status: Callable[[], AgentStatus]
    ) -> None:
        self.settings = settings
        self.client = client
        self._status = status
        self.keys = Keys(settings.key_prefix)
        self.beats = 0
        self.failures = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def beat(self) -> bool:
        """Write the status once; False (logged once per outage) if Redis is unreachable."""
        status = self._status()
        try:
            self.client.set(
                self.keys.agent(status.id),
                status.to_json(),
                px=max(1, round(self.settings.heartbeat_ttl_s * 1000)),
            )
        except redis.RedisError as exc:
            if self.failures == 0:
                log.warning("kvwise heartbeat: cannot reach Redis (%s)", exc)
            self.failures += 1
            return False
        self.failures = 0
        self.beats += 1
        return True

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="kvwise-heartbeat", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def close(self, timeout: float = 5.0) -> bool:
        """Stop the thread, then write a last heartbeat with the final counters (skipped
        while Redis is failing: it would only wait out another timeout)."""
        self.stop()
        if self._thread is None:
            return True
        self._thread.join(timeout)
        if self._thread.is_alive():
            return False
        self._thread = None
        if self.failures == 0:
            self.beat()
        return True

    def _run(self) -> None:
        self.beat()
        while not self._stop.wait(self.settings.heartbeat_interval_s):
            self.beat()

"""The heartbeat thread: this agent's ``AgentStatus`` under ``Keys.agent(id)`` with a TTL,
and this process's ``AgentInstance`` under its epoch in ``Keys.instances(id)``.

Owns the period and the expiry of the heartbeat key: written at start and every
``heartbeat_interval_s`` with ``heartbeat_ttl_s``, so a worker that dies silently
disappears from the controller's view, and once more when stopped (on its thread, so
``close`` keeps to its timeout) with ``LAST_BEAT_TTL_S``, so a closed one leaves it soon.
Each beat also records the process in the id's instances hash (the key given
``heartbeat_ttl_s`` too), in the same round trip, so that the controller can tell several
processes beating under one id; the last beat removes its field. A record refused while
the heartbeat is written (a key of another type, an ACL) is said once and leaves the beat
standing. It must never be called from the engine thread; it only reads counters through
``status``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import redis

from agent.runtime.connection import RedisClient
from agent.runtime.loop import AgentLoop
from agent.settings import AgentSettings
from agent.wire import AgentInstance, AgentStatus

if TYPE_CHECKING:
    from redis.client import Pipeline

log = logging.getLogger(__name__)

LAST_BEAT_TTL_S = 10.0
"""TTL of a beat written once stopped (at most ``heartbeat_ttl_s``): a closed worker leaves
the controller's view this soon, its final counters readable meanwhile (the demo reads
them for up to 5 s after stopping its workers)."""


class Heartbeat(AgentLoop):
    """Writes ``status()`` every interval from a daemon thread."""

    def __init__(
        self,
        settings: AgentSettings,
        client: RedisClient,
        status: Callable[[], AgentStatus],
        epoch: str,
    ) -> None:
        """``epoch``: this process's random id (its events' ``e``), its instance's field."""
        super().__init__("heartbeat", settings, client, interval_s=settings.heartbeat_interval_s)
        self._status = status
        self.epoch = epoch
        self.beats = 0
        self._told_record = False

    def beat(self) -> bool:
        """Write the status once; False (logged once per outage) if Redis refused it."""
        return self.run_step()

    def step(self) -> None:
        status = self._status()
        ttl_s = self.settings.heartbeat_ttl_s
        if self.stopping:  # the last beat: a worker closing, not one gone silent
            ttl_s = min(ttl_s, LAST_BEAT_TTL_S)
        key, ttl_ms = self.keys.agent(status.id), max(1, round(ttl_s * 1000))
        pipe = self.client.pipeline(transaction=False)
        pipe.set(key, status.to_json(), px=ttl_ms)
        self._record_instance(pipe, status)
        written, *recorded = pipe.execute(raise_on_error=False)  # one round trip: {id}
        if isinstance(written, redis.exceptions.OutOfMemoryError):
            # Redis refuses writes that need memory, not PEXPIRE: the last heartbeat stays
            # (with its old counters), so the controller still lists this serving worker.
            self.client.pexpire(key, ttl_ms)
        if isinstance(written, redis.RedisError):
            raise written
        self.beats += 1
        self._said_refused_record(status.id, recorded)

    def _record_instance(self, pipe: Pipeline, status: AgentStatus) -> None:
        """Queue this process's record in the instances hash (the key living as long as an
        unstopped heartbeat), or, on the last beat, its removal: a closed agent is no
        process beating under the id."""
        key = self.keys.instances(status.id)
        if self.stopping:
            pipe.hdel(key, self.epoch)
            return
        me = AgentInstance(status.started_at, status.updated_at, self.interval_s)
        pipe.hset(key, self.epoch, me.to_field())
        pipe.pexpire(key, max(1, round(self.settings.heartbeat_ttl_s * 1000)))

    def _said_refused_record(self, worker: str, replies: list[object]) -> None:
        """Say once per process that its record was refused while its heartbeat was not (a
        key of another type under the name, an ACL that allows only the heartbeat): the
        beat stands, but the controller cannot tell this process from another under the
        id."""
        refused = next((r for r in replies if isinstance(r, redis.RedisError)), None)
        if refused is not None and not self._told_record:
            self._told_record = True
            log.warning(
                "kvwise agent %s: its record in %s was refused (%s): the controller cannot "
                "tell whether another agent runs under this worker id",
                worker,
                self.keys.instances(worker),
                refused,
            )

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

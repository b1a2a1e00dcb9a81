"""What the controller says about each agent: its heartbeat plus what ingest did with its
events (from the worker's ledger, so any replica, leader or not, answers the same).

Owns ``AgentView`` and reading it from Redis: the live heartbeats (SCAN + MGET) and the
ledgers of those workers, in two round trips. A heartbeat this release cannot read (an agent
of another wire schema, a corrupt value) is skipped and said once per agent key while that
key lives. It must never write.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass

from agent.runtime.connection import RedisClient
from agent.wire import AgentStatus, Keys, WireError
from controlplane.service.ledger import WorkerLedger

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AgentView(AgentStatus):
    """An agent's heartbeat and the controller's counts of its events."""

    events_ingested: int = 0
    """Events of this worker applied to the statistics window."""
    clock_rejected: int = 0
    """Events dropped: their time was outside ``clock_tolerance_s`` of the controller's."""
    events_refused: int = 0
    """Events in entries dead-lettered for a limit or a failure to apply."""
    dead_letters: int = 0
    """Entries of this worker dead-lettered."""
    gap_batches: int = 0
    """Batches missing from its sequence (lost before ingest)."""
    engine_seconds: float = 0.0
    """Estimated engine-thread time of kvwise's calls since the agent started (its sampled
    ``engine_*`` counts: ``EngineTimeSnapshot``)."""
    engine_seconds_per_call: float = 0.0
    """Mean engine-thread time of one of kvwise's calls, over the timed ones."""
    engine_seconds_per_block: float = 0.0
    """Engine-thread time of the timed calls per block they handled."""
    ingest_refused: bool = False
    """Its stream was found past ``KVWISE_MAX_WORKERS`` streams: the leader leaves it
    unread (and the shadow leaves the worker out) until one ingested expires."""


class AgentReader:
    """Reads ``AgentView``s; remembers which unreadable heartbeats it has reported."""

    def __init__(self, client: RedisClient, keys: Keys) -> None:
        self.r = client
        self.keys = keys
        self._told: set[bytes] = set()

    def read(self) -> list[AgentView]:
        keys = sorted(set(self.r.scan_iter(match=self.keys.agents_match, count=500)))
        self._told &= set(keys)  # an expired key is forgotten (agent churn)
        if not keys:
            return []
        pipe = self.r.pipeline(transaction=False)
        for key in keys:
            pipe.get(key)  # one key per command: heartbeats sit on many shards
        statuses = [self._status(k, raw) for k, raw in zip(keys, pipe.execute(), strict=True)]
        live = [s for s in statuses if s is not None]
        pipe = self.r.pipeline(transaction=False)
        for status in live:
            pipe.hgetall(self.keys.ingest_state(status.id))
        views = []
        for status, raw in zip(live, pipe.execute(), strict=True):
            try:
                ledger = WorkerLedger.from_hash(status.id, raw)
            except ValueError:  # unreadable: counted from nothing, as ingest restarts it
                ledger = WorkerLedger(status.id)
            c, cost = ledger.counts, status.engine_time
            views.append(
                AgentView(
                    **asdict(status),
                    events_ingested=c.events,
                    clock_rejected=c.clock_rejected,
                    events_refused=c.refused,
                    dead_letters=c.dead_letters,
                    gap_batches=ledger.missing,
                    engine_seconds=cost.seconds,
                    engine_seconds_per_call=cost.seconds_per_call,
                    engine_seconds_per_block=cost.seconds_per_block,
                )
            )
        return sorted(views, key=lambda a: a.id)

    def _status(self, key: bytes, raw: bytes | None) -> AgentStatus | None:
        if raw is None:
            return None  # expired between SCAN and GET
        try:
            return AgentStatus.from_json(raw)
        except WireError as exc:
            if key not in self._told:
                self._told.add(key)
                log.warning("ignoring the heartbeat under %r: %s", key, exc.reason)
            return None

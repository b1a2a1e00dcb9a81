"""Several agents under one worker id, told by their heartbeats alone (an idle replica sends
no events for ingest's ledger to see, yet overwrites the heartbeat of the one that serves).

Owns ``HeartbeatWatch``: per worker, the agent starts (``AgentStatus.started_at``) its
heartbeat reads showed, the last ``STARTS_KEPT`` of them, each with the controller's times
of its first and last sighting. Each read sees whichever agent wrote last, so two agents
that beat side by side may show the same one many reads in a row; what is conclusive is a
return: start A seen, then B, then A again ``GRACE_S`` or more after B was first seen is
two agents alive at once (a restart is one start after another; the old one's last beat,
written as it closes, may follow the new one's first by seconds, not by ``GRACE_S``). A
start counts while it was seen within ``HOLD_S``: a read may miss one of two live agents
many times running, so the flag falls only once one has gone unseen that long (or at once,
when the id's heartbeat expires). Also ``HeartbeatConflicts``, the leader's use of it: the
flags stored under ``Keys.heartbeat_conflict`` (each expiring when it would fall), so every
replica answers the same, and said once per change; and ``read_flags``, their bounded read.
It must never read a heartbeat itself (the controller passes what it read), nor write
anything but the flags.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final

from agent.runtime.connection import RedisClient
from agent.wire import AgentStatus, Keys
from controlplane.service.ledger import ID_CONFLICT_GRACE_MS
from controlplane.told_once import ToldOnce

log = logging.getLogger(__name__)

GRACE_S: Final = ID_CONFLICT_GRACE_MS / 1000
"""How long after another start's first sighting a start must be seen again to be an agent
alive beside it: ingest's grace for two epochs writing side by side, so a restart is no
conflict to either."""
HOLD_S: Final = 600.0
"""How long a start counts after its last sighting: a read shows the agent that beat last,
so one of two live agents may go unseen for many reads (one beating just after the other);
ten minutes of reads (about 120 at the shadow job's pace) all missing it is the flag's end."""
STARTS_KEPT: Final = 8
"""Starts remembered per worker (the most recently seen): more agents alternating under
one id than this are counted as this many at most."""
FLAG_BYTES: Final = 20
"""Bytes of a stored flag read at most (a count: a few digits); a longer value is refused."""


@dataclass
class Sightings:
    """When the controller's reads first and last showed one agent start."""

    first: float
    last: float

    def outlived(self, other: Sightings) -> float:
        """How long, of the two, the one seen first was seen on after the other's first
        sighting (negative: it was not seen again once the other was)."""
        earlier, later = (self, other) if self.first <= other.first else (other, self)
        return earlier.last - later.first


@dataclass
class WorkerStarts:
    """One worker's starts seen (least recently seen first), at most ``STARTS_KEPT``."""

    starts: dict[float, Sightings] = field(default_factory=dict)

    def see(self, started_at: float, now: float) -> None:
        seen = self.starts.pop(started_at, None) or Sightings(now, now)
        seen.last = now
        self.starts[started_at] = seen  # most recently seen last
        while len(self.starts) > STARTS_KEPT:
            del self.starts[next(iter(self.starts))]

    def alive_at_once(self, now: float) -> list[Sightings]:
        """The starts seen within ``HOLD_S`` that were alive beside another such start: of
        the two, the one seen first was seen again ``GRACE_S`` or more after the other's
        first sighting (A, B, A: A beat on after B started, so B is no restart of A)."""
        recent = [s for s in self.starts.values() if s.last >= now - HOLD_S]
        return [s for s in recent if any(s is not o and s.outlived(o) >= GRACE_S for o in recent)]


@dataclass(frozen=True)
class Flag:
    """A worker id found written by several agents: how many, and for how much longer the
    evidence holds (seconds) if nothing more is seen."""

    agents: int
    holds_s: float


class HeartbeatWatch:
    """The starts seen per worker (bounded: the workers of the last read only, each with
    ``STARTS_KEPT`` starts at most) and the flags they give; ``clock`` is monotonic."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.workers: dict[str, WorkerStarts] = {}

    def observe(self, statuses: Iterable[AgentStatus]) -> dict[str, Flag]:
        """One read of the heartbeats: the workers flagged now. A worker not in the read
        (its heartbeat expired, or listed no more) is forgotten."""
        now = self.clock()
        seen = {s.id: s.started_at for s in statuses}
        self.workers = {w: self.workers.get(w) or WorkerStarts() for w in seen}
        flags = {}
        for worker, started_at in seen.items():
            starts = self.workers[worker]
            starts.see(started_at, now)
            alive = starts.alive_at_once(now)
            if alive:
                holds = min(s.last for s in alive) + HOLD_S - now
                flags[worker] = Flag(len(alive), holds)
        return flags


class HeartbeatConflicts:
    """The leader's side: each read of the heartbeats observed (``watch``), the flags stored
    under ``Keys.heartbeat_conflict`` (each expiring when it would fall, removed when it
    falls), and said once per change (a warning when it rises, a note when it falls), for
    ``max_workers`` workers at most."""

    def __init__(
        self,
        client: RedisClient,
        keys: Keys,
        max_workers: int | None = None,
        watch: HeartbeatWatch | None = None,
    ) -> None:
        self.r = client
        self.keys = keys
        self.watch = watch or HeartbeatWatch()
        self.flagged: dict[str, int] = {}
        """The workers whose flag this process stored, with its count."""
        self.told: ToldOnce[str] = ToldOnce(cap=max_workers)
        self._lock = threading.Lock()  # the job's thread, and a test's or operator's call

    def observe(self, statuses: Sequence[AgentStatus]) -> dict[str, Flag]:
        """One read of the heartbeats, observed as soon as it is read (its time is the
        sightings'): the workers flagged now, for ``store``."""
        with self._lock:
            return self.watch.observe(statuses)

    def store(self, flags: dict[str, Flag]) -> None:
        """Store ``flags`` (those no longer flagged removed) and say what changed. Redis's
        errors raise (the next read stores the flags again)."""
        with self._lock:
            fallen = [w for w in self.flagged if w not in flags]
            if flags or fallen:  # one agent per id, the usual case: nothing written
                self._write(flags, fallen)
            self._say(flags, fallen)
            self.flagged = {w: f.agents for w, f in flags.items()}

    def _write(self, flags: dict[str, Flag], fallen: list[str]) -> None:
        pipe = self.r.pipeline(transaction=False)
        for worker, flag in flags.items():
            ttl_ms = max(1, round(flag.holds_s * 1000))
            pipe.set(self.keys.heartbeat_conflict(worker), str(flag.agents), px=ttl_ms)
        for worker in fallen:
            pipe.delete(self.keys.heartbeat_conflict(worker))
        pipe.execute()

    def _say(self, flags: dict[str, Flag], fallen: list[str]) -> None:
        for worker, flag in flags.items():
            if self.told.first(worker):
                log.warning(
                    "worker id %r: %d agents write heartbeats under it (its heartbeat "
                    "showed one start, another, then the first again %d s or more after "
                    "the other's first): GET /v1/agents shows "
                    "either one's figures and any events they send count as one worker's; "
                    "give each replica its own KVWISE_WORKER_ID (e.g. the pod's name)",
                    worker,
                    flag.agents,
                    GRACE_S,
                )
        for worker in fallen:
            if worker in self.told:
                self.told.forget(worker)
                log.info("worker id %r: no longer several agents beating under it", worker)


def read_flags(client: RedisClient, keys: Keys, workers: Sequence[str]) -> list[int | ValueError]:
    """The stored flag of each of ``workers`` (0: none), ``FLAG_BYTES`` of each at most, or
    a ``ValueError`` saying why it is unreadable; one round trip per shard."""
    if not workers:
        return []
    pipe = client.pipeline(transaction=False)
    for worker in workers:
        pipe.getrange(keys.heartbeat_conflict(worker), 0, FLAG_BYTES)
    raws = pipe.execute(raise_on_error=False)
    return [_flag(raw) for raw in raws]


def _flag(raw: bytes | Exception) -> int | ValueError:
    if isinstance(raw, Exception):
        if not str(raw).startswith("WRONGTYPE"):
            raise raw  # Redis's trouble (read-only, out of memory): the health's
        return ValueError("heartbeat conflict flag: not a string value (WRONGTYPE)")
    if not raw:
        return 0
    if len(raw) > FLAG_BYTES or not raw.isdigit():
        return ValueError(f"heartbeat conflict flag: {raw[:FLAG_BYTES]!r} is not a count")
    return int(raw)

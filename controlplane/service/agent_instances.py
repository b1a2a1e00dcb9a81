"""Several agent processes under one worker id, told by the instances hash their heartbeats
keep (``Keys.instances``: one field per process, ``AgentInstance``), so that a replica
sending no events (which ingest's ledger cannot see) is found as surely as one that does.

Owns reading those hashes within bounds (``read_instances``: one script per worker, in
Redis, checks the key's type and reads ``MAX_INSTANCES_READ`` fields at most, a value past
``MAX_INSTANCE_BYTES`` sent as nothing), judging them (``judge``: which processes beat on
together, which records are stale) and the leader's care of them (``InstanceConflicts``:
stale fields removed, each change said once). The judgement reads the hash and the id's
heartbeat alone (staleness against the newest beat they show, by the agents' clocks), so
every replica answers the same without a flag stored or a clock of its own. It must never
write anything but the removal of stale fields.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from agent.runtime.connection import RedisClient
from agent.wire import MAX_INSTANCE_BYTES, AgentInstance, AgentStatus, Keys, WireError
from controlplane.service.ledger import ID_CONFLICT_GRACE_MS
from controlplane.told_once import ToldOnce

log = logging.getLogger(__name__)

GRACE_S: Final = ID_CONFLICT_GRACE_MS / 1000
"""How long two processes must have beaten side by side to be two agents, not a restart
(the old one's last beats next to the new one's first): ingest's grace for epochs."""
STALE_AFTER_BEATS: Final = 2
"""A record is stale once the newest beat (``judge``) is this many of its own periods (plus
``STALE_SLACK_S``) past its last: the process missed two beats, so it stopped (or its
writes fail; it records itself again at its next beat)."""
STALE_SLACK_S: Final = 1.0
"""Seconds added to a record's ``STALE_AFTER_BEATS`` periods: a beat's write and a busy
thread's delay, so a short period (0.1 s, as in tests) does not read stale between beats."""
MAX_INSTANCES_READ: Final = 16
"""Fields of one worker's instances hash read at most: more processes under one id than
this are counted as this many at most, the others left unread (counted, said once)."""

_READ = """
local key, max_fields, max_bytes = KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2])
local kind = redis.call('TYPE', key)['ok']
if kind == 'none' then return {'ok', 0} end
if kind ~= 'hash' then return {'refused', 'a ' .. kind .. ', not a hash'} end
local out = {'ok', redis.call('HLEN', key)}
local pairs = redis.call('HSCAN', key, '0', 'COUNT', max_fields)[2]
for i = 1, math.min(#pairs, 2 * max_fields), 2 do
  local name, value = pairs[i], pairs[i + 1]
  if #name > max_bytes then name = false end
  if #value > max_bytes then value = false end
  out[#out + 1] = name
  out[#out + 1] = value
end
return out
"""


@dataclass(frozen=True)
class WorkerInstances:
    """What one worker's instances hash says."""

    conflict: int = 0
    """Processes that beat on beside another for over ``GRACE_S`` and still beat (0 when
    none: one process, a restart, no hash)."""
    stale: tuple[bytes, ...] = ()
    """Fields (epochs) of processes that stopped beating, for the leader to remove."""
    unread: int = 0
    """Fields past ``MAX_INSTANCES_READ``, not read."""
    bad: tuple[str, ...] = ()
    """Why each field that could not be read was refused (read as nothing)."""


def judge(
    instances: Mapping[bytes, AgentInstance], heartbeat_at: float = 0.0
) -> tuple[int, tuple[bytes, ...]]:
    """The processes of ``instances`` (by epoch) alive together (each still beating and
    beside another for over ``GRACE_S``: their spans, start to last beat, overlap that
    long), and the stale ones. A record's staleness is judged against the newest beat,
    of the records and of the id's heartbeat (``heartbeat_at``, its ``updated_at``: a
    process alive, even where its record is past the fields read), all by the agents'
    clocks (one clock when a process restarts on its machine), so no clock of the
    controller's enters."""
    if not instances:
        return 0, ()
    newest = max(heartbeat_at, *(i.updated_at for i in instances.values()))
    stale = tuple(e for e, i in instances.items() if _stale(i, newest))
    live = [i for e, i in instances.items() if e not in stale]
    together = sum(any(i is not o and _overlap(i, o) > GRACE_S for o in live) for i in live)
    return together, stale


def _stale(instance: AgentInstance, newest: float) -> bool:
    allowed = STALE_AFTER_BEATS * instance.interval_s + STALE_SLACK_S
    return newest - instance.updated_at > allowed


def _overlap(a: AgentInstance, b: AgentInstance) -> float:
    """Seconds both of ``a`` and ``b`` were beating (negative: one began after the other's
    last beat)."""
    return min(a.updated_at, b.updated_at) - max(a.started_at, b.started_at)


def read_instances(
    client: RedisClient, keys: Keys, heartbeats: Sequence[AgentStatus]
) -> list[WorkerInstances | ValueError]:
    """The instances hash of each of the workers whose ``heartbeats`` were read, judged
    (nothing for a missing one, as an agent that predates it writes none), or a
    ``ValueError`` saying why it was refused unread (a key of another type); one round
    trip per shard. Redis's own errors raise."""
    if not heartbeats:
        return []
    pipe = client.pipeline(transaction=False)
    for status in heartbeats:
        # execute_command: a cluster pipeline routes EVAL by its key, but has no eval().
        args = (MAX_INSTANCES_READ, MAX_INSTANCE_BYTES)
        pipe.execute_command("EVAL", _READ, 1, keys.instances(status.id), *args)
    replies = pipe.execute()
    return [_worker_instances(r, s.updated_at) for r, s in zip(replies, heartbeats, strict=True)]


def _worker_instances(reply: list[Any], heartbeat_at: float) -> WorkerInstances | ValueError:
    if reply[0] != b"ok":
        return ValueError(f"instances hash: {reply[1].decode()}")
    count, pairs = reply[1], reply[2:]
    instances: dict[bytes, AgentInstance] = {}
    bad: list[str] = []
    for name, value in zip(pairs[::2], pairs[1::2], strict=True):
        try:
            instances[_epoch(name)] = _instance(value)
        except WireError as exc:
            bad.append(f"field {name!r}: {exc.reason}")
    conflict, stale = judge(instances, heartbeat_at)
    return WorkerInstances(conflict, stale, max(0, count - len(pairs) // 2), tuple(bad))


def _epoch(name: bytes | None) -> bytes:
    """A field's name as read (None: longer than ``MAX_INSTANCE_BYTES``, not sent)."""
    if name is None:
        raise WireError(f"agent instance: a field name of more than {MAX_INSTANCE_BYTES} bytes")
    return name


def _instance(value: bytes | None) -> AgentInstance:
    """A field's value as read (None: longer than ``MAX_INSTANCE_BYTES``, not sent)."""
    if value is None:
        raise WireError(f"agent instance: more than {MAX_INSTANCE_BYTES} bytes")
    return AgentInstance.from_field(value)


class InstanceConflicts:
    """The leader's care of the instances hashes, after each listing of the agents: the
    stale fields it found removed (so a worker that crashes and restarts over and over
    cannot grow its hash while a process beats), and each worker's count said once when
    it rises (a warning) and once when it falls (a note), for ``max_workers`` workers at
    most."""

    def __init__(self, client: RedisClient, keys: Keys, max_workers: int | None = None) -> None:
        self.r = client
        self.keys = keys
        self.flagged: dict[str, int] = {}
        """The workers found with several processes at the last listing, with the count."""
        self.told: ToldOnce[str] = ToldOnce(cap=max_workers)
        self._lock = threading.Lock()  # the job's thread, and a test's or operator's call

    def tend(self, listed: Mapping[str, WorkerInstances]) -> None:
        """Say what changed since the last listing, then remove the stale fields of
        ``listed`` (one round trip per shard; Redis's errors raise, and the next listing
        finds them again)."""
        with self._lock:
            flagged = {w: i.conflict for w, i in listed.items() if i.conflict}
            self._say(flagged)
            self.flagged = flagged
            self._prune({w: i.stale for w, i in listed.items() if i.stale})

    def _prune(self, stale: Mapping[str, Iterable[bytes]]) -> None:
        if not stale:  # processes that stop cleanly remove their own fields
            return
        pipe = self.r.pipeline(transaction=False)
        for worker, epochs in stale.items():
            pipe.hdel(self.keys.instances(worker), *epochs)
        pipe.execute()

    def _say(self, flagged: Mapping[str, int]) -> None:
        for worker, count in flagged.items():
            if self.told.first(worker):
                log.warning(
                    "worker id %r: %d agent processes beat under it at once (for over %d s, "
                    "by its instances hash): GET /v1/agents shows either one's heartbeat and "
                    "any events they send count as one worker's; give each replica its own "
                    "KVWISE_WORKER_ID (e.g. the pod's name)",
                    worker,
                    count,
                    GRACE_S,
                )
        for worker in self.flagged:
            if worker not in flagged and worker in self.told:
                self.told.forget(worker)
                log.info("worker id %r: no longer several agent processes beating under it", worker)

"""Tailing live worker streams into whole requests, read-only (``kvwise trace record``).

Owns ``choose_workers`` (which workers can be recorded, from their heartbeats: only an
agent that reports requests whole has requests that can be rebuilt), ``NewWorkers`` (the
heartbeats that appeared since, for a recording that takes on workers started after it did)
and ``StreamTail``: for each chosen worker, plain ``XREAD`` from the stream's newest entry on
(entries already there are not read; a worker added later is read from the recording's start
on), a bounded count of entries per read, each decoded and fed to that worker's
``RequestRebuilder`` (sampling every request), whose whole requests come back with their
category names. Entries that break the wire contract are skipped and counted. Entries gone
before they were read (trimmed by the controller or the agent's cap) are counted from the
gaps in each worker's batch sequence numbers (from the entry before the recording's start
on). While it reads, the tail keeps one short-lived key of its own, ``Keys.recording``
(``RecordingNotice``): the controller's ingest, seeing it, trims acknowledged entries only
once they are its ``stream_trim_grace_s`` old, so that the tail reads them too; without a
recording ingest trims at once and the streams hold nothing extra. It must never join or
touch the controller's consumer group, acknowledge, trim, delete or write anything else:
the controller and other readers see the streams exactly as before.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final, cast

from agent.runtime.connection import RedisClient
from agent.wire import AgentStatus, BatchLimits, Keys, WireError, decode_batch
from controlplane.service.agents import AgentReader
from controlplane.shadow.rebuild import CategoryTable, Rebuilt, RequestRebuilder
from controlplane.shadow.sampler import PrefixSampler

_Entry = tuple[bytes, dict[bytes, bytes]]
"""A stream entry as the client returns it: its id and its fields."""

NOTICE_TTL_S: Final = 15
"""Seconds the recording's notice lives unless renewed: a recorder killed outright stops
holding the controller's trims back this long after."""
NOTICE_RENEW_S: Final = 5.0
"""Seconds between renewals of the notice."""
MAX_WORKERS_READ: Final = 1024
"""Heartbeats ``choose_workers`` reads, at most (the workers named first), as many as a
controller ingests by default (``KVWISE_MAX_WORKERS``)."""
ENTRIES_PER_READ = 8
"""Stream entries one ``XREAD`` takes from one worker: at most this many times the largest
entry the decoder accepts (``BatchLimits.max_entry_bytes``, about 2.4 MiB) is held at once."""


@dataclass(frozen=True)
class WorkerChoice:
    """The workers to record and those left out, each list sorted."""

    record: list[str]
    not_whole: list[str]
    """Heartbeats that say their agent does not report requests whole."""
    missing: list[str]
    """Asked for by id, with no heartbeat under the prefix."""
    others: list[str] = field(default_factory=list)
    """Heartbeats of workers not asked for, where some were named (what is there instead)."""


def choose_workers(client: RedisClient, keys: Keys, wanted: Sequence[str] = ()) -> WorkerChoice:
    """The workers with a heartbeat (only ``wanted`` ones, if any are named), split by
    whether their requests can be rebuilt."""
    reader = AgentReader(client, keys, max_agents=MAX_WORKERS_READ)
    agents = {a.id: a for a in reader.read(preferred=wanted).agents}
    ids = list(dict.fromkeys(wanted)) if wanted else sorted(agents)
    live = [w for w in ids if w in agents]
    return WorkerChoice(
        record=sorted(w for w in live if agents[w].whole_requests),
        not_whole=sorted(w for w in live if not agents[w].whole_requests),
        missing=sorted(w for w in ids if w not in agents),
        others=sorted(w for w in agents if w not in ids),
    )


class NewWorkers:
    """Heartbeats that appeared since the last look. A look is one ``SCAN`` of the heartbeat
    keys and a read of only the keys not seen before (``AgentReader.statuses``: bounded in
    size): the workers already recorded or left out are not read again, so looking every few
    seconds costs next to nothing. At most ``MAX_WORKERS_READ`` workers are seen in all, as
    ``choose_workers`` reads; new heartbeat keys past them are counted (``not_read``), not
    read."""

    def __init__(self, client: RedisClient, keys: Keys, seen: Sequence[str]) -> None:
        self.keys = keys
        self.reader = AgentReader(client, keys, max_agents=MAX_WORKERS_READ)
        self._seen = {keys.agent(w).encode() for w in seen}
        self.not_read = 0
        """New heartbeat keys found at the last look past ``MAX_WORKERS_READ`` seen."""

    def look(self) -> WorkerChoice:
        """The workers whose heartbeat is new, split as ``choose_workers`` splits them (an
        unreadable one is looked at again next time: its agent may rewrite it)."""
        room = max(MAX_WORKERS_READ - len(self._seen), 0)
        fresh, self.not_read = self.reader.first_keys(excluded=self._seen, limit=room)
        agents = []
        for key, status in zip(fresh, self.reader.statuses(fresh), strict=True):
            if isinstance(status, AgentStatus):  # not expired since the SCAN, nor unreadable
                agents.append(status)
                self._seen.add(key)
        return WorkerChoice(
            record=sorted(a.id for a in agents if a.whole_requests),
            not_whole=sorted(a.id for a in agents if not a.whole_requests),
            missing=[],
        )


@dataclass(frozen=True)
class RecordedRequest:
    """One whole request: its time, category name and block hashes."""

    ts: float
    category: str
    blocks: list[int]


@dataclass
class TailCounts:
    """What the tail has seen so far."""

    entries: int = 0
    requests: int = 0
    incomplete: int = 0
    """Runs of events that made no whole request (events lost, or a request cut by the
    start or end of the recording)."""
    bad_entries: int = 0
    """Entries skipped because they break the wire contract (another release, corrupt)."""
    bad_reasons: list[str] = field(default_factory=list)
    """The first few reasons, one per line."""
    trimmed: int = 0
    """Entries gone before they were read: the gaps in the workers' sequence numbers."""


@dataclass(frozen=True)
class _Position:
    """Where a worker's sequence stood at the last entry read: its agent's epoch and the
    batch's sequence number (``("", 0)``: nothing before, the next is an epoch's first)."""

    epoch: str
    seq: int

    def missed(self, after: _Position) -> int:
        """Entries missing between this one and the one ``after`` it."""
        if after.epoch != self.epoch:
            return max(after.seq - 1, 0)  # an agent's new epoch starts at 1
        return max(after.seq - self.seq - 1, 0)


_NOTHING_BEFORE = _Position("", 0)


def _position(fields: dict[bytes, bytes]) -> _Position | None:
    """An entry's place in its worker's sequence; None if its fields do not say it."""
    try:
        return _Position(fields[b"e"].decode(), int(fields[b"s"]))
    except (KeyError, ValueError):
        return None


class RecordingNotice:
    """``Keys.recording``, set while a recording reads (renewed every ``NOTICE_RENEW_S``,
    expiring after ``NOTICE_TTL_S``), removed at its end unless another recording has
    renewed it since (each writes its own token)."""

    def __init__(self, client: RedisClient, keys: Keys) -> None:
        self.r = client
        self.key = keys.recording
        self.token = uuid.uuid4().hex.encode()
        self._renew_at = 0.0

    def renew(self) -> None:
        """Set the notice again, when due."""
        if time.monotonic() >= self._renew_at:
            self.r.set(self.key, self.token, ex=NOTICE_TTL_S)
            self._renew_at = time.monotonic() + NOTICE_RENEW_S

    def withdraw(self) -> None:
        if self.r.get(self.key) == self.token:
            self.r.delete(self.key)


class StreamTail:
    """Reads ``workers``' event streams from their newest entry on, into whole requests."""

    def __init__(
        self,
        client: RedisClient,
        keys: Keys,
        workers: Sequence[str],
        limits: BatchLimits | None = None,
    ) -> None:
        self.r = client
        self.keys = keys
        self.limits = limits or BatchLimits()
        self.table = CategoryTable()
        self._sampler = PrefixSampler(1.0)  # every request: a trace, not a sample
        # Said before the start is read: an entry after the start was added, read by ingest
        # and committed after the notice was set, and so keeps its grace.
        self.notice = RecordingNotice(client, keys)
        self.notice.renew()
        self._started = self._now_id()
        self._rebuilders = {w: RequestRebuilder(self._sampler, self.table) for w in workers}
        self._last: dict[str, bytes] = {}
        self._positions: dict[str, _Position] = {}
        for worker in workers:
            self._start_at(worker, b"+")
        self.counts = TailCounts()

    @property
    def workers(self) -> list[str]:
        """The workers read, in the order they were added."""
        return list(self._rebuilders)

    def add(self, worker: str) -> None:
        """Read ``worker``'s stream too, from the tail's start on: a worker noticed some
        seconds after it started loses none of the requests it sent meanwhile, and one whose
        stream outlived an earlier run of it is not read from before the recording."""
        self._rebuilders[worker] = RequestRebuilder(self._sampler, self.table)
        self._start_at(worker, self._started)

    def _now_id(self) -> bytes:
        """A stream id at Redis's clock now (``XREAD`` reads the entries after it). A cluster
        answers for each node: the earliest, so that no node's newer entry is missed."""
        reply = cast(tuple[int, int] | dict[str, tuple[int, int]], self.r.time())
        seconds, micros = min(reply.values()) if isinstance(reply, dict) else reply
        return f"{seconds * 1000 + micros // 1000}-0".encode()

    def _start_at(self, worker: str, newest: bytes) -> None:
        """Read ``worker``'s stream after its last entry up to ``newest`` (``+``: the newest
        of all; none: from the start), whose place in the sequence is where gaps are counted
        from: unknown if its fields do not say it, or if there is none but the stream exists
        (trimmed empty: its agent may be at any number); no stream: the next entry is its
        agent's first."""
        stream = self.keys.events_stream(worker)
        before = cast(list[_Entry], self.r.xrevrange(stream, max=newest, count=1))
        self._last[worker] = before[0][0] if before else b"0-0"
        if before:
            position = _position(before[0][1])
        else:
            position = None if self.r.exists(stream) else _NOTHING_BEFORE
        if position is not None:
            self._positions[worker] = position

    def poll(self) -> list[RecordedRequest]:
        """One read of every worker's stream: the requests its new entries complete (the
        last run of each worker is held until the next poll, or ``finish``)."""
        self.notice.renew()
        out: list[RecordedRequest] = []
        for worker, rebuilder in self._rebuilders.items():
            stream = self.keys.events_stream(worker)
            reply = self.r.xread({stream: self._last[worker]}, count=ENTRIES_PER_READ)
            for _, entries in cast(list[tuple[bytes, list[_Entry]]], reply or []):
                for entry_id, fields in entries:
                    self._last[worker] = entry_id
                    self._count_gap(worker, fields)
                    out += self._entry(worker, rebuilder, fields)
        return out

    def finish(self) -> list[RecordedRequest]:
        """The requests of every run still held (the end of the recording); the notice
        is withdrawn."""
        self.notice.withdraw()
        out: list[RecordedRequest] = []
        for rebuilder in self._rebuilders.values():
            out += self._requests(rebuilder.flush())
        return out

    def _count_gap(self, worker: str, fields: dict[bytes, bytes]) -> None:
        """Counts the entries missing between the last one read and this one."""
        position = _position(fields)
        if position is None:
            return  # a bad entry: counted as such
        last = self._positions.get(worker)
        if last is not None:
            self.counts.trimmed += last.missed(position)
            if last.epoch == position.epoch and position.seq <= last.seq:
                return  # a batch resent by its agent: the sequence stays where it was
        self._positions[worker] = position

    def _entry(
        self, worker: str, rebuilder: RequestRebuilder, fields: dict[bytes, bytes]
    ) -> list[RecordedRequest]:
        self.counts.entries += 1
        try:
            batch = decode_batch(fields, self.limits)
        except WireError as exc:
            self.counts.bad_entries += 1
            if len(self.counts.bad_reasons) < 3:
                self.counts.bad_reasons.append(f"{worker}: {exc.reason}")
            return []
        return self._requests(rebuilder.feed(batch))

    def _requests(self, rebuilt: Rebuilt) -> list[RecordedRequest]:
        self.counts.requests += rebuilt.requests
        self.counts.incomplete += rebuilt.incomplete
        names = self.table.names
        return [RecordedRequest(r.ts, names[r.category], r.blocks) for r in rebuilt.sampled]

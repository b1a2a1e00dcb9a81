"""Bounded reads and atomic commits of worker event streams, done inside Redis (Lua).

Owns the two scripts ingest runs per worker stream. ``read``: take up to ``count`` entries
(new ones with ``XREADGROUP``, or those idle in other consumers' hands with ``XAUTOCLAIM``)
one at a time, measuring each in Redis: an entry larger than ``max_entry_bytes`` comes back
as a stub (its size and a bounded prefix), never whole, and the read stops once it holds
``budget_bytes``, so no entry and no read can flood the controller's memory. ``commit``:
acknowledge, delete refused entries, trim what the group has acknowledged and is older than
the grace it is given by Redis's clock (``XTRIM MINID``: nothing unread or pending is ever
trimmed, and other plain readers of the stream, such as ``kvwise trace record``, have that
long to read an entry after ingest did) and write the worker's ledger whole, over whatever
the key held (another type, fields written by another hand), in one call on one
shard (the stream and the ledger share the worker's hash tag). Acknowledge and trim come
first, so that a Redis out of memory still frees the memory ingest can free.

It must never decode or judge entries (``controlplane.service.ingest_judge`` does).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from agent.runtime.connection import RedisClient

Fields = dict[bytes, bytes]

OVERSIZE: Final = b"_oversize"
"""Field of a stub standing for an entry over ``max_entry_bytes`` (value: its bytes)."""
PREFIX: Final = b"_prefix"
"""Field of a stub: ``name=value`` pairs of the entry, cut at ``prefix_bytes``."""
DELETED: Final = b"_deleted"
"""Field of a stub standing for an entry deleted while it was pending."""

_READ = """
local stream, group, consumer, mode = KEYS[1], ARGV[1], ARGV[2], ARGV[3]
local count, max_entry = tonumber(ARGV[4]), tonumber(ARGV[5])
local budget, prefix, idle, cursor = tonumber(ARGV[6]), tonumber(ARGV[7]), ARGV[8], ARGV[9]
local out, total = {}, 0
local function stub(fields, size)
  local parts, left = {}, prefix
  for i = 1, #fields, 2 do
    if left <= 0 then break end
    local piece = string.sub(fields[i] .. '=' .. string.sub(fields[i + 1], 1, left), 1, left)
    parts[#parts + 1] = piece
    left = left - #piece - 1
  end
  return {'_oversize', tostring(size), '_prefix', table.concat(parts, ' ')}
end
local function take(id, fields)
  if not fields then
    out[#out + 1] = {id, {'_deleted', '1'}}
    return
  end
  local size = 0
  for i = 1, #fields do size = size + #fields[i] end
  if size > max_entry then
    out[#out + 1] = {id, stub(fields, size)}
    total = total + prefix
  else
    out[#out + 1] = {id, fields}
    total = total + size
  end
end
for _ = 1, count do
  if mode == 'new' then
    local reply = redis.call('XREADGROUP', 'GROUP', group, consumer, 'COUNT', 1,
                             'STREAMS', stream, '>')
    if not reply then break end
    local entry = reply[1][2][1]
    take(entry[1], entry[2])
  else
    local reply = redis.call('XAUTOCLAIM', stream, group, consumer, idle, cursor,
                             'COUNT', 1, 'JUSTID')
    cursor = reply[1]
    local id = reply[2][1]
    if id then
      local found = redis.call('XRANGE', stream, id, id)[1]
      take(id, found and found[2])
    end
    if cursor == '0-0' then break end
  end
  if total >= budget then break end
end
return {cursor, out}
"""

_COMMIT = """
local stream, ledger, group = KEYS[1], KEYS[2], ARGV[1]
local job, grace = cjson.decode(ARGV[2]), tonumber(ARGV[3])
if #job.ack > 0 then redis.call('XACK', stream, group, unpack(job.ack)) end
if #job.delete > 0 then redis.call('XDEL', stream, unpack(job.delete)) end
local floor
local pending = redis.call('XPENDING', stream, group)
if tonumber(pending[1]) > 0 then
  floor = pending[2]
else
  for _, g in ipairs(redis.call('XINFO', 'GROUPS', stream)) do
    local info = {}
    for i = 1, #g, 2 do info[g[i]] = g[i + 1] end
    if info['name'] == group then
      local ms, seq = string.match(info['last-delivered-id'], '(%d+)-(%d+)')
      floor = ms .. '-' .. string.format('%d', tonumber(seq) + 1)
    end
  end
end
local trimmed = 0
if floor then
  local now = redis.call('TIME')
  local cutoff = math.max(tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000) - grace, 0)
  if tonumber(string.match(floor, '^(%d+)')) > cutoff then
    floor = string.format('%d', cutoff) .. '-0'
  end
  trimmed = redis.call('XTRIM', stream, 'MINID', floor)
end
if next(job.ledger) then
  local flat = {}
  for name, value in pairs(job.ledger) do
    flat[#flat + 1] = name
    flat[#flat + 1] = value
  end
  redis.call('UNLINK', ledger)
  redis.call('HSET', ledger, unpack(flat))
end
return trimmed
"""


@dataclass(frozen=True)
class ReadLimits:
    """How much one ``read`` may bring into the controller."""

    count: int
    """Entries per stream per read."""
    max_entry_bytes: int
    """Larger entries come back as a stub."""
    budget_bytes: int
    """A read of one stream stops once it holds this much."""
    prefix_bytes: int = 1024
    """Bytes of a stub's ``name=value`` prefix."""


@dataclass
class StreamRead:
    """What one read of one stream returned."""

    stream: bytes
    entries: list[tuple[bytes, Fields]]
    cursor: bytes = b"0-0"
    """Where the next ``claim`` of this stream goes on (``0-0``: from the start)."""
    no_group: bool = False
    """The stream or its group is gone (deleted, or Redis restarted empty)."""


@dataclass
class Commit:
    """What to write for one stream after its entries were handled."""

    ack: list[bytes] = field(default_factory=list)
    delete: list[bytes] = field(default_factory=list)
    ledger: dict[str, str] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.ack or self.delete or self.ledger)


@dataclass
class Committed:
    """What one ``StreamIO.commit`` did: entries trimmed, and the streams whose commit
    failed (their entries stay pending, to be judged again), with why."""

    trimmed: int = 0
    failed: dict[bytes, Exception] = field(default_factory=dict)


class StreamIO:
    """Runs the read and commit scripts for ``group``/``consumer`` (pipelined per call);
    ``commit`` trims acknowledged entries once they are ``grace_ms`` old."""

    def __init__(self, client: RedisClient, *, group: str, consumer: str) -> None:
        self.r = client
        self.group = group
        self.consumer = consumer

    def read(
        self,
        streams: Sequence[bytes],
        limits: ReadLimits,
        *,
        mode: Literal["new", "claim"] = "new",
        min_idle_ms: int = 0,
        cursors: Mapping[bytes, bytes] | None = None,
    ) -> list[StreamRead]:
        """One bounded read of each stream (one round trip per shard)."""
        if not streams:
            return []
        pipe = self.r.pipeline(transaction=False)
        for stream in streams:
            cursor = (cursors or {}).get(stream, b"0-0")
            # execute_command: a cluster pipeline routes EVAL by its key, but has no eval().
            pipe.execute_command(
                "EVAL",
                _READ,
                1,
                stream,
                *(self.group, self.consumer, mode, limits.count, limits.max_entry_bytes),
                *(limits.budget_bytes, limits.prefix_bytes, min_idle_ms, cursor),
            )
        replies = pipe.execute(raise_on_error=False)
        return [_parsed(s, reply) for s, reply in zip(streams, replies, strict=True)]

    def commit(
        self,
        ledger_keys: Mapping[bytes, str | bytes],
        commits: Mapping[bytes, Commit],
        grace_ms: int = 0,
    ) -> Committed:
        """Apply ``commits`` (stream -> what to write), trimming acknowledged entries once
        ``grace_ms`` old. Each stream's commit stands alone: one that fails leaves the
        others done (``Committed.failed``)."""
        pipe = self.r.pipeline(transaction=False)
        for stream, job in commits.items():
            payload = json.dumps(
                {"ack": _texts(job.ack), "delete": _texts(job.delete), "ledger": job.ledger}
            )
            pipe.execute_command(
                "EVAL",
                _COMMIT,
                2,
                *(stream, ledger_keys[stream], self.group, payload, grace_ms),
            )
        replies = pipe.execute(raise_on_error=False)
        done = Committed()
        for stream, reply in zip(commits, replies, strict=True):
            if isinstance(reply, Exception):
                done.failed[stream] = reply
            else:
                done.trimmed += int(reply)
        return done


def _texts(ids: Iterable[bytes]) -> list[str]:
    return [i.decode() for i in ids]


def _parsed(stream: bytes, reply: Any) -> StreamRead:
    if isinstance(reply, Exception):
        if "NOGROUP" in str(reply):
            return StreamRead(stream, [], no_group=True)
        raise reply
    cursor, raw = reply
    entries = []
    for entry_id, flat in raw:
        entries.append((entry_id, dict(zip(flat[::2], flat[1::2], strict=True))))
    return StreamRead(stream, entries, cursor)

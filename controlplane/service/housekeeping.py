"""Housekeeping of the worker streams, so that Redis holds only what is still of use.

Owns two removals, run by the leader's ingest thread every ``interval_s``: a worker whose
stream got no entry for ``worker_expire_s``, whose heartbeat has expired and whose stream
holds nothing unread or pending (every entry read by the group and acknowledged; ingest
leaves the last ones untrimmed for a grace period) is gone: its stream and its ledger are
deleted (a worker restarted with the default ``host-pid`` id is a new worker, and the old
one's keys would stay for ever); and a consumer of the group other than this one, idle for
``stale_consumer_s`` with nothing pending, is deleted (each controller process joins as a
new consumer). Acknowledged entries are trimmed by ingest itself (``stream_io``). It must
never touch an entry that is unread or pending: the sweep judges a stream from its XINFO,
and one script then checks again, in the call that deletes, that the stream's newest id is
still the one judged, that the group has read it and holds nothing pending, and that no
heartbeat is there (the stream, heartbeat and ledger share the worker's hash tag, so this
is one call on one shard), so a worker restarting under the same id in between keeps its
stream and the batch it just added.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agent.runtime.connection import RedisClient
from agent.wire import Keys, WireError

if TYPE_CHECKING:
    from controlplane.service.settings import ControllerSettings

log = logging.getLogger(__name__)

_DELETE_IF_GONE = """
local stream, heartbeat, ledger = KEYS[1], KEYS[2], KEYS[3]
local group, judged = ARGV[1], ARGV[2]
if heartbeat and redis.call('EXISTS', heartbeat) == 1 then return 0 end
if redis.call('TYPE', stream).ok ~= 'stream' then return 0 end
local function fields(flat)
  local t = {}
  for i = 1, #flat, 2 do t[flat[i]] = flat[i + 1] end
  return t
end
local info = fields(redis.call('XINFO', 'STREAM', stream))
if info['last-generated-id'] ~= judged then return 0 end
for _, g in ipairs(redis.call('XINFO', 'GROUPS', stream)) do
  local read = fields(g)
  if read['name'] == group then
    local unread = read['last-delivered-id'] ~= judged and info['length'] > 0
    if unread or read['pending'] > 0 then return 0 end
    redis.call('DEL', stream)
    if ledger then redis.call('DEL', ledger) end
    return 1
  end
end
return 0
"""
"""Deletes a stream (and its worker's ledger) only if, at this moment, its newest id is
still ``judged``, ``group`` has read every entry and holds none pending, and the worker's
heartbeat is absent. KEYS: the stream, then the worker's heartbeat and ledger (neither for
a stream whose key names no worker); ARGV: the group, the judged newest id."""


@dataclass(frozen=True)
class HousekeepingSettings:
    """When the sweeps run and what they remove: ``from_settings`` takes them from the
    controller's settings, where each is defaulted and documented."""

    interval_s: float
    worker_expire_s: float
    stale_consumer_s: float

    @classmethod
    def from_settings(cls, settings: ControllerSettings) -> HousekeepingSettings:
        return cls(
            interval_s=settings.housekeeping_interval_s,
            worker_expire_s=settings.worker_expire_s,
            stale_consumer_s=settings.stale_consumer_s,
        )


@dataclass
class Swept:
    """What one round removed."""

    workers: list[str] = field(default_factory=list)
    consumers: int = 0


class Housekeeper:
    """Removes dead workers' streams and ledgers, and stale consumers of ``group``."""

    def __init__(
        self,
        client: RedisClient,
        keys: Keys,
        *,
        group: str,
        consumer: str,
        settings: HousekeepingSettings,
    ) -> None:
        self.r = client
        self._delete_if_gone = client.register_script(_DELETE_IF_GONE)
        self.keys = keys
        self.group = group
        self.consumer = consumer
        self.settings = settings

    def sweep(self, streams: Sequence[bytes], now: float | None = None) -> Swept:
        """One round over ``streams``."""
        now = time.time() if now is None else now
        swept = Swept()
        if not streams:
            return swept
        pipe = self.r.pipeline(transaction=False)
        for stream in streams:
            pipe.xinfo_stream(stream)
            pipe.xinfo_consumers(stream, self.group)
            pipe.xinfo_groups(stream)
        replies = pipe.execute(raise_on_error=False)
        for i, stream in enumerate(streams):
            info, consumers, groups = replies[3 * i : 3 * i + 3]
            if any(isinstance(reply, Exception) for reply in (info, consumers, groups)):
                continue  # gone already, or no group yet: nothing to sweep
            swept.consumers += self._drop_stale_consumers(stream, consumers)
            info["unread"] = self._unread(info, groups)
            worker = self._expired_worker(stream, info, consumers, now)
            if worker is not None:
                swept.workers.append(worker)
        return swept

    def _drop_stale_consumers(self, stream: bytes, consumers: list[dict[str, Any]]) -> int:
        dropped = 0
        for c in consumers:
            name = _text(c["name"])
            idle_s = int(c["idle"]) / 1000
            if (
                name == self.consumer
                or int(c["pending"])
                or idle_s < self.settings.stale_consumer_s
            ):
                continue
            self.r.xgroup_delconsumer(stream, self.group, name)
            log.info(
                "removed consumer %s of %s (idle %.0f s, nothing pending)",
                name,
                _text(stream),
                idle_s,
            )
            dropped += 1
        return dropped

    def _unread(self, info: dict[str, Any], groups: list[dict[str, Any]]) -> bool:
        """Whether the stream holds an entry the group has not read: any entry, if the
        group has not read up to the stream's newest id (or the group is unknown)."""
        newest = _text(info["last-generated-id"])
        for group in groups:
            if _text(group["name"]) == self.group:
                return _text(group["last-delivered-id"]) != newest and bool(int(info["length"]))
        return bool(int(info["length"]))

    def _expired_worker(
        self, stream: bytes, info: dict[str, Any], consumers: list[dict[str, Any]], now: float
    ) -> str | None:
        try:
            worker = self.keys.worker_of(stream)
        except WireError:
            worker = None
        newest = _text(info["last-generated-id"])
        idle_s = now - int(newest.split("-")[0]) / 1000
        pending = sum(int(c["pending"]) for c in consumers)
        if idle_s < self.settings.worker_expire_s or pending or info["unread"]:
            return None
        keys: list[bytes | str] = [stream]
        if worker is not None:
            keys += [self.keys.agent(worker), self.keys.ingest_state(worker)]
        if not self._delete_if_gone(keys=keys, args=[self.group, newest]):
            return None  # alive, only idle; or it wrote again since it was judged
        log.info(
            "expired worker %s: no entry for %.0f s, no heartbeat; its stream is deleted",
            worker or _text(stream),
            idle_s,
        )
        return worker or _text(stream)


def _text(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v

"""Reading workers' ledgers back from Redis, held to the bounds of what ingest writes.

Owns every read of a ledger, by ingest (``LedgerReader.read``) and by the agents' listing
(its counts: ``LedgerFields``): one script per ledger, in Redis, checks the key's type, its
field count (``MAX_HASH_FIELDS``) and each named field's size (``HSTRLEN`` against
``hash_field_bytes``) before it reads those fields (``HMGET``, never the whole hash), so a
ledger filled by another hand (a million fields, a value of megabytes, a key of another
type) is refused unread, whatever is written beside the check. For ingest a ledger
refused, or one that does not parse, reads as missing: ingest starts the worker's ledger
again, and its next commit replaces the key whole (``stream_io``). Each refusal is logged
with its key and reason, once until that key reads well again, and counted
(``kvwise_ingest_ledgers_refused``). It must never write to Redis, nor judge or apply
entries.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from agent.runtime.connection import RedisClient
from agent.wire import Keys
from controlplane.service.ledger import (
    HASH_FIELDS,
    MAX_HASH_FIELDS,
    MAX_OUT_OF_ORDER,
    WorkerLedger,
    hash_field_bytes,
)
from controlplane.service.metrics import ControllerMetrics
from controlplane.told_once import ToldOnce

log = logging.getLogger(__name__)

_READ = """
local key, max_fields = KEYS[1], tonumber(ARGV[1])
local kind = redis.call('TYPE', key)['ok']
if kind == 'none' then return {'ok'} end
if kind ~= 'hash' then return {'refused', 'a ' .. kind .. ', not a hash'} end
local count = redis.call('HLEN', key)
if count > max_fields then
  return {'refused', count .. ' fields > limit ' .. max_fields .. ' (not read)'}
end
local names = {}
for i = 2, #ARGV, 2 do
  local size, limit = redis.call('HSTRLEN', key, ARGV[i]), tonumber(ARGV[i + 1])
  if size > limit then
    return {'refused', ARGV[i] .. ': ' .. size .. ' bytes > limit ' .. limit .. ' (not read)'}
  end
  names[#names + 1] = ARGV[i]
end
return {'ok', redis.call('HMGET', key, unpack(names))}
"""


class LedgerFields:
    """Reads the fields ``names`` of workers' ledgers within their bounds (a ledger of
    ``max_out_of_order`` tracked numbers)."""

    def __init__(
        self,
        client: RedisClient,
        keys: Keys,
        names: Sequence[str] = HASH_FIELDS,
        max_out_of_order: int = MAX_OUT_OF_ORDER,
    ) -> None:
        self.r = client
        self.keys = keys
        self.names = tuple(names)
        bounds = hash_field_bytes(max_out_of_order)
        self._args = [MAX_HASH_FIELDS, *(x for f in self.names for x in (f, bounds[f]))]

    def read(self, workers: Sequence[str]) -> list[dict[bytes, bytes] | ValueError]:
        """The fields of each of ``workers``' ledgers that are stored (none for a missing
        ledger), or a ``ValueError`` saying why the ledger was refused unread; one round
        trip per shard. Redis's own errors raise."""
        if not workers:
            return []
        pipe = self.r.pipeline(transaction=False)
        for worker in workers:
            # execute_command: a cluster pipeline routes EVAL by its key, but has no eval().
            pipe.execute_command("EVAL", _READ, 1, self.keys.ingest_state(worker), *self._args)
        return [self._fields(reply) for reply in pipe.execute()]

    def _fields(self, reply: list[Any]) -> dict[bytes, bytes] | ValueError:
        if reply[0] != b"ok":
            return ValueError(reply[1].decode())
        values = reply[1] if len(reply) > 1 else [None] * len(self.names)  # no key
        return {f.encode(): v for f, v in zip(self.names, values, strict=True) if v is not None}


class LedgerReader:
    """Reads workers' ledgers of ``max_out_of_order`` tracked numbers within their bounds,
    counting each one refused in ``metrics`` (if any) and in ``refused``."""

    def __init__(
        self,
        client: RedisClient,
        keys: Keys,
        max_out_of_order: int = MAX_OUT_OF_ORDER,
        metrics: ControllerMetrics | None = None,
    ) -> None:
        self.keys = keys
        self.max_out_of_order = max_out_of_order
        self.metrics = metrics
        self.refused = 0
        """Ledgers refused by this reader, each read counted."""
        self._told: ToldOnce[str] = ToldOnce()
        self._fields = LedgerFields(client, keys, HASH_FIELDS, max_out_of_order)

    def read(self, workers: Sequence[str]) -> dict[str, WorkerLedger]:
        """The ledger of each of ``workers`` (one round trip per shard); a new one for a
        worker whose ledger is missing or refused."""
        raws = self._fields.read(workers)
        return {w: self._ledger(w, raw) for w, raw in zip(workers, raws, strict=True)}

    def _ledger(self, worker: str, raw: dict[bytes, bytes] | ValueError) -> WorkerLedger:
        """``worker``'s ledger from its fields ``raw``; a new one if it was refused."""
        key = self.keys.ingest_state(worker)
        try:
            if isinstance(raw, ValueError):
                raise raw
            ledger = WorkerLedger.from_hash(worker, raw, self.max_out_of_order)
        except ValueError as exc:
            self.refused += 1
            if self.metrics:
                self.metrics.ledgers_refused.inc()
            if self._told.first(key):
                log.warning("ledger %s refused (%s): ingest starts it again", key, exc)
            return WorkerLedger(worker, self.max_out_of_order)
        self._told.forget(key)
        return ledger

    def forget(self, worker: str) -> None:
        """``worker`` is gone (its stream expired): a refusal of its ledger is news again."""
        self._told.forget(self.keys.ingest_state(worker))

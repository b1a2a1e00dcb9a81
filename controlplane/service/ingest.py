"""Ingest: every worker's event stream -> decode -> apply -> acknowledge.

Owns the consumer group over all ``events:*`` streams (new workers discovered by SCAN),
reclaiming entries a dead consumer left pending (``XAUTOCLAIM``), per-worker sequence
gap accounting, and the dead-letter stream for undecodable batches. An entry is
acknowledged only after ``apply`` returned, so a crash re-delivers instead of losing.
If Redis restarts and forgets the group, the group is recreated on the next pass.

It must never fit or publish, and never holds more than one read's entries in memory.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import cast

import redis

from agent.wire import EventBatch, Keys, WireError, decode_batch
from controlplane.service.metrics import ControllerMetrics

log = logging.getLogger(__name__)

ApplyFn = Callable[[EventBatch], None]
Entry = tuple[bytes, dict[bytes, bytes]]
DEAD_LETTER_MAXLEN = 10_000


MAX_OUT_OF_ORDER = 4096
"""Sequence numbers tracked above the first gap; past this, the oldest gap is written off."""


@dataclass
class _Sequence:
    """Sequence accounting of one worker epoch: which batches arrived, which are missing.

    ``floor``: every batch up to it arrived (or was written off as ``lost``); ``above``:
    batches that arrived beyond the first gap. Memory is bounded by ``MAX_OUT_OF_ORDER``.
    """

    floor: int = 0
    above: set[int] = field(default_factory=set)
    lost: int = 0

    def add(self, seq: int) -> bool:
        """Record ``seq``; False if it arrived before (a resent batch: do not apply twice)."""
        if seq <= self.floor or seq in self.above:
            return False
        self.above.add(seq)
        if len(self.above) > MAX_OUT_OF_ORDER:
            low = min(self.above)
            self.lost += low - self.floor - 1
            self.floor = low - 1
        while self.floor + 1 in self.above:
            self.floor += 1
            self.above.discard(self.floor)
        return True

    @property
    def missing(self) -> int:
        top = max(self.above, default=self.floor)
        return self.lost + (top - self.floor - len(self.above))


@dataclass
class IngestCounters:
    events: int = 0
    batches: int = 0
    dead_letters: int = 0
    reclaimed: int = 0
    duplicates: int = 0
    gaps: dict[str, int] = field(default_factory=dict)
    last_error: str = ""


class Ingestor:
    """Consumes event batches as ``consumer`` in ``group``; run it in one thread."""

    def __init__(
        self,
        client: redis.Redis,
        keys: Keys,
        apply: ApplyFn,
        *,
        group: str,
        consumer: str,
        count: int = 64,
        block_ms: int = 500,
        reclaim_idle_ms: int = 30_000,
        metrics: ControllerMetrics | None = None,
    ) -> None:
        self.r = client
        self.keys = keys
        self.apply = apply
        self.group = group
        self.consumer = consumer
        self.count = count
        self.block_ms = block_ms
        self.reclaim_idle_ms = reclaim_idle_ms
        self.metrics = metrics
        self.counters = IngestCounters()
        self._streams: set[bytes] = set()
        self._seqs: dict[tuple[str, str], _Sequence] = {}
        self._last_discover = 0.0
        self._last_reclaim = 0.0

    # --- one pass ------------------------------------------------------------------------
    def discover(self) -> None:
        """Find worker streams and make sure the group exists on each."""
        for key in self.r.scan_iter(match=self.keys.events_match, count=500, _type="stream"):
            if key in self._streams:
                continue
            try:
                self.r.xgroup_create(key, self.group, id="0", mkstream=True)
            except redis.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise
            self._streams.add(key)
        self._last_discover = time.monotonic()

    def poll_once(self) -> int:
        """Read, apply and acknowledge one round; returns batches handled."""
        now = time.monotonic()
        if now - self._last_discover > 2.0 or not self._streams:
            self.discover()
        if not self._streams:
            return 0
        handled = 0
        if now - self._last_reclaim > self.reclaim_idle_ms / 2000:
            handled += self.reclaim()
        try:
            reply = self.r.xreadgroup(
                self.group,
                self.consumer,
                {s: ">" for s in self._streams},
                count=self.count,
                block=self.block_ms,
            )
        except redis.ResponseError as exc:
            if "NOGROUP" in str(exc):
                # Redis restarted (or the stream was deleted): rediscover and recreate.
                self._streams.clear()
                return handled
            raise
        for stream, entries in cast(list[tuple[bytes, list[Entry]]], reply or []):
            handled += self._handle(stream, entries)
        return handled

    def reclaim(self) -> int:
        """Take over entries other consumers left pending longer than the idle limit."""
        self._last_reclaim = time.monotonic()
        handled = 0
        for stream in list(self._streams):
            start = "0-0"
            while True:
                try:
                    # Redis 7 answers [next, entries, deleted ids]; Redis 6.2 [next, entries].
                    reply = self.r.xautoclaim(
                        stream,
                        self.group,
                        self.consumer,
                        self.reclaim_idle_ms,
                        start_id=start,
                        count=self.count,
                    )
                    nxt, entries = reply[0], reply[1]
                except redis.ResponseError as exc:
                    if "NOGROUP" in str(exc):
                        self._streams.discard(stream)
                        break
                    raise
                entries = [e for e in entries if e is not None and e[1] is not None]
                if entries:
                    self.counters.reclaimed += len(entries)
                    if self.metrics:
                        self.metrics.reclaimed.inc(len(entries))
                    handled += self._handle(stream, entries)
                if nxt in (b"0-0", "0-0"):
                    break
                start = nxt
        return handled

    def pending(self) -> int:
        total = 0
        for stream in list(self._streams):
            try:
                total += int(self.r.xpending(stream, self.group)["pending"])
            except redis.ResponseError:
                continue
        return total

    # --- entries -------------------------------------------------------------------------
    def _handle(self, stream: bytes, entries: Iterable[Entry]) -> int:
        done: list[bytes] = []
        n = 0
        for entry_id, fields in entries:
            try:
                batch = decode_batch(fields)
            except WireError as exc:
                self._dead_letter(stream, entry_id, fields, exc.reason)
                done.append(entry_id)
                continue
            seq = self._seqs.setdefault((batch.worker, batch.epoch), _Sequence())
            if not seq.add(batch.seq):
                # A pipeline resent after a timeout: it was applied the first time.
                self.counters.duplicates += 1
                done.append(entry_id)
                continue
            try:
                self.apply(batch)
            except Exception as exc:  # a bug in apply must not wedge the stream
                log.exception("applying batch %s of %s failed", entry_id, stream)
                self._dead_letter(stream, entry_id, fields, f"apply failed: {exc!r}")
                done.append(entry_id)
                continue
            self._account(batch)
            done.append(entry_id)
            n += 1
        if done:
            self.r.xack(stream, self.group, *done)
        return n

    def _account(self, batch: EventBatch) -> None:
        c = self.counters
        c.events += len(batch)
        c.batches += 1
        missing = sum(s.missing for (w, _), s in self._seqs.items() if w == batch.worker)
        c.gaps[batch.worker] = missing
        if self.metrics:
            m = self.metrics
            m.events.inc(len(batch))
            m.batches.inc()
            m.gaps.labels(worker=batch.worker).set(missing)
            if len(batch):
                m.ingest_lag.set(max(0.0, time.time() - float(batch.ts.max())))

    def _dead_letter(
        self, stream: bytes, entry_id: bytes, fields: dict[bytes, bytes], reason: str
    ) -> None:
        self.counters.dead_letters += 1
        if self.metrics:
            self.metrics.dead_letters.inc()
        log.warning("dead-lettered entry %s of %s: %s", entry_id, stream, reason)
        record: dict[bytes | str, bytes | str] = {
            "stream": stream,
            "id": entry_id,
            "reason": reason,
            "consumer": self.consumer,
        }
        for k, v in fields.items():
            record[b"f:" + (k if isinstance(k, bytes) else str(k).encode())] = v
        self.r.xadd(
            self.keys.dead_letter,
            record,  # type: ignore[arg-type]  # redis-py's field type is invariant
            maxlen=DEAD_LETTER_MAXLEN,
            approximate=True,
        )

    # --- loop ----------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        """Poll until ``stop`` is set; Redis outages back off and retry."""
        backoff = 0.1
        while not stop.is_set():
            try:
                if not self.poll_once() and not self._streams:
                    stop.wait(0.5)  # no worker has written yet: nothing to block on
                backoff = 0.1
                self.counters.last_error = ""
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                self.counters.last_error = f"redis unavailable: {exc}"
                self._streams.clear()
                stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)
            except Exception as exc:  # ingest must outlive any one bad pass
                self.counters.last_error = f"{type(exc).__name__}: {exc}"
                log.exception("ingest pass failed")
                stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)

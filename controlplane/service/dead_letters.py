"""The dead-letter stream: every refused entry recorded with its reason, its ids and a
bounded prefix of its payload, and told in the log without flooding it.

Owns ``DeadLetters``: it writes each pass's refusals after the pass's commit, best effort
(a Redis that refuses writes, out of memory, must not keep the commit from freeing what it
can: those not written are counted, and told once until one is written again), and logs
the first of a kind per stream each ``TELL_EVERY_S`` with the count of those not logged.
Also ``shown``, how the log writes a key or an entry id. It must never judge, acknowledge
or delete an entry (the ``Ingestor`` does).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Final

import redis

from agent.runtime.connection import RedisClient
from agent.wire import Keys
from controlplane.service.ingest_judge import IngestCounters, Refusal
from controlplane.service.metrics import ControllerMetrics
from controlplane.service.stream_io import PREFIX, Fields

log = logging.getLogger(__name__)

DEAD_LETTER_MAXLEN: Final = 10_000
DEAD_LETTER_PREFIX_BYTES: Final = 1024
TELL_EVERY_S: Final = 60.0
"""Dead letters of one kind from one stream are logged at most this often (all counted)."""


def shown(name: bytes) -> str:
    """A Redis key or entry id as the log shows it: text (bytes not UTF-8 escaped), never
    a bytes repr."""
    return name.decode(errors="backslashreplace")


@dataclass(eq=False)
class DeadLetters:
    """Writes and tells the refused entries of ``consumer``'s passes."""

    r: RedisClient
    keys: Keys
    consumer: str
    counters: IngestCounters
    """The process's totals (``Ingestor.counters``): dead letters written and not."""
    metrics: ControllerMetrics | None
    _unwritten_told: bool = field(default=False, init=False)
    _told: dict[tuple[bytes, str], tuple[float, int]] = field(default_factory=dict, init=False)

    def forget(self, stream: bytes) -> None:
        """Forget what was told of ``stream`` (its worker expired)."""
        for told in [k for k in self._told if k[0] == stream]:
            del self._told[told]

    def tell(self, stream: bytes, refusal: Refusal) -> None:
        """Log a dead letter: the first of a kind per stream each ``TELL_EVERY_S``, with the
        count of those not logged since (a flood of poison must not flood the log)."""
        key = (stream, refusal.label)
        now = time.monotonic()
        last, quiet = self._told.get(key, (-TELL_EVERY_S, 0))
        if now - last < TELL_EVERY_S:
            self._told[key] = (last, quiet + 1)
            return
        self._told[key] = (now, 0)
        more = f" ({quiet} more like it not logged)" if quiet else ""
        log.warning(
            "dead-lettered entry %s of %s: %s%s",
            shown(refusal.entry_id),
            shown(stream),
            refusal.reason,
            more,
        )

    def write(self, refusals: list[tuple[bytes, Refusal]]) -> None:
        pipe = self.r.pipeline(transaction=False)
        for stream, refusal in refusals:
            self.counters.dead_letters += 1
            if self.metrics:
                self.metrics.dead_letters.labels(reason=refusal.label).inc()
            self.tell(stream, refusal)
            record = {
                "stream": stream,
                "id": refusal.entry_id,
                "reason": refusal.reason[:1000],
                "consumer": self.consumer,
                "prefix": _prefix(refusal.fields, DEAD_LETTER_PREFIX_BYTES),
            }
            pipe.xadd(
                self.keys.dead_letter,
                record,  # type: ignore[arg-type]  # redis-py's field type is invariant
                maxlen=DEAD_LETTER_MAXLEN,
                approximate=True,
            )
        try:
            replies = pipe.execute(raise_on_error=False)
        except redis.RedisError as exc:
            replies = [exc] * len(refusals)
        self._count_unwritten([r for r in replies if isinstance(r, Exception)])

    def _count_unwritten(self, errors: list[Exception]) -> None:
        """Count the dead letters Redis refused; log once until one is written again."""
        if not errors:
            self._unwritten_told = False
            return
        self.counters.dead_letters_unwritten += len(errors)
        if self.metrics:
            self.metrics.dead_letters_unwritten.inc(len(errors))
        if not self._unwritten_told:
            self._unwritten_told = True
            log.warning(
                "%s dead letters not written (%s); their entries are acknowledged and deleted",
                f"{len(errors):,}",
                errors[0],
            )


def _prefix(fields: Fields, limit: int) -> bytes:
    """``name=value`` pairs of an entry, each value cut at 64 bytes, the whole at ``limit``."""
    if PREFIX in fields:
        return fields[PREFIX][:limit]
    parts = [k + b"=" + v[:64] for k, v in fields.items()]
    return b" ".join(parts)[:limit]

"""The controller's ledger of each worker: which batches arrived, which are missing, and
how many events were applied or refused, persisted so that a restart forgets nothing.

Owns ``SequenceTracker`` (per worker epoch: batches up to ``floor`` arrived or were written
off, ``above`` arrived past the first gap; memory bounded by ``max_out_of_order``) and
``WorkerLedger`` (the trackers of a worker's last few epochs plus its counts, and whether
several of those epochs write at once: ``id_conflict``), the counts
themselves (``EntryCounts``, also an ingest process's totals), with their flat form under
``Keys.ingest_state(worker)`` (``HASH_FIELDS``, each within ``hash_field_bytes``: the bounds
``ledger_reads`` reads it back within): ingest writes it in the same call that acknowledges
the entries it covers, so after a restart (or a new leader) sequence tracking and counts go
on where they were, and the gap gauge does not jump. Any replica reads it to answer
``/v1/agents``. It must never talk to Redis itself.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Final

from agent.wire import MAX_EPOCH_CHARS

MAX_OUT_OF_ORDER: Final = 4096
"""Default bound of sequence numbers tracked above the first gap; past it, the oldest gap
is written off as lost."""

EPOCHS_KEPT: Final = 4
"""Epochs (agent starts) tracked per worker; an older one's gaps are no longer shown."""

MAX_HASH_FIELDS: Final = 32
"""Fields a stored ledger may hold: ``to_hash`` writes ``len(HASH_FIELDS)`` (10), with room
for a later release's few more. A ledger holding more was written by another hand."""
NUMBER_BYTES: Final = 32
"""Bytes of one stored number at most: a count, ``updated_at`` or, in ``epochs``, one
sequence number with its separator (an agent's count from 1 stays far below 20 digits)."""
EPOCH_NAME_BYTES: Final = 2 * MAX_EPOCH_CHARS + 96
"""Bytes of one epoch's entry in ``epochs`` beside its numbers: the epoch, at most
``MAX_EPOCH_CHARS`` visible ASCII characters of 2 bytes each as JSON escapes them (a batch's
longer one is refused), and its tracker's keys and punctuation (under 96 bytes)."""
TRACKER_NUMBERS: Final = 4
"""Numbers of a stored tracker beside those above its floor: ``floor``, ``lost``,
``first_ms``, ``last_ms``."""

ID_CONFLICT_GRACE_MS: Final = 30_000
"""How long two epochs (agent starts) of one worker id may both write to its stream, by the
stream's clock (Redis's, in its entry ids), before they count as two processes sharing the
id (``WorkerLedger.id_conflict``): a restart's old epoch may still land its last batches
after the new one's first (an agent's ``close`` flushes for up to 10 s), not for this
long. It is also how recently an epoch must have written to count as writing now."""


@dataclass
class SequenceTracker:
    """Sequence accounting of one worker epoch: which batches arrived, which are missing."""

    max_out_of_order: int = MAX_OUT_OF_ORDER
    floor: int = 0
    above: set[int] = field(default_factory=set)
    lost: int = 0
    first_ms: int = 0
    """Stream time (Redis's clock, of the entry id) of the first batch recorded; 0: none
    yet (or a ledger stored before the field)."""
    last_ms: int = 0
    """Stream time of the last batch recorded (the latest, whatever the order read)."""

    def add(self, seq: int) -> bool:
        """Record ``seq``; False if it arrived before (a resent batch: do not apply twice)."""
        if seq <= self.floor or seq in self.above:
            return False
        self.above.add(seq)
        if len(self.above) > self.max_out_of_order:
            low = min(self.above)
            self.lost += low - self.floor - 1
            self.floor = low - 1
        while self.floor + 1 in self.above:
            self.floor += 1
            self.above.discard(self.floor)
        return True

    def wrote(self, at_ms: int) -> None:
        """A batch of this epoch entered the stream at ``at_ms`` (its entry id's time)."""
        self.first_ms = min(self.first_ms, at_ms) if self.first_ms else at_ms
        self.last_ms = max(self.last_ms, at_ms)

    def overlap_ms(self, other: SequenceTracker) -> int:
        """How long this epoch and ``other`` both wrote, by stream time (negative: never
        at once)."""
        return min(self.last_ms, other.last_ms) - max(self.first_ms, other.first_ms)

    @property
    def missing(self) -> int:
        top = max(self.above, default=self.floor)
        return self.lost + (top - self.floor - len(self.above))

    def to_json(self) -> dict[str, Any]:
        return {
            "floor": self.floor,
            "above": sorted(self.above),
            "lost": self.lost,
            "first_ms": self.first_ms,
            "last_ms": self.last_ms,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], max_out_of_order: int) -> SequenceTracker:
        return cls(
            max_out_of_order,
            int(data["floor"]),
            {int(s) for s in data["above"]},
            int(data["lost"]),
            int(data.get("first_ms", 0)),
            int(data.get("last_ms", 0)),
        )


@dataclass
class EntryCounts:
    """What ingest did with stream entries (events unless named otherwise), counted for
    one worker (``WorkerCounts``) or for a whole ingest process."""

    events: int = 0
    """Applied to the statistics window."""
    batches: int = 0
    clock_rejected: int = 0
    """Dropped: their time was outside ``clock_tolerance_s`` of the controller's clock."""
    dead_letters: int = 0
    """Entries dead-lettered, for any reason."""
    duplicates: int = 0
    """Batches received twice (a resent pipeline) and applied once."""


@dataclass
class WorkerCounts(EntryCounts):
    """What ingest did with one worker's entries."""

    refused: int = 0
    """In entries that decoded but broke a limit (dead-lettered)."""


HASH_FIELDS: Final = (
    *(f.name for f in fields(WorkerCounts)),
    "epochs",
    "missing",
    "id_conflict",
    "updated_at",
)
"""The fields ``WorkerLedger.to_hash`` writes, each of them every time."""


def hash_field_bytes(max_out_of_order: int) -> dict[str, int]:
    """The most bytes each of ``HASH_FIELDS`` holds as ``to_hash`` writes it: a count,
    ``NUMBER_BYTES``; ``epochs``, ``EPOCHS_KEPT`` trackers of ``max_out_of_order`` numbers
    above their floor (a tracker holds one more for a moment, never when stored)."""
    per_epoch = EPOCH_NAME_BYTES + (max_out_of_order + 1 + TRACKER_NUMBERS) * NUMBER_BYTES
    return {name: NUMBER_BYTES for name in HASH_FIELDS} | {"epochs": EPOCHS_KEPT * per_epoch}


@dataclass
class WorkerLedger:
    """One worker's trackers (last ``EPOCHS_KEPT`` epochs, least recent first) and counts."""

    worker: str
    max_out_of_order: int = MAX_OUT_OF_ORDER
    epochs: dict[str, SequenceTracker] = field(default_factory=dict)
    counts: WorkerCounts = field(default_factory=WorkerCounts)
    updated_at: float = 0.0
    id_conflict: int = 0
    """Epochs (agent starts) of this worker id writing at the same time, as of the newest
    batch recorded: each wrote within ``ID_CONFLICT_GRACE_MS`` of it and for longer than
    that beside another (``EPOCHS_KEPT`` + 1 while more write than are kept); 0 when none
    do. A restart is one epoch after another: 0."""
    crowded_ms: int = 0
    """Stream time at which an epoch that still wrote was pushed out of the kept ones (more
    epochs writing than are kept); 0: never. Not stored: the next push sets it again."""

    def see(self, epoch: str, seq: int, at_ms: int = 0) -> bool:
        """Record batch ``seq`` of ``epoch``, which entered the stream at ``at_ms`` (0: not
        known); False for a batch seen before."""
        tracker = self.epochs.pop(epoch, None) or SequenceTracker(self.max_out_of_order)
        self.epochs[epoch] = tracker  # most recent last
        while len(self.epochs) > EPOCHS_KEPT:
            pushed = self.epochs.pop(next(iter(self.epochs)))
            if at_ms and pushed.last_ms >= at_ms - ID_CONFLICT_GRACE_MS:
                self.crowded_ms = max(self.crowded_ms, at_ms)
        if not tracker.add(seq):
            return False
        if at_ms > 0:
            tracker.wrote(at_ms)
            self.id_conflict = self._writing_at_once()
        return True

    def settle(self, now_ms: int) -> bool:
        """No batch of any epoch since ``ID_CONFLICT_GRACE_MS`` before ``now_ms`` (Redis's
        clock): none writes any more, so none at once (the processes stopped, or an id
        fixed by a redeploy). True if ``id_conflict`` fell to 0 here."""
        if not self.id_conflict:
            return False
        newest = max((t.last_ms for t in self.epochs.values()), default=0)
        if now_ms - newest <= ID_CONFLICT_GRACE_MS:
            return False
        self.id_conflict = self.crowded_ms = 0
        return True

    def _writing_at_once(self) -> int:
        """The epochs writing at once now (``id_conflict``); a few comparisons a batch."""
        if len(self.epochs) < 2 and not self.crowded_ms:  # one agent, restarts forgotten
            return 0
        now = max(t.last_ms for t in self.epochs.values())
        if self.crowded_ms >= now - ID_CONFLICT_GRACE_MS:
            return EPOCHS_KEPT + 1
        live = [t for t in self.epochs.values() if t.last_ms >= now - ID_CONFLICT_GRACE_MS]
        if len(live) < 2:
            return 0
        return sum(
            any(t is not u and t.overlap_ms(u) > ID_CONFLICT_GRACE_MS for u in live) for t in live
        )

    @property
    def missing(self) -> int:
        """Batches missing over the kept epochs (the gap gauge)."""
        return sum(t.missing for t in self.epochs.values())

    def to_hash(self) -> dict[str, str]:
        """The flat form stored under ``Keys.ingest_state(worker)``."""
        self.updated_at = time.time()
        out = {f.name: str(getattr(self.counts, f.name)) for f in fields(WorkerCounts)}
        out["epochs"] = json.dumps({e: t.to_json() for e, t in self.epochs.items()})
        out["missing"] = str(self.missing)
        out["id_conflict"] = str(self.id_conflict)
        out["updated_at"] = repr(self.updated_at)
        return out

    @classmethod
    def from_hash(
        cls, worker: str, raw: Mapping[bytes, bytes], max_out_of_order: int = MAX_OUT_OF_ORDER
    ) -> WorkerLedger:
        """The ledger stored as ``raw`` (empty: a worker not seen before). ``ValueError``
        for a stored form this release cannot read, whatever is wrong with it."""
        try:
            return cls._read(worker, raw, max_out_of_order)
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
            raise ValueError(f"ledger of {worker}: {type(exc).__name__}: {exc}") from None

    @classmethod
    def _read(cls, worker: str, raw: Mapping[bytes, bytes], max_out_of_order: int) -> WorkerLedger:
        text = {k.decode(): v.decode() for k, v in raw.items()}
        ledger = cls(worker, max_out_of_order)
        if not text:
            return ledger
        for f in fields(WorkerCounts):
            setattr(ledger.counts, f.name, int(text.get(f.name, "0")))
        epochs = json.loads(text.get("epochs", "{}"))
        ledger.epochs = {
            e: SequenceTracker.from_json(t, max_out_of_order) for e, t in epochs.items()
        }
        ledger.updated_at = float(text.get("updated_at", "0"))
        ledger.id_conflict = int(text.get("id_conflict", "0"))
        return ledger

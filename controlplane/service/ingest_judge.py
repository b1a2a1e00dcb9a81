"""What each entry of a read becomes: applied to the window, a duplicate, or refused with
its reason; and the counts of each, in its worker's ledger and this process's totals.

Owns ``EntryJudge``: an entry deleted since it was read or over ``max_entry_bytes`` is
judged from its marker; else it is decoded within the limits, checked to come from the
stream's own worker, told to the worker's ledger with the entry's stream time (a sequence
number seen is a duplicate; epochs that write at once are two processes sharing the worker
id, gauged and said once per change: ``IdConflicts``), and applied (``ApplyFn``; a batch
refused or an exception there is a ``Refusal``, never a failed pass). It remembers the
pass's batches applied, and those applied whose commit failed (``uncommitted``):
re-delivered, they are counted, not applied again. Also ``IngestCounters``, the process's
totals. It must never read or write Redis (the ``Ingestor`` commits what it judged,
``DeadLetters`` writes the refusals), fit or publish.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from agent.wire import BatchLimits, EventBatch, WireError, WireLimitError, decode_batch
from controlplane.service.ledger import ID_CONFLICT_GRACE_MS, EntryCounts, WorkerLedger
from controlplane.service.metrics import DEAD_LETTER_REASONS, ControllerMetrics
from controlplane.service.stream_io import DELETED, OVERSIZE, PREFIX, Commit, Fields, StreamRead
from controlplane.service.window import BatchRefused
from controlplane.told_once import ToldOnce

log = logging.getLogger(__name__)

ApplyFn = Callable[[EventBatch], int]
"""Adds a batch to the statistics; returns the events it dropped for their clock; raises
``BatchRefused`` for a batch over a limit."""

DECODE, LIMIT, APPLY = DEAD_LETTER_REASONS
BatchId = tuple[str, str, int]
"""A batch as its worker's ledger knows it: worker, epoch, sequence number."""
MAX_APPLIED_UNCOMMITTED = 100_000
"""Batches remembered as in the window but not committed, at most (a pass holds far fewer)."""


@dataclass
class IngestCounters(EntryCounts):
    """This process's totals (the per-worker ones live in the ledgers)."""

    reclaimed: int = 0
    """Entries taken over from a consumer that stopped acknowledging."""
    trimmed: int = 0
    """Acknowledged entries trimmed from the streams."""
    dead_letters_unwritten: int = 0
    """Dead letters Redis refused to store (their entries were deleted all the same)."""
    gaps: dict[str, int] = field(default_factory=dict)


class IdConflicts:
    """Says when a worker's ledger finds several processes writing under its id
    (``WorkerLedger.id_conflict``): its gauge each pass, the log once per change (a warning
    when it starts, a note when it ends), for ``max_workers`` workers at most."""

    def __init__(self, metrics: ControllerMetrics | None, max_workers: int | None) -> None:
        self.metrics = metrics
        self.told: ToldOnce[str] = ToldOnce(cap=max_workers)

    def update(self, ledger: WorkerLedger) -> None:
        worker, n = ledger.worker, ledger.id_conflict
        if self.metrics:
            self.metrics.worker_id_conflict.labels(worker=worker).set(n)
        if n and self.told.first(worker):
            log.warning(
                "worker id %r: %d agent processes write events under it at once (each start "
                "is an epoch; these wrote side by side for over %d s): ingest counts their "
                "events as one worker's; give each replica its own KVWISE_WORKER_ID (e.g. "
                "the pod's name)",
                worker,
                n,
                ID_CONFLICT_GRACE_MS // 1000,
            )
        elif not n and worker in self.told:
            self.told.forget(worker)
            log.info("worker id %r: no longer written by several processes at once", worker)

    def forget(self, worker: str) -> None:
        """``worker`` is gone (its stream expired): a conflict of its id is news again."""
        self.told.forget(worker)


@dataclass
class Refusal:
    """An entry refused: why (``reason``, ``label`` its kind), and what of it the dead
    letter keeps."""

    entry_id: bytes
    reason: str
    label: str
    fields: Fields


class EntryJudge:
    """Judges the entries of each read (see the module's docstring); on the ingest thread."""

    def __init__(
        self,
        limits: BatchLimits,
        counters: IngestCounters,
        metrics: ControllerMetrics | None,
        max_workers: int | None = None,
    ) -> None:
        self.limits = limits
        self.counters = counters
        self.metrics = metrics
        self.id_conflicts = IdConflicts(metrics, max_workers)
        self._pass_applied: dict[BatchId, int] = {}
        """This pass's batches applied to the window, each with the events its clock lost."""
        self._applied_uncommitted: dict[BatchId, int] = {}
        """Batches in the window whose pass lost the lease, or whose stream's commit failed,
        before they were committed: reclaimed later by this replica, they are counted, not
        applied a second time (``forget_uncommitted`` once the window is replaced)."""

    def begin_pass(self) -> None:
        """A new pass: none of its batches applied yet."""
        self._pass_applied = {}

    def uncommitted(self, workers: set[str]) -> None:
        """The pass's commit failed (or may have) for ``workers``: the batches of theirs
        this pass applied are remembered as in the window."""
        self._remember_uncommitted({b: n for b, n in self._pass_applied.items() if b[0] in workers})

    def _remember_uncommitted(self, applied: dict[BatchId, int]) -> None:
        self._applied_uncommitted.update(applied)
        while len(self._applied_uncommitted) > MAX_APPLIED_UNCOMMITTED:
            del self._applied_uncommitted[next(iter(self._applied_uncommitted))]

    def forget_uncommitted(self) -> None:
        """The window was replaced (a checkpoint restored): the batches it held uncommitted
        are no longer in it."""
        self._applied_uncommitted.clear()

    def judge_all(
        self, read: StreamRead, worker: str | None, ledger: WorkerLedger | None, apply: ApplyFn
    ) -> tuple[Commit, list[Refusal]]:
        """Judge every entry of ``read`` (of ``worker``'s stream, with its ``ledger``;
        None: not a worker's stream), applying each batch with ``apply``: what to commit,
        and the entries refused."""
        commit = Commit()
        refused: list[Refusal] = []
        for entry_id, fields in read.entries:
            refusal = self._judge(worker, ledger, entry_id, fields, apply)
            commit.ack.append(entry_id)
            if refusal is not None:
                refused.append(refusal)
                commit.delete.append(entry_id)
                if ledger is not None:
                    ledger.counts.dead_letters += 1
        if ledger is not None:
            commit.ledger = ledger.to_hash()
            self.counters.gaps[ledger.worker] = ledger.missing
            if self.metrics:
                self.metrics.gaps.labels(worker=ledger.worker).set(ledger.missing)
            self.id_conflicts.update(ledger)
        return commit, refused

    def _judge(
        self,
        worker: str | None,
        ledger: WorkerLedger | None,
        entry_id: bytes,
        fields: Fields,
        apply: ApplyFn,
    ) -> Refusal | None:
        """Apply one entry or say why not (None: applied, a duplicate or a deleted one)."""
        if DELETED in fields:
            return None
        if OVERSIZE in fields:
            reason = (
                f"entry of {int(fields[OVERSIZE])} bytes > max_entry_bytes "
                f"({self.limits.max_entry_bytes})"
            )
            return Refusal(entry_id, reason, LIMIT, {PREFIX: fields.get(PREFIX, b"")})
        try:
            batch = decode_batch(fields, self.limits)
        except WireError as exc:
            kind = LIMIT if isinstance(exc, WireLimitError) else DECODE
            return Refusal(entry_id, exc.reason, kind, fields)
        except Exception as exc:  # WireError is the contract; anything else is still refused
            return Refusal(entry_id, f"decode failed: {exc!r}"[:300], DECODE, fields)
        if ledger is None or batch.worker != worker:
            where = "a stream not named for a worker" if worker is None else "another's stream"
            reason = f"w: worker {batch.worker!r} wrote into {where}"
            return Refusal(entry_id, reason, DECODE, fields)
        if not ledger.see(batch.epoch, batch.seq, _stream_ms(entry_id)):
            ledger.counts.duplicates += 1
            self.counters.duplicates += 1
            return None  # a pipeline resent after a timeout: applied the first time
        in_window = self._applied_uncommitted.pop((batch.worker, batch.epoch, batch.seq), None)
        if in_window is not None:  # applied (and counted by this process) uncommitted
            _count_in_ledger(ledger, batch, in_window)
            return None
        return self._apply(ledger, entry_id, batch, fields, apply)

    def _apply(
        self,
        ledger: WorkerLedger,
        entry_id: bytes,
        batch: EventBatch,
        fields: Fields,
        apply: ApplyFn,
    ) -> Refusal | None:
        try:
            rejected = apply(batch)
        except BatchRefused as exc:
            ledger.counts.refused += len(batch)
            return Refusal(entry_id, str(exc), LIMIT, fields)
        except Exception as exc:  # a bug in apply must not wedge the stream
            log.exception("applying batch %s of %s failed", entry_id, batch.worker)
            ledger.counts.refused += len(batch)
            return Refusal(entry_id, f"apply failed: {exc!r}"[:300], APPLY, fields)
        self._account(ledger, batch, rejected)
        self._pass_applied[batch.worker, batch.epoch, batch.seq] = rejected
        return None

    def _account(self, ledger: WorkerLedger, batch: EventBatch, rejected: int) -> None:
        """Count a batch just applied, in its worker's ledger and this process's totals."""
        _count_in_ledger(ledger, batch, rejected)
        taken, c = len(batch) - rejected, self.counters
        c.events += taken
        c.batches += 1
        c.clock_rejected += rejected
        if self.metrics:
            m = self.metrics
            m.events.inc(taken)
            m.batches.inc()
            if rejected:
                m.clock_rejected.labels(worker=ledger.worker).inc(rejected)
            if len(batch):
                m.ingest_lag.set(max(0.0, time.time() - float(batch.ts.max())))


def _count_in_ledger(ledger: WorkerLedger, batch: EventBatch, rejected: int) -> None:
    """Count an applied batch, of which the clock lost ``rejected`` events, in ``ledger``."""
    w = ledger.counts
    w.events += len(batch) - rejected
    w.batches += 1
    w.clock_rejected += rejected


def _stream_ms(entry_id: bytes) -> int:
    """The time Redis gave a stream entry, in ms (its id's first part); 0 if not an id."""
    head = entry_id.partition(b"-")[0]
    return int(head) if head.isdigit() else 0

"""Ingest: every worker's event stream -> bounded read -> decode -> judge -> apply -> commit.

Owns the consumer group over the ``events:*`` streams (new workers discovered by SCAN, up
to ``max_workers``: one found past them is left unread, counted and told once), the
reading of them in bounded passes (``stream_io``: no entry over ``max_entry_bytes`` and no
pass over about ``max_read_bytes`` reaches this process), reclaiming entries a dead consumer
left pending, each worker's ledger (``ledger``, read back by ``ledger_reads``; its flag of
several processes writing under one id falls, stored too, once the stream is quiet), and
the dead-letter stream. Each entry ends one way: applied; a duplicate (a resent batch); or
dead-lettered with its reason, its ids and a bounded prefix of its payload, and deleted from
its stream. Any failure on one entry (bad bytes, a limit, an exception in ``apply``)
dead-letters that entry and the pass goes on. An entry is acknowledged only after it was
applied or judged for the dead letters, in the same call that records it in the worker's
ledger and trims what the group has acknowledged (while a recording announces itself
under ``Keys.recording``, only once it is ``trim_grace_ms`` old: the recording has that long
to read it; else at once); a crash re-delivers instead of losing. A worker's ledger in
memory runs ahead of the stored one only within a pass: after a failed commit it is read
back from Redis, and the pass's entries, re-delivered, are counted then (once; its batches
are not applied again).
Dead letters are written after that call, best effort: a Redis that refuses writes (out of
memory) must not keep the commit from freeing what it can. If Redis restarts and forgets the
group, the group is recreated on the next pass. After each pass, ``between_passes`` (the
controller's checkpoint) runs on the ingest thread.

This module owns the ``Ingestor``: the streams read, the passes, the ledgers and the
commit. What each entry becomes is ``ingest_judge``'s (``EntryJudge``), the dead-letter
stream and its log ``dead_letters``' (``DeadLetters``), the tunables ``ingest_settings``'.
It must never fit or publish.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from typing import Final, cast

import redis

from agent.runtime.connection import RedisClient
from agent.runtime.loop import BackgroundLoop, RedisObserver
from agent.wire import Keys, WireError
from controlplane.service.dead_letters import DEAD_LETTER_PREFIX_BYTES, DeadLetters, shown
from controlplane.service.housekeeping import Housekeeper
from controlplane.service.ingest_judge import ApplyFn, EntryJudge, IngestCounters, Refusal
from controlplane.service.ingest_settings import IngestSettings
from controlplane.service.ledger import WorkerLedger
from controlplane.service.ledger_reads import LedgerReader
from controlplane.service.metrics import ControllerMetrics
from controlplane.service.stream_io import Commit, ReadLimits, StreamIO, StreamRead
from controlplane.told_once import ToldOnce

log = logging.getLogger(__name__)

BetweenPasses = Callable[[], object]
"""Runs on the ingest thread after each pass that committed: the window then holds exactly
the batches the ledgers in Redis say were applied (the controller's checkpoint)."""

DISCOVER_EVERY_S: Final = 2.0
MAX_BACKOFF_S: Final = 5.0


_SETTLE: Final = """
if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('HSET', KEYS[1], 'id_conflict', '0') end
"""
"""A stored ledger's ``id_conflict`` set to 0, unless the ledger is gone (housekeeping)."""


class NoLongerLeader(Exception):
    """This replica no longer holds the leader lease: the pass ends uncommitted."""


class Ingestor(BackgroundLoop):
    """Consumes event batches as ``settings.consumer`` on its own thread (``start``)."""

    def __init__(
        self,
        client: RedisClient,
        keys: Keys,
        apply: ApplyFn,
        settings: IngestSettings,
        *,
        metrics: ControllerMetrics | None = None,
        housekeeper: Housekeeper | None = None,
        observer: RedisObserver | None = None,
        between_passes: BetweenPasses | None = None,
        leads: Callable[[], bool] | None = None,
    ) -> None:
        super().__init__("ingest", interval_s=0.0, max_backoff_s=MAX_BACKOFF_S, observer=observer)
        self.leads = leads
        """Whether this replica still holds the lease (one read), asked before each pass
        and again before its commit: a deposed leader (paused past its lease, say) stops
        rather than acknowledge entries the new leader should read."""
        self.housekeeper = housekeeper
        self.between_passes = between_passes
        self._last_sweep = time.monotonic()
        self.r = client
        self.keys = keys
        self.apply = apply
        self.settings = settings
        self.metrics = metrics
        self.io = StreamIO(client, group=settings.group, consumer=settings.consumer)
        self.counters = IngestCounters()
        self.judge = EntryJudge(settings.limits, self.counters, metrics, settings.max_workers)
        self.dead_letters = DeadLetters(client, keys, settings.consumer, self.counters, metrics)
        self.ledgers: dict[str, WorkerLedger] = {}
        self.ledger_reader = LedgerReader(client, keys, settings.max_out_of_order, metrics)
        self._streams: list[bytes] = []
        self._next = 0  # where the next pass starts in _streams
        self._cursors: dict[bytes, bytes] = {}
        self._last_discover = 0.0
        self._last_reclaim = 0.0
        self._idle = False
        self._schema1_told: ToldOnce[bytes] = ToldOnce()
        self._rejoin: set[bytes] = set()
        """Streams read until Redis lost their group: discovered again before any other,
        so a stream waiting past ``max_workers`` never takes a read one's place."""
        self.refused: ToldOnce[bytes] = ToldOnce(cap=settings.max_workers)
        """Streams found past ``max_workers`` and left unread (told once each; as many
        names as ``max_workers`` at most, the rest counted only)."""
        per_stream = settings.limits.max_entry_bytes
        self._width = max(1, settings.max_read_bytes // per_stream)
        self._read_limits = ReadLimits(
            count=settings.count,
            max_entry_bytes=per_stream,
            budget_bytes=max(per_stream, settings.max_read_bytes // self._width),
            prefix_bytes=DEAD_LETTER_PREFIX_BYTES,
        )

    # --- the loop ----------------------------------------------------------------------------
    def step(self) -> None:
        try:
            self._idle = self.poll_once() == 0
        except (redis.ConnectionError, redis.TimeoutError):
            # Redis may come back without our groups: rediscover (these first).
            self._rejoin.update(self._streams)
            self._streams.clear()
            raise
        except NoLongerLeader:
            log.warning("ingest: this replica no longer holds the lease; ingest stops")
            self.stop()
            return
        if self.between_passes is not None:
            self.between_passes()

    def failed_unexpectedly(self) -> None:
        if self.metrics is not None:
            self.metrics.ingest_unexpected_errors.inc()

    def next_wait(self) -> float:
        if self.failures:
            return super().next_wait()
        return self.settings.block_ms / 1000 if self._idle else 0.0

    def outage_note(self) -> str:
        return "ingest pauses; entries wait in the streams"

    def finish(self) -> None:
        """Forget the ledgers: another leader may write them before this one ingests again,
        and a stale copy would overwrite its counts (the next pass reads them back). Its
        per-worker gap and id-conflict series and lag go too: a standby's frozen figures
        would stand beside the leader's live ones on a dashboard (GET /v1/agents reads the
        ledgers anew)."""
        self.ledgers.clear()
        if self.metrics is not None:
            self.metrics.gaps.clear()
            self.metrics.worker_id_conflict.clear()
            self.metrics.ingest_lag.set(0)

    # --- one pass ----------------------------------------------------------------------------
    def discover(self) -> None:
        """Find worker streams and make sure the group exists on each, up to
        ``max_workers`` streams; those found past them are left unread (``_refuse``)."""
        known = set(self._streams)
        scan = self.r.scan_iter(match=self.keys.events_match, count=500, _type="stream")
        found = sorted(cast(list[bytes], list(scan)), key=lambda key: key not in self._rejoin)
        refused = 0
        for key in found:
            if key in known:
                continue
            if len(self._streams) >= self.settings.max_workers:
                refused += 1
                self._refuse(key)
                continue
            self.refused.forget(key)
            try:
                self.r.xgroup_create(key, self.settings.group, id="0", mkstream=True)
            except redis.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise
            self._streams.append(key)
            known.add(key)
        self._last_discover = time.monotonic()
        if self.metrics is not None:
            self.metrics.streams_refused.set(refused)
        self.refused.keep_only(found)  # a stream gone is forgotten
        for gone in self._rejoin - set(found):  # deleted by another hand: its worker too
            worker = self._worker_of(gone)
            if worker is not None:
                self.forget(worker)
        self._rejoin.clear()

    def _settle_conflicts(self) -> None:
        """Workers flagged for several processes writing at once whose streams got nothing
        for the grace (by Redis's clock, one ``TIME`` while any is flagged) are no longer:
        their batches, which recompute it, have stopped coming."""
        flagged = [ledger for ledger in self.ledgers.values() if ledger.id_conflict]
        if not flagged:
            return
        reply = cast(tuple[int, int] | dict[str, tuple[int, int]], self.r.time())
        seconds, micros = min(reply.values()) if isinstance(reply, dict) else reply  # a cluster
        settled = [ledger for ledger in flagged if ledger.settle(seconds * 1000 + micros // 1000)]
        if not settled:
            return
        # The listing reads the stored ledgers: their flags fall too (where they still are).
        pipe = self.r.pipeline(transaction=False)
        for ledger in settled:
            pipe.execute_command("EVAL", _SETTLE, 1, self.keys.ingest_state(ledger.worker))
        pipe.execute()
        for ledger in settled:
            self.judge.id_conflicts.update(ledger)

    def _refuse(self, stream: bytes) -> None:
        """Leave ``stream`` unread, past ``max_workers``: said once per stream."""
        if self.refused.first(stream):
            log.warning(
                "stream %s left unread: this controller reads %s worker streams already "
                "(KVWISE_MAX_WORKERS); it is read once one of them expires",
                shown(stream),
                f"{self.settings.max_workers:,}",
            )

    def ingested_workers(self) -> set[str]:
        """The workers whose streams are read (``max_workers`` at most)."""
        return {w for w in map(self._worker_of, list(self._streams)) if w is not None}

    def refused_workers(self) -> set[str]:
        """The workers whose streams are left unread, past ``max_workers``."""
        return {w for w in map(self._worker_of, list(self.refused)) if w is not None}

    def poll_once(self) -> int:
        """Read, judge, apply and commit one pass; returns the entries handled. Raises
        ``NoLongerLeader`` (before reading, or nothing committed) once the lease is gone."""
        self._check_lease()
        now = time.monotonic()
        if now - self._last_discover > DISCOVER_EVERY_S or not self._streams:
            self.discover()
            self._settle_conflicts()
        if not self._streams:
            return 0
        handled = 0
        if now - self._last_reclaim > self.settings.reclaim_idle_ms / 2000:
            handled += self.reclaim()
        handled += self._handle_reads(self.io.read(self._chunk(), self._read_limits))
        if self.housekeeper and now - self._last_sweep > self.housekeeper.settings.interval_s:
            self.sweep()
        return handled

    def sweep(self) -> None:
        """One housekeeping round: expire dead workers, drop stale consumers."""
        self._last_sweep = time.monotonic()
        if self.housekeeper is None:
            return
        swept = self.housekeeper.sweep(list(self._streams))
        for worker in swept.workers:
            self.forget(worker)
        if self.metrics:
            self.metrics.cleanup.labels(what="worker").inc(len(swept.workers))
            self.metrics.cleanup.labels(what="consumer").inc(swept.consumers)

    def reclaim(self) -> int:
        """Take over entries other consumers left pending longer than the idle limit."""
        self._last_reclaim = time.monotonic()
        handled = 0
        for lo in range(0, len(self._streams), self._width):
            reads = self.io.read(
                self._streams[lo : lo + self._width],
                self._read_limits,
                mode="claim",
                min_idle_ms=self.settings.reclaim_idle_ms,
                cursors=self._cursors,
            )
            for read in reads:
                self._cursors[read.stream] = read.cursor
                self.counters.reclaimed += len(read.entries)
                if self.metrics and read.entries:
                    self.metrics.reclaimed.inc(len(read.entries))
            handled += self._handle_reads(reads)
        return handled

    def pending(self) -> int:
        """Entries delivered to some consumer of the group and not yet acknowledged."""
        pipe = self.r.pipeline(transaction=False)
        for stream in list(self._streams):  # a copy: the ingest thread may change it
            pipe.xpending(stream, self.settings.group)
        total = 0
        for reply in pipe.execute(raise_on_error=False):
            if isinstance(reply, dict):
                total += int(reply["pending"])
        return total

    def _chunk(self) -> list[bytes]:
        """The next ``_width`` streams, round robin: bounded reads still reach everyone."""
        n = len(self._streams)
        if n <= self._width:
            return list(self._streams)
        start = self._next % n
        self._next = start + self._width
        return [self._streams[(start + i) % n] for i in range(self._width)]

    # --- entries -----------------------------------------------------------------------------
    def _handle_reads(self, reads: list[StreamRead]) -> int:
        self.judge.begin_pass()
        self._load_ledgers([r.stream for r in reads if r.entries])
        commits: dict[bytes, Commit] = {}
        refusals: list[tuple[bytes, Refusal]] = []
        handled = 0
        for read in reads:
            if read.no_group:
                self._streams.remove(read.stream)  # rediscovered (and the group made) soon
                self._rejoin.add(read.stream)
                continue
            if not read.entries:
                continue
            worker = self._worker_of(read.stream)
            ledger = self.ledgers.get(worker) if worker is not None else None
            commit, refused = self.judge.judge_all(read, worker, ledger, self.apply)
            commits[read.stream] = commit
            refusals += [(read.stream, r) for r in refused]
            handled += len(read.entries)
        if commits:
            try:
                self._check_lease()
                ledger_keys = {s: self._ledger_key(s) for s in commits}
                done = self.io.commit(ledger_keys, commits, self._trim_grace_ms())
            except Exception:  # the lease lost, or Redis failed: none, or not all, done
                self._uncommitted(list(commits))
                raise
            if done.failed:
                self._uncommitted(list(done.failed))
            self.counters.trimmed += done.trimmed
            # After the commit (a Redis out of memory refuses these first), for the streams
            # it deleted them from: a failed stream's entries are judged again.
            refusals = [(s, refusal) for s, refusal in refusals if s not in done.failed]
            if refusals:
                self.dead_letters.write(refusals)
            if done.failed:
                raise next(iter(done.failed.values()))
        return handled

    def _uncommitted(self, streams: list[bytes]) -> None:
        """The pass's commit of ``streams`` failed (or may have): their workers' ledgers are
        read back from Redis, as last committed, before they judge again (this pass's
        entries, still pending, come back through the reclaim and are counted then, once);
        the batches of theirs this pass applied are remembered as in the window."""
        workers = {w for w in map(self._worker_of, streams) if w is not None}
        for worker in workers:
            self.ledgers.pop(worker, None)
        self.judge.uncommitted(workers)

    def forget_uncommitted(self) -> None:
        """The window was replaced (a checkpoint restored): the batches it held uncommitted
        are no longer in it."""
        self.judge.forget_uncommitted()

    def _trim_grace_ms(self) -> int:
        """The grace acknowledged entries get before they are trimmed: the setting's while
        a recording is announced (one ``EXISTS`` a pass that commits), else none."""
        grace = self.settings.trim_grace_ms
        return grace if grace and self.r.exists(self.keys.recording) else 0

    def _check_lease(self) -> None:
        if self.leads is not None and not self.leads():
            raise NoLongerLeader

    # --- workers and their ledgers ----------------------------------------------------------
    def _worker_of(self, stream: bytes) -> str | None:
        try:
            return self.keys.worker_of(stream)
        except WireError:
            if self._schema1_told.first(stream):
                log.error(
                    "stream %s is not a schema-2 worker stream (an agent of an older kvwise "
                    "release?): its entries are dead-lettered",
                    shown(stream),
                )
            return None

    def _ledger_key(self, stream: bytes) -> str | bytes:
        worker = self._worker_of(stream)
        # An untagged (schema 1) stream, or one whose name is not text: no ledger; its own
        # key keeps the call on one shard.
        return self.keys.ingest_state(worker) if worker is not None else stream

    def _load_ledgers(self, streams: list[bytes]) -> None:
        workers = [w for w in map(self._worker_of, streams) if w and w not in self.ledgers]
        self.ledgers.update(self.ledger_reader.read(workers))

    def forget(self, worker: str) -> None:
        """Drop what this process holds of a worker whose stream was expired."""
        self.ledgers.pop(worker, None)
        self.ledger_reader.forget(worker)
        self.counters.gaps.pop(worker, None)
        self.judge.id_conflicts.forget(worker)
        for stream in (self.keys.events_stream(worker).encode(), worker.encode()):
            if stream in self._streams:
                self._streams.remove(stream)
            self._cursors.pop(stream, None)
            self._rejoin.discard(stream)
            self._schema1_told.forget(stream)
            self.dead_letters.forget(stream)
        if self.metrics:
            for series in (
                self.metrics.gaps,
                self.metrics.worker_id_conflict,
                self.metrics.clock_rejected,
            ):
                with contextlib.suppress(KeyError):
                    series.remove(worker)

"""The shadow evaluation of live traffic: per worker, its sampled requests replayed through
the published ``wa`` document and the baselines at a ladder of capacities.

Owns ``ShadowEvaluator``: it takes every applied event batch (``apply``, ingest's thread),
gathers a worker's events and rebuilds and samples its requests (``rebuild``) once enough
are gathered or before any read (``view``, ``reading``, ``judge``), serves each sampled
request to every miniature cache of that worker (``estimator``), each sized by the
sample's share of the worker's recent inflow (``inflow``), keeps the sampled requests of
the window for the refit guard (``judge``: the candidate document and the one in force
replayed from cold on the same requests), and answers what it knows as a ``ShadowView``,
each estimate moved by what the sample misses of the workers' own hit ratio
(``estimator.Totals``). Workers are grouped by capacity (a heartbeat's above
``shadow_max_capacity`` modeled at that limit: the miniatures are sized by it); a worker
whose capacity is not known yet (no heartbeat read) has its requests counted and kept for
later, not replayed; one past ``max_workers`` is left out (told once). Its cost is
bounded by the rate: unsampled requests cost a few vectorised passes over the gathered
events. A failure in any of it loses those events to
the shadow only (logged once per kind). One lock guards its state, granted in turn
(``FairLock``), and no hold does more than one worker's gather (``GATHER_EVENTS``; a read
or a new document replays each worker's in a hold of its own) or a bounded catch-up
(``rewarm.CATCH_UP_UNDER_LOCK``): a worker's new miniatures (``set_capacities``) are
built and warmed with the window's kept requests on the caller's thread with the lock
released (``rewarm``), and replace the old ones once caught up on what came meanwhile
(``miniatures.Warming``), so a batch or a read never waits behind a warm. One worker's
state and the bookkeeping on it are ``worker``'s, the views' arithmetic ``readout``'s, the
guard's replay and verdict ``guard``'s; this module holds the lock, the workers and the
order of what is done to them. It must never talk to Redis, decode wire data or publish
anything.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Mapping

from agent.policy_document import BUILTIN_POLICY, PolicyDocument
from agent.reuse_classes import REUSE_GHOST_CAPACITIES
from agent.wire import EventBatch
from controlplane.shadow.estimator import MiniCache, RunCounts, Totals, WindowCounts
from controlplane.shadow.fair_lock import FairLock
from controlplane.shadow.guard import compare, unjudgeable
from controlplane.shadow.inflow import InflowShare
from controlplane.shadow.miniatures import WA, Modeled, Served
from controlplane.shadow.readout import group_view, own_ratio
from controlplane.shadow.rebuild import CategoryTable, Rebuilt, RequestRebuilder
from controlplane.shadow.rewarm import begin_warming, warm
from controlplane.shadow.sampler import PrefixSampler
from controlplane.shadow.selection import Reading
from controlplane.shadow.settings import ShadowSettings
from controlplane.shadow.view import NOT_JUDGED, GroupView, GuardView, ShadowView
from controlplane.shadow.worker import (
    Sizes,
    WorkerState,
    guard_work,
    is_whole,
    keep,
    let_go_oldest,
    sizes_on_arrival,
)
from controlplane.told_once import ToldOnce

log = logging.getLogger(__name__)

GATHER_EVENTS = 8192
"""Access events a worker's rebuilder gathers before it rebuilds them (every read drains
it first): its vectorised passes cost about the same for a small batch as for this many."""


class ShadowEvaluator:
    """Sampled replays of every worker's traffic; thread-safe."""

    def __init__(
        self, settings: ShadowSettings, salt: int = 0, max_workers: int | None = None
    ) -> None:
        self.settings = settings
        self.max_workers = max_workers
        """Workers shadowed, at most (None: no limit); one more is left out (``refused``)."""
        self.refused: ToldOnce[str] = ToldOnce(cap=max_workers or 0)
        """Workers left out past ``max_workers`` (as many names as it at most), told once
        each; forgotten with their heartbeats (``forget_gone``)."""
        self.sampler = PrefixSampler(settings.shadow_rate, salt)
        self.table = CategoryTable(settings.shadow_window_s, self._release_categories)
        self.policies = (WA, *settings.baselines)
        self.multiples = settings.multiples
        self._doc = BUILTIN_POLICY
        self._workers: dict[str, WorkerState] = {}
        self._clock = 0.0
        self._first = -1.0  # time of the first sampled request (-1: none yet)
        self._guard = NOT_JUDGED
        self._lock = FairLock()
        self._failed: ToldOnce[tuple[str, str]] = ToldOnce()  # (message, kind) logged

    # --- input ---------------------------------------------------------------------------
    def apply(self, batch: EventBatch) -> None:
        """Gather ``batch``'s access events; once a worker has gathered enough, rebuild,
        sample and replay its requests (the last run waits for the next batch)."""
        with self._lock:
            worker = self._worker(batch.worker)
            if worker is None:
                return
            worker.last_batch = time.monotonic()
            if worker.rebuilder.brings_new(batch):
                # The table may forget categories to code the new ones: what this worker
                # gathered is replayed first, so its events carry none of those codes.
                self._take_guarded(batch.worker, worker, worker.rebuilder.drain)
            self._take_guarded(batch.worker, worker, lambda: worker.rebuilder.feed(batch))

    def flush(self, worker_id: str) -> None:
        """Replay the requests held back at the end of ``worker_id``'s stream so far."""
        with self._lock:
            worker = self._workers.get(worker_id)
            if worker is not None:
                self._take_guarded(worker_id, worker, worker.rebuilder.flush)

    def flush_idle(self, idle_s: float) -> None:
        """``flush`` every worker that sent nothing for ``idle_s`` seconds: a request is
        not left waiting for a batch that may never come."""
        now = time.monotonic()

        def flush_if_idle(worker_id: str, worker: WorkerState) -> None:
            if now - worker.last_batch >= idle_s:
                self._take_guarded(worker_id, worker, worker.rebuilder.flush)

        self._one_hold_per_worker(flush_if_idle)

    def set_capacities(
        self,
        capacities: Mapping[str, int],
        whole_requests: Mapping[str, bool] | None = None,
        reuse_ghosts: Mapping[str, int | None] | None = None,
        supersedes: Mapping[str, bool] | None = None,
    ) -> None:
        """Workers' capacities, whether they report requests whole, the ghost of their
        reuse classes (None: they file none) and whether their eviction runs the
        document's ``supersede`` rule, from their heartbeats (a capacity above
        ``shadow_max_capacity`` is modeled at it, and shown capped; a mapping not given
        leaves what it says as it stands); a change of what a worker's miniatures stand
        for (``Modeled``) starts its miniature caches afresh, warmed with the
        window's sampled requests kept so far. What that worker gathered before is
        replayed first, as it stood (the curves do not depend on whether a read came
        first); the others keep gathering. The new miniatures are warmed on this thread,
        one worker after another, with the lock released (``rewarm.warm``): until they replace
        the old ones, the old ones serve and are read (the worker is shown at its old
        capacity), and a worker whose capacity was not known waits
        (``waiting_workers``). A warm that fails is logged (once per kind) and put
        aside, and the next worker's goes on: one worker's failure never keeps the
        others from their capacities, nor its caller from what it does next."""
        for worker_id, capacity in capacities.items():
            with self._lock:
                worker = self._worker(worker_id)
                if worker is None:
                    continue
                if whole_requests is not None:
                    worker.declares_whole = whole_requests.get(worker_id, False)
                if capacity <= 0:
                    continue
                told = reuse_ghosts.get(worker_id) if reuse_ghosts is not None else None
                capacity, ghost, worker.capped = self._modeled(capacity, told)
                before = worker.target() or Modeled(0)
                if reuse_ghosts is None:  # not told: the ghost stays as modeled
                    ghost = before.reuse_ghost
                runs_rule = before.supersedes
                if supersedes is not None:
                    runs_rule = supersedes.get(worker_id, False)
                modeled = Modeled(capacity, ghost, runs_rule)
                if modeled == worker.target():
                    continue
                self._take_guarded(worker_id, worker, worker.rebuilder.drain)
                warming = begin_warming(
                    worker,
                    modeled,
                    self.settings,
                    self.multiples,
                    self.sampler,
                    self.table.names,
                )
            try:
                warm(worker, warming, self._lock, self.table, self.settings, self.multiples)
            except Exception as exc:
                with self._lock:
                    self._log_once(
                        exc, "shadow evaluation put aside the new miniatures of %s", worker_id
                    )

    def _modeled(self, capacity: int, ghost: int | None) -> tuple[int, int | None, bool]:
        """A heartbeat's capacity and reuse ghost as the shadow models them, and whether
        either was capped: the capacity at most ``shadow_max_capacity``, the ghost scaled
        as the capacity is (its share of it kept), then at most ``REUSE_GHOST_CAPACITIES``
        times that limit (the miniatures' caches and ghosts are sized by both)."""
        limit = self.settings.shadow_max_capacity
        modeled = min(capacity, limit)
        if ghost is None:
            return modeled, None, modeled < capacity
        ghost_limit = REUSE_GHOST_CAPACITIES * limit
        scaled = ghost * modeled // capacity
        return modeled, min(scaled, ghost_limit), modeled < capacity or scaled > ghost_limit

    def set_policy(self, doc: PolicyDocument) -> None:
        """The published document the ``wa`` caches replay from now on: each worker's
        gather is replayed under the one it came under, then the worker turns to
        ``doc``, one worker per hold of the lock (``_turn_to_policy``; a worker new
        since replays it from its start)."""
        with self._lock:
            if doc.version == self._doc.version and doc.created_at == self._doc.created_at:
                return
            self._doc = doc
        self._one_hold_per_worker(self._turn_to_policy)

    def _turn_to_policy(self, worker_id: str, worker: WorkerState) -> None:
        """What ``worker`` gathered replayed under its document, then the evaluator's
        document told to its miniatures and to those warming (the lock held)."""
        doc = self._doc
        if worker.doc is doc:
            return
        self._take_guarded(worker_id, worker, worker.rebuilder.drain)
        worker.doc = doc
        if worker.miniatures is not None:
            worker.miniatures.set_policy(doc)
        if worker.warming is not None:
            worker.warming.pending.append(doc)

    def forget_gone(self, live: set[str]) -> list[str]:
        """Drop the workers outside ``live`` (no heartbeat) that sent nothing for a whole
        window: nothing of theirs is left to show. Returns their ids."""
        now = time.monotonic()
        with self._lock:
            gone = [
                worker_id
                for worker_id, worker in self._workers.items()
                if worker_id not in live and now - worker.last_batch > self.settings.shadow_window_s
            ]
            for worker_id in gone:
                self._workers.pop(worker_id).warming = None
            self.refused.keep_only(live)
        return gone

    def _release_categories(self, before: float) -> set[int]:
        """The category codes that requests with times before ``before`` still carry, once
        the kept requests that old are let go (outside the window by the newest event
        time: ``keep`` lets them go at the next rebuild): events gathered, requests kept
        out of time order and requests a warm is to catch up on. The table asks as a batch
        is gathered (the lock held), and gives none of them again."""
        held: set[int] = set()
        for worker in self._workers.values():
            while worker.buffer and worker.buffer[0].ts < before:
                let_go_oldest(worker)
            held.update(r.category for r in worker.buffer if r.ts < before)
            held |= worker.rebuilder.categories_before(before)
            pending = worker.warming.pending if worker.warming is not None else []
            for item in pending:
                if isinstance(item, Served):
                    held.update(r.category for r in item.requests if r.ts < before)
        return held

    def _worker(self, worker_id: str) -> WorkerState | None:
        """``worker_id``'s state, made when it first comes (None: past ``max_workers``,
        it is left out, said once)."""
        worker = self._workers.get(worker_id)
        if worker is not None:
            return worker
        if self.max_workers is not None and len(self._workers) >= self.max_workers:
            if self.refused.first(worker_id):
                log.warning(
                    "shadow evaluation leaves %s out: it shadows %d workers already "
                    "(KVWISE_MAX_WORKERS)",
                    worker_id,
                    self.max_workers,
                )
            return None
        self.refused.forget(worker_id)
        depth = self.settings.shadow_key_depth
        rebuilder = RequestRebuilder(self.sampler, self.table, depth, GATHER_EVENTS)
        window, buckets = self.settings.shadow_window_s, self.settings.shadow_buckets
        worker = self._workers[worker_id] = WorkerState(
            rebuilder,
            deque(),
            WindowCounts(window, buckets),
            InflowShare(self.sampler.rate),
            RunCounts(window, buckets),
            doc=self._doc,
        )
        return worker

    def _take(self, worker: WorkerState, rebuilt: Rebuilt) -> None:
        worker.requests += rebuilt.requests
        worker.accesses += rebuilt.accesses
        sizes: Sizes = (None, None)
        if rebuilt.seen is not None and len(rebuilt.seen.ts):
            worker.seen_all.add_many(rebuilt.seen.ts, rebuilt.seen.hits, rebuilt.seen.accesses)
            self._clock = max(self._clock, float(rebuilt.seen.ts.max()))
            sizes = sizes_on_arrival(worker, rebuilt.seen, rebuilt.sampled, self.multiples)
        worker.runs.add(self._clock, rebuilt.requests, rebuilt.incomplete)
        if not rebuilt.sampled:
            return
        self._clock = max(self._clock, rebuilt.sampled[-1].ts)
        if self._first < 0:
            self._first = rebuilt.sampled[0].ts
        keep(worker, rebuilt.sampled, self._clock, self.settings)
        if worker.warming is not None:
            worker.warming.pending.append(Served(rebuilt.sampled, sizes[1]))
        if worker.miniatures is not None:
            worker.miniatures.tell_categories(self.table.names)
            worker.miniatures.serve(rebuilt.sampled, sizes[0])

    def _drain_apart(self) -> None:
        """Replay what every worker's rebuilder has gathered (before a read)."""
        self._one_hold_per_worker(
            lambda worker_id, worker: self._take_guarded(worker_id, worker, worker.rebuilder.drain)
        )

    def _one_hold_per_worker(self, step: Callable[[str, WorkerState], None]) -> None:
        """``step`` for each worker still known, one worker per hold of the lock: a batch
        waits for one worker's gather, not every worker's."""
        with self._lock:
            workers = list(self._workers.items())
        for worker_id, worker in workers:
            with self._lock:
                if self._workers.get(worker_id) is worker:
                    step(worker_id, worker)

    def _take_guarded(
        self, worker_id: str, worker: WorkerState, rebuild: Callable[[], Rebuilt]
    ) -> None:
        """``_take`` what ``rebuild`` gives. A failure loses those events to the shadow
        only: it is logged once per kind and fails no batch, read or refit."""
        try:
            self._take(worker, rebuild())
        except Exception as exc:
            self._log_once(exc, "shadow evaluation dropped events of %s", worker_id)

    def _log_once(self, exc: Exception, message: str, worker_id: str) -> None:
        """Log ``exc`` with ``message`` (about ``worker_id``), once per message and kind
        of failure (the lock held; called from an ``except`` block)."""
        kind = (message, type(exc).__name__)
        if self._failed.first(kind):
            log.exception(message, worker_id)

    # --- output --------------------------------------------------------------------------
    def view(self) -> ShadowView:
        """Every group's curves over the window ending at the newest sampled request."""
        self._drain_apart()
        with self._lock:
            groups: dict[int, list[tuple[str, WorkerState]]] = {}
            waiting = []
            for worker_id, worker in sorted(self._workers.items()):
                if worker.capacity is None:
                    waiting.append(worker_id)
                else:
                    groups.setdefault(worker.capacity, []).append((worker_id, worker))
            return ShadowView(
                enabled=True,
                rate=self.sampler.rate,
                ladder=list(self.multiples),
                policies=list(self.policies),
                window_s=self.settings.shadow_window_s,
                policy_version=self._doc.version if self._doc is not BUILTIN_POLICY else None,
                groups=[self._group(c, members) for c, members in sorted(groups.items())],
                waiting_workers=waiting,
                refused_workers=sorted(self.refused),
                guard=self._guard,
            )

    def _group(self, capacity: int, members: list[tuple[str, WorkerState]]) -> GroupView:
        rate, clock = self.sampler.rate, self._clock
        return group_view(capacity, members, self.policies, self.multiples, rate, clock)

    def miniatures(self, worker_id: str) -> list[MiniCache]:
        """Every miniature cache of ``worker_id`` (none before its capacity is known)."""
        self._drain_apart()
        with self._lock:
            worker = self._workers.get(worker_id)
            if worker is None:
                return []
            return [cache for ladder in worker.ladders.values() for cache in ladder.caches]

    def reading(self, multiple: float = 1.0) -> Reading:
        """Every family's hit ratio at ``multiple`` times the capacity over the window
        ending at the newest sampled request, pooled over the workers whose events rebuild
        into whole requests (what the family selection judges)."""
        if multiple not in self.multiples:
            raise ValueError(f"{multiple} is not on the ladder {self.multiples}")
        step = self.multiples.index(multiple)
        self._drain_apart()
        with self._lock:
            now = self._clock
            whole = [
                w for w in self._workers.values() if w.capacity is not None and is_whole(w, now)
            ]
            seen_ratio = own_ratio(whole, self.sampler.rate, self._clock)
            ratios: dict[str, float] = {}
            accesses = 0
            for name in self.policies:
                totals = sum(
                    (w.ladders[name].counts[step].totals(self._clock) for w in whole), Totals()
                )
                if totals.accesses:
                    ratios[name] = totals.estimate(seen_ratio).hit_ratio
                    accesses = int(totals.accesses)
            start = max(self._first, self._clock - self.settings.shadow_window_s)
            return Reading(ratios, accesses, start, self._clock)

    # --- the refit guard -----------------------------------------------------------------
    def judge(self, candidate: PolicyDocument, in_force: PolicyDocument | None) -> GuardView:
        """Replay the window's sampled requests through ``candidate`` and ``in_force``
        (each worker's at its capacity, from cold) and say whether ``candidate`` may be
        published; the verdict is also kept for ``view``."""
        self._drain_apart()
        with self._lock:
            names = tuple(self.table.names)
            limit = self.settings.guard_max_accesses
            known = [w for w in self._workers.values() if w.capacity is not None and w.buffer]
            work = [guard_work(w, limit) for w in known if is_whole(w, self._clock)]
        if known and not work:
            verdict = unjudgeable(len(known), in_force, self.settings.guard_margin)
        else:
            verdict = compare(work, names, candidate, in_force, self.settings)
        with self._lock:
            self._guard = verdict
        return verdict

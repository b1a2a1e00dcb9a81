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
(``CATCH_UP_UNDER_LOCK``): a worker's new miniatures (``set_capacities``) are built and
warmed with the window's kept requests on the caller's thread with the lock released, and
replace the old ones once caught up on what came meanwhile (``miniatures.Warming``), so a
batch or a read never waits behind a warm. It must never talk to Redis, decode wire data
or publish anything.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from agent.category_table import reused_name
from agent.policies.wa import WAPolicy
from agent.policy_document import BUILTIN_POLICY, PolicyDocument
from agent.reuse_classes import REUSE_GHOST_CAPACITIES, ReturnTracker
from agent.wire import EventBatch
from controlplane.shadow.estimator import (
    MiniCache,
    ReuseClassing,
    RunCounts,
    Totals,
    WindowCounts,
)
from controlplane.shadow.fair_lock import FairLock
from controlplane.shadow.inflow import InflowShare
from controlplane.shadow.miniatures import WA, Ladder, Miniatures, Served, Warming, ghost_share
from controlplane.shadow.rebuild import CategoryTable, Rebuilt, Request, RequestRebuilder, Seen
from controlplane.shadow.sampler import PrefixSampler
from controlplane.shadow.selection import Reading
from controlplane.shadow.settings import ShadowSettings
from controlplane.shadow.view import (
    NOT_JUDGED,
    CurvePoint,
    GroupView,
    GuardView,
    PolicyCurve,
    ShadowView,
)
from controlplane.told_once import ToldOnce

log = logging.getLogger(__name__)

GATHER_EVENTS = 8192
"""Access events a worker's rebuilder gathers before it rebuilds them (every read drains
it first): its vectorised passes cost about the same for a small batch as for this many."""
GUARD_MAX_INCOMPLETE_SHARE = 0.1
"""A worker more than this share of whose runs do not rebuild into whole requests (events
lost, or an engine that reports a request's hits and its inserts apart) is left out of the
guard: its sample is not its traffic. So is one whose heartbeat does not say it reports
requests whole (SGLang's radix nodes; agents older than the field)."""
CATCH_UP_UNDER_LOCK = 1024
"""Sampled accesses that came while new miniatures warmed, at most, replayed into them
with the lock held as they replace the old ones (about 1 us per access in each of the 20
miniatures of the default settings: a few tens of milliseconds); more are replayed with
the lock released first."""
CATCH_UP_ROUNDS = 8
"""Times new miniatures catch up with the lock released before the rest is replayed
with it held (what comes during each round is less than the round replayed, unless the
shadow cannot keep up with the traffic)."""

_Sizes = tuple[list[list[int]] | None, list[list[int]] | None]
"""Each sampled request's miniature sizes per ladder step, for the worker's miniatures
and for those warming (None: it has none)."""


@dataclass
class _Worker:
    rebuilder: RequestRebuilder
    buffer: deque[Request]
    seen_all: WindowCounts
    """The worker's own prefix hits and accesses over every whole request (the sampled
    ones' are in every miniature's counts)."""
    share: InflowShare
    """The sample's share of its recent inflow: its miniatures' capacities."""
    runs: RunCounts
    """Its whole and incomplete runs over the window: whether it reports requests whole."""
    miniatures: Miniatures | None = None
    """Its miniature caches at its capacity (None: its capacity is not known yet)."""
    warming: Warming | None = None
    """Its next miniatures, while they warm (``set_capacities``)."""
    requests: int = 0
    accesses: int = 0
    capped: bool = False
    """Whether its last heartbeat said a capacity, or a reuse ghost, above what the
    shadow models (``ShadowEvaluator._modeled``)."""
    declares_whole: bool = True
    """What its heartbeat says of its requests (``AgentStatus.whole_requests``)."""
    last_batch: float = 0.0
    """When its last batch came (monotonic clock)."""
    buffer_dropped: bool = False
    """Whether its buffer ever let a sampled request go (it no longer holds them all)."""
    kept_blocks: int = 0
    """Blocks of the requests its buffer holds."""
    kept_dropped: int = 0
    """Requests its buffer let go inside the window, for ``shadow_max_requests`` or
    ``shadow_max_kept_blocks``."""
    doc: PolicyDocument = BUILTIN_POLICY
    """The document its ``wa`` caches replay (the evaluator's, once ``set_policy`` has
    come to this worker)."""

    @property
    def capacity(self) -> int | None:
        """Its capacity as its miniatures stand for it (None: not known yet)."""
        return self.miniatures.capacity if self.miniatures is not None else None

    @property
    def reuse_ghost(self) -> int | None:
        """The ghost of its reuse classes in blocks, None when it files no reuse classes
        (``AgentStatus.reuse_classes``, ``reuse_ghost_blocks``) or its capacity is not
        known yet."""
        return self.miniatures.reuse_ghost if self.miniatures is not None else None

    @property
    def ladders(self) -> dict[str, Ladder]:
        return self.miniatures.ladders if self.miniatures is not None else {}

    @property
    def curves_since(self) -> float | None:
        """From when its miniatures count (None: nothing served yet); its own hit ratio is
        read from then on, over the span the curves cover."""
        return self.miniatures.curves_since if self.miniatures is not None else None

    def target(self) -> tuple[int | None, int | None]:
        """The capacity and reuse ghost its miniatures stand for, or will once warm."""
        if self.warming is not None:
            return self.warming.capacity, self.warming.reuse_ghost
        return self.capacity, self.reuse_ghost


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
        self._workers: dict[str, _Worker] = {}
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

        def flush_if_idle(worker_id: str, worker: _Worker) -> None:
            if now - worker.last_batch >= idle_s:
                self._take_guarded(worker_id, worker, worker.rebuilder.flush)

        self._one_hold_per_worker(flush_if_idle)

    def set_capacities(
        self,
        capacities: Mapping[str, int],
        whole_requests: Mapping[str, bool] | None = None,
        reuse_ghosts: Mapping[str, int | None] | None = None,
    ) -> None:
        """Workers' capacities, whether they report requests whole and the ghost of their
        reuse classes (None: they file none), from their heartbeats (a capacity above
        ``shadow_max_capacity`` is modeled at it, and shown capped); a change of capacity
        or of reuse classes starts that worker's miniature caches afresh, warmed with the
        window's sampled requests kept so far. What that worker gathered before is
        replayed first, as it stood (the curves do not depend on whether a read came
        first); the others keep gathering. The new miniatures are warmed on this thread,
        one worker after another, with the lock released (``_warm``): until they replace
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
                if reuse_ghosts is None:  # not told: the ghost stays as modeled
                    ghost = worker.target()[1]
                if (capacity, ghost) == worker.target():
                    continue
                self._take_guarded(worker_id, worker, worker.rebuilder.drain)
                warming = self._begin_warming(worker, capacity, ghost)
            try:
                self._warm(worker, warming)
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

    def _turn_to_policy(self, worker_id: str, worker: _Worker) -> None:
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
        time: ``_keep`` lets them go at the next rebuild): events gathered, requests kept
        out of time order and requests a warm is to catch up on. The table asks as a batch
        is gathered (the lock held), and gives none of them again."""
        held: set[int] = set()
        for worker in self._workers.values():
            while worker.buffer and worker.buffer[0].ts < before:
                _let_go_oldest(worker)
            held.update(r.category for r in worker.buffer if r.ts < before)
            held |= worker.rebuilder.categories_before(before)
            pending = worker.warming.pending if worker.warming is not None else []
            for item in pending:
                if isinstance(item, Served):
                    held.update(r.category for r in item.requests if r.ts < before)
        return held

    def _worker(self, worker_id: str) -> _Worker | None:
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
        worker = self._workers[worker_id] = _Worker(
            rebuilder,
            deque(),
            WindowCounts(window, buckets),
            InflowShare(self.sampler.rate),
            RunCounts(window, buckets),
            doc=self._doc,
        )
        return worker

    def _begin_warming(self, worker: _Worker, capacity: int, ghost: int | None) -> Warming:
        """What new miniatures at ``capacity`` (and ``ghost``) are warmed from, as it stands
        now (under the lock). They replay the window's requests still kept, at the sizes
        the inflow share gives now. When the buffer has let some go, they are counted from
        the first whole time bucket after the oldest kept (the workers' own hits are read
        from there on, so both cover the same span; the requests before it only warm the
        caches); else all of them."""
        fulls = [round(capacity * m) for m in self.multiples]
        requests = list(worker.buffer)
        counted_from = None
        if requests and worker.buffer_dropped:
            bucket_s = self.settings.shadow_window_s / self.settings.shadow_buckets
            counted_from = (math.floor(requests[0].ts / bucket_s) + 1) * bucket_s
        worker.warming = Warming(
            capacity,
            ghost,
            nominal=[self.sampler.scaled(full) for full in fulls],
            sizes=[worker.share.capacity(full) for full in fulls],
            doc=worker.doc,
            names=list(self.table.names),
            requests=requests,
            curves_since=counted_from,
        )
        self._follow_capacity(worker)
        return worker.warming

    def _follow_capacity(self, worker: _Worker) -> None:
        """The worker's inflow share keeps what the ladder's top step needs at the
        capacity its miniatures stand for, and at the one they warm for (the old and the
        new are sized by it meanwhile): no more, once a warm is installed or put aside."""
        capacities = (worker.capacity, worker.warming.capacity if worker.warming else None)
        known = [c for c in capacities if c is not None]
        worker.share.horizon = round(max(known, default=0) * max(self.multiples))

    def _warm(self, worker: _Worker, warming: Warming) -> None:
        """Warm ``warming`` with the lock released, catch it up on what came meanwhile
        (with the lock released while more than ``CATCH_UP_UNDER_LOCK`` accesses wait, at
        most ``CATCH_UP_ROUNDS`` times), then put it in the old miniatures' place, unless
        a later change (or forgetting the worker) put it aside. A failure puts it aside
        too (the next heartbeat starts another) and is raised (``set_capacities`` logs it)."""
        try:
            # Off the lock, the new miniatures read only what is theirs (the category names
            # as they stood when it began, each request's reuse class read from them).
            warming.warm(self.settings)
            for rounds in range(CATCH_UP_ROUNDS + 1):
                with self._lock:
                    if worker.warming is not warming:
                        return
                    last = rounds == CATCH_UP_ROUNDS
                    if last or warming.pending_accesses() <= CATCH_UP_UNDER_LOCK:
                        self._install(worker, warming)
                        return
                    items, warming.pending = warming.pending, []
                    names = list(self.table.names)
                warming.catch_up(items, names)
        except BaseException:
            with self._lock:
                if worker.warming is warming:
                    worker.warming = None
                    self._follow_capacity(worker)
            raise

    def _install(self, worker: _Worker, warming: Warming) -> None:
        """``warming``, caught up on what is left, in place of the worker's miniatures."""
        warming.catch_up(warming.pending, self.table.names)
        worker.miniatures, worker.warming = warming.miniatures, None
        self._follow_capacity(worker)

    def _take(self, worker: _Worker, rebuilt: Rebuilt) -> None:
        worker.requests += rebuilt.requests
        worker.accesses += rebuilt.accesses
        sizes: _Sizes = (None, None)
        if rebuilt.seen is not None and len(rebuilt.seen.ts):
            worker.seen_all.add_many(rebuilt.seen.ts, rebuilt.seen.hits, rebuilt.seen.accesses)
            self._clock = max(self._clock, float(rebuilt.seen.ts.max()))
            sizes = self._sizes_on_arrival(worker, rebuilt.seen, rebuilt.sampled)
        worker.runs.add(self._clock, rebuilt.requests, rebuilt.incomplete)
        if not rebuilt.sampled:
            return
        self._clock = max(self._clock, rebuilt.sampled[-1].ts)
        if self._first < 0:
            self._first = rebuilt.sampled[0].ts
        self._keep(worker, rebuilt.sampled)
        if worker.warming is not None:
            worker.warming.pending.append(Served(rebuilt.sampled, sizes[1]))
        if worker.miniatures is not None:
            worker.miniatures.tell_categories(self.table.names)
            worker.miniatures.serve(rebuilt.sampled, sizes[0])

    def _sizes_on_arrival(self, worker: _Worker, seen: Seen, sampled: list[Request]) -> _Sizes:
        """Tell the worker's inflow share every request's inflow, in order, and return
        each sampled request's miniature sizes (per ladder step) as the share stands once
        it is in (``InflowShare.tell``), for its miniatures and for those warming (None:
        it has none)."""
        warming = worker.warming
        capacities = [worker.capacity, warming.capacity if warming is not None else None]
        fulls = [round(c * m) for c in capacities if c is not None for m in self.multiples]
        sizes = worker.share.tell(
            seen.accesses - seen.hits,
            seen.sampled,
            [len(r.blocks) - r.seen_hits for r in sampled],
            fulls,
        )
        steps, at = len(self.multiples), 0
        parts: list[list[list[int]] | None] = []
        for capacity in capacities:
            parts.append(None if capacity is None else [s[at : at + steps] for s in sizes])
            at += 0 if capacity is None else steps
        return parts[0], parts[1]

    def _keep(self, worker: _Worker, requests: list[Request]) -> None:
        """Keep ``requests`` for the guard and the warms, letting the oldest go: those
        out of the window, then as many as the bounds in number and blocks ask (counted)."""
        buffer, settings = worker.buffer, self.settings
        buffer.extend(requests)
        worker.kept_blocks += sum(len(request.blocks) for request in requests)
        oldest = self._clock - settings.shadow_window_s
        while buffer and buffer[0].ts < oldest:
            _let_go_oldest(worker)
        while buffer and (
            len(buffer) > settings.shadow_max_requests
            or worker.kept_blocks > settings.shadow_max_kept_blocks
        ):
            _let_go_oldest(worker)
            worker.kept_dropped += 1

    def _drain_apart(self) -> None:
        """Replay what every worker's rebuilder has gathered (before a read)."""
        self._one_hold_per_worker(
            lambda worker_id, worker: self._take_guarded(worker_id, worker, worker.rebuilder.drain)
        )

    def _one_hold_per_worker(self, step: Callable[[str, _Worker], None]) -> None:
        """``step`` for each worker still known, one worker per hold of the lock: a batch
        waits for one worker's gather, not every worker's."""
        with self._lock:
            workers = list(self._workers.items())
        for worker_id, worker in workers:
            with self._lock:
                if self._workers.get(worker_id) is worker:
                    step(worker_id, worker)

    def _take_guarded(
        self, worker_id: str, worker: _Worker, rebuild: Callable[[], Rebuilt]
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
            groups: dict[int, list[tuple[str, _Worker]]] = {}
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

    def _group(self, capacity: int, members: list[tuple[str, _Worker]]) -> GroupView:
        seen_ratio = self._own_ratio(w for _, w in members)
        seen = sum((w.seen_all.totals(self._clock) for _, w in members), Totals())
        curves = []
        for name in self.policies:
            points = []
            for i, multiple in enumerate(self.multiples):
                totals = sum(
                    (w.ladders[name].counts[i].totals(self._clock) for _, w in members), Totals()
                )
                est = totals.estimate(seen_ratio)
                held = sum(w.ladders[name].caches[i].capacity for _, w in members)
                points.append(
                    CurvePoint(
                        multiple=multiple,
                        capacity=round(capacity * multiple),
                        hit_ratio=est.hit_ratio,
                        ci_low=est.ci_low,
                        ci_high=est.ci_high,
                        accesses=est.accesses,
                        sampled_hit_ratio=est.sampled_ratio,
                        miniature_blocks=held,
                    )
                )
            curves.append(PolicyCurve(name, points))
        # Every cache of a worker serves every sampled request: any one counts them.
        sampled = sum((w.ladders[WA].counts[0].totals(self._clock) for _, w in members), Totals())
        requests = sum(w.requests for _, w in members)
        runs = [w.runs.totals(self._clock) for _, w in members]
        whole_runs, incomplete = sum(r[0] for r in runs), sum(r[1] for r in runs)
        return GroupView(
            capacity=capacity,
            workers=[worker_id for worker_id, _ in members],
            requests_seen=requests,
            accesses_seen=sum(w.accesses for _, w in members),
            sampled_requests=int(sampled.requests),
            sampled_accesses=int(sampled.accesses),
            incomplete_runs=incomplete,
            whole_requests=all(w.declares_whole for _, w in members)
            and _few_incomplete(whole_runs, incomplete),
            observed_hit_ratio=seen.hit_ratio or 0.0,
            sampled_observed_hit_ratio=sampled.seen_ratio or 0.0,
            sampled_request_blocks=sampled.accesses / sampled.requests if sampled.requests else 0.0,
            curves=curves,
            capped_workers=[worker_id for worker_id, w in members if w.capped],
            kept_requests_dropped=sum(w.kept_dropped for _, w in members),
            forgotten_subtrees=sum(w.ladders[WA].counts[0].forgotten_subtrees for _, w in members),
        )

    def miniatures(self, worker_id: str) -> list[MiniCache]:
        """Every miniature cache of ``worker_id`` (none before its capacity is known)."""
        self._drain_apart()
        with self._lock:
            worker = self._workers.get(worker_id)
            if worker is None:
                return []
            return [cache for ladder in worker.ladders.values() for cache in ladder.caches]

    def _own_ratio(self, workers: Iterable[_Worker]) -> float | None:
        """The workers' own hit ratio over every whole request, each read over the span its
        curves cover (None: no access, or a rate of 1, where the sample is the traffic)."""
        if self.sampler.rate >= 1:
            return None
        totals = sum(
            (w.seen_all.totals(self._clock, since=w.curves_since) for w in workers), Totals()
        )
        return totals.hit_ratio

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
            whole = [w for w in self._workers.values() if w.capacity is not None and _whole(w, now)]
            seen_ratio = self._own_ratio(whole)
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
            work = [self._guard_work(w, limit) for w in known if _whole(w, self._clock)]
        if known and not work:
            verdict = _unjudgeable(len(known), in_force, self.settings.guard_margin)
        else:
            verdict = compare(work, names, candidate, in_force, self.settings)
        with self._lock:
            self._guard = verdict
        return verdict

    def _guard_work(self, worker: _Worker, max_accesses: int) -> GuardWork:
        size = worker.share.capacity(worker.capacity or 0)
        return GuardWork(
            size,
            _newest(worker.buffer, max_accesses),
            ghost_share(worker.capacity or 0, worker.reuse_ghost, size),
        )


def _let_go_oldest(worker: _Worker) -> None:
    """Let the oldest request ``worker`` keeps go."""
    worker.kept_blocks -= len(worker.buffer.popleft().blocks)
    worker.buffer_dropped = True


def _whole(worker: _Worker, now: float) -> bool:
    """Whether ``worker``'s events rebuild into its requests: it says it reports them
    whole, and few of its runs in the window ending at ``now`` were incomplete."""
    return worker.declares_whole and _few_incomplete(*worker.runs.totals(now))


def _few_incomplete(requests: int, incomplete: int) -> bool:
    """Whether ``incomplete`` runs are at most ``GUARD_MAX_INCOMPLETE_SHARE`` of all."""
    return incomplete <= GUARD_MAX_INCOMPLETE_SHARE * (requests + incomplete)


def _unjudgeable(workers: int, in_force: PolicyDocument | None, margin: float) -> GuardView:
    """The verdict when no worker's events rebuild into whole requests."""
    return GuardView(
        "waiting",
        f"waiting: the events of {workers} worker(s) do not rebuild into whole requests "
        "(an agent that does not report requests whole, as SGLang's, or more than "
        f"{GUARD_MAX_INCOMPLETE_SHARE:.0%} of runs incomplete); published unjudged",
        in_force_version=in_force.version if in_force is not None else None,
        margin=margin,
        at=time.time(),
    )


def _newest(buffer: deque[Request], max_accesses: int) -> list[Request]:
    """The newest requests of ``buffer`` holding at most ``max_accesses`` accesses (at
    least one request), in time order."""
    out: list[Request] = []
    total = 0
    for request in reversed(buffer):
        total += len(request.blocks)
        if out and total > max_accesses:
            break
        out.append(request)
    out.reverse()
    return out


@dataclass(frozen=True)
class GuardWork:
    """One worker's part of the guard's replay."""

    capacity: int
    """Its miniature capacity."""
    requests: list[Request]
    reuse_ghost: int | None = None
    """The miniature's ghost of reuse classes, None when the worker files none."""


def compare(
    work: list[GuardWork],
    names: tuple[str, ...],
    candidate: PolicyDocument,
    in_force: PolicyDocument | None,
    settings: ShadowSettings,
) -> GuardView:
    """The guard's verdict on ``work`` (per worker: miniature capacity, requests, and the
    ghost of its reuse classes when it files by class)."""
    margin = settings.guard_margin
    sampled = sum(len(r.blocks) for part in work for r in part.requests)
    if in_force is None:
        return GuardView("passed", "no version in force", margin=margin, at=time.time())
    if sampled < settings.guard_min_accesses:
        return GuardView(
            "waiting",
            f"waiting: {sampled:,} sampled accesses in the window, fewer than "
            f"guard_min_accesses ({settings.guard_min_accesses:,}); published unjudged",
            in_force_version=in_force.version,
            margin=margin,
            sampled_accesses=sampled,
            at=time.time(),
        )
    old, new = (_replayed(work, names, doc) for doc in (in_force, candidate))
    passed = new >= old - margin
    words = "passed" if passed else "refused"
    reason = (
        f"{words}: candidate's shadow hit ratio {new:.4f} against {old:.4f} of version "
        f"{in_force.version} in force (margin {margin}, {sampled:,} sampled accesses)"
    )
    return GuardView(
        "passed" if passed else "refused",
        reason,
        in_force_version=in_force.version,
        in_force_hit_ratio=old,
        candidate_hit_ratio=new,
        margin=margin,
        sampled_accesses=sampled,
        at=time.time(),
    )


def _replayed(work: list[GuardWork], names: tuple[str, ...], doc: PolicyDocument) -> float:
    """Hit ratio of ``wa`` under ``doc`` over every worker's requests, each from cold (a
    classing worker's filed by reuse class)."""
    code_of = {name: code for code, name in enumerate(names)}

    def reuse_class_code(code: int) -> int:
        return code_of[reused_name(names[code])]

    hits = accesses = 0
    for part in work:
        wa = WAPolicy(part.capacity, category_names=names, doc=doc)
        classing = None
        if part.reuse_ghost is not None:
            classing = ReuseClassing(ReturnTracker(part.reuse_ghost), reuse_class_code)
        cache = MiniCache(wa, part.capacity, classing)
        for request in part.requests:
            hits += cache.serve(request)
            accesses += len(request.blocks)
    return hits / accesses if accesses else 0.0

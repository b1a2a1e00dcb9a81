"""One worker's part of the shadow evaluation, and the bookkeeping on it alone.

Owns ``WorkerState`` (a worker's rebuilder, its kept requests, its own hits and runs over
the window, its inflow share, its miniatures and those warming), and what is done to one
worker's state with no other's in view: keeping its sampled requests within the window
and the bounds (``keep``, ``let_go_oldest``), sizing each sampled request's miniatures by
the inflow share (``sizes_on_arrival``), keeping that share's horizon on its capacities
(``follow_capacity``), whether its events rebuild into whole requests (``is_whole``) and
its part of the guard's replay (``guard_work``). The evaluator calls each with its lock
held: this module must never take the lock, log, or reach another worker's state, Redis
or the wire.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from agent.policy_document import BUILTIN_POLICY, PolicyDocument
from controlplane.shadow.estimator import RunCounts, WindowCounts
from controlplane.shadow.guard import GuardWork, few_incomplete, newest
from controlplane.shadow.inflow import InflowShare
from controlplane.shadow.miniatures import (
    Ladder,
    Miniatures,
    Modeled,
    Warming,
    ghost_share,
)
from controlplane.shadow.rebuild import Request, RequestRebuilder, Seen
from controlplane.shadow.settings import ShadowSettings

Sizes = tuple[list[list[int]] | None, list[list[int]] | None]
"""Each sampled request's miniature sizes per ladder step, for the worker's miniatures
and for those warming (None: it has none)."""


@dataclass
class WorkerState:
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

    def target(self) -> Modeled | None:
        """What its miniatures stand for, or will once warm (None: nothing yet)."""
        if self.warming is not None:
            return self.warming.modeled
        return self.miniatures.modeled if self.miniatures is not None else None


def keep(
    worker: WorkerState, requests: list[Request], clock: float, settings: ShadowSettings
) -> None:
    """Keep ``requests`` for the guard and the warms, letting the oldest go: those
    out of the window ending at ``clock``, then as many as the bounds in number and blocks
    ask (counted)."""
    buffer = worker.buffer
    buffer.extend(requests)
    worker.kept_blocks += sum(len(request.blocks) for request in requests)
    oldest = clock - settings.shadow_window_s
    while buffer and buffer[0].ts < oldest:
        let_go_oldest(worker)
    while buffer and (
        len(buffer) > settings.shadow_max_requests
        or worker.kept_blocks > settings.shadow_max_kept_blocks
    ):
        let_go_oldest(worker)
        worker.kept_dropped += 1


def let_go_oldest(worker: WorkerState) -> None:
    """Let the oldest request ``worker`` keeps go."""
    worker.kept_blocks -= len(worker.buffer.popleft().blocks)
    worker.buffer_dropped = True


def sizes_on_arrival(
    worker: WorkerState, seen: Seen, sampled: list[Request], multiples: tuple[float, ...]
) -> Sizes:
    """Tell the worker's inflow share every request's inflow, in order, and return
    each sampled request's miniature sizes (per ladder step of ``multiples``) as the share
    stands once it is in (``InflowShare.tell``), for its miniatures and for those warming
    (None: it has none)."""
    warming = worker.warming
    capacities = [worker.capacity, warming.capacity if warming is not None else None]
    fulls = [round(c * m) for c in capacities if c is not None for m in multiples]
    sizes = worker.share.tell(
        seen.accesses - seen.hits,
        seen.sampled,
        [len(r.blocks) - r.seen_hits for r in sampled],
        fulls,
    )
    steps, at = len(multiples), 0
    parts: list[list[list[int]] | None] = []
    for capacity in capacities:
        parts.append(None if capacity is None else [s[at : at + steps] for s in sizes])
        at += 0 if capacity is None else steps
    return parts[0], parts[1]


def follow_capacity(worker: WorkerState, multiples: tuple[float, ...]) -> None:
    """The worker's inflow share keeps what the ladder's top step needs at the
    capacity its miniatures stand for, and at the one they warm for (the old and the
    new are sized by it meanwhile): no more, once a warm is installed or put aside."""
    capacities = (worker.capacity, worker.warming.capacity if worker.warming else None)
    known = [c for c in capacities if c is not None]
    worker.share.horizon = round(max(known, default=0) * max(multiples))


def is_whole(worker: WorkerState, now: float) -> bool:
    """Whether ``worker``'s events rebuild into its requests: it says it reports them
    whole, and few of its runs in the window ending at ``now`` were incomplete."""
    return worker.declares_whole and few_incomplete(*worker.runs.totals(now))


def guard_work(worker: WorkerState, max_accesses: int) -> GuardWork:
    """``worker``'s part of the guard's replay: its newest kept requests, at most
    ``max_accesses`` accesses, at its miniature capacity."""
    size = worker.share.capacity(worker.capacity or 0)
    modeled = worker.miniatures.modeled if worker.miniatures is not None else Modeled(0)
    return GuardWork(
        size,
        newest(worker.buffer, max_accesses),
        ghost_share(worker.capacity or 0, worker.reuse_ghost, size),
        modeled.supersedes,
    )

"""A worker's miniatures started afresh at a new capacity: built and warmed off the
evaluator's lock, then put in the old ones' place.

Owns the swap's steps: what the new miniatures warm from (``begin_warming``: the window's
kept requests at the sizes the inflow share gives now), the warm itself with the lock
released and its catch-up on what came meanwhile in bounded holds (``warm``,
``CATCH_UP_UNDER_LOCK``, ``CATCH_UP_ROUNDS``), and the swap (``install``). The evaluator
decides when a worker warms and logs a warm that fails; this module must never hold the
lock through a warm, log, rebuild requests or talk to Redis.
"""

from __future__ import annotations

import math

from controlplane.shadow.fair_lock import FairLock
from controlplane.shadow.miniatures import Modeled, Warming
from controlplane.shadow.rebuild import CategoryTable
from controlplane.shadow.sampler import PrefixSampler
from controlplane.shadow.settings import ShadowSettings
from controlplane.shadow.worker import WorkerState, follow_capacity

CATCH_UP_UNDER_LOCK = 1024
"""Sampled accesses that came while new miniatures warmed, at most, replayed into them
with the lock held as they replace the old ones (about 1 us per access in each of the 20
miniatures of the default settings: a few tens of milliseconds); more are replayed with
the lock released first."""
CATCH_UP_ROUNDS = 8
"""Times new miniatures catch up with the lock released before the rest is replayed
with it held (what comes during each round is less than the round replayed, unless the
shadow cannot keep up with the traffic)."""


def begin_warming(
    worker: WorkerState,
    modeled: Modeled,
    settings: ShadowSettings,
    multiples: tuple[float, ...],
    sampler: PrefixSampler,
    names: list[str],
) -> Warming:
    """What new miniatures standing for ``modeled`` are warmed from, as it stands
    now (under the lock). They replay the window's requests still kept, at the sizes
    the inflow share gives now. When the buffer has let some go, they are counted from
    the first whole time bucket after the oldest kept (the workers' own hits are read
    from there on, so both cover the same span; the requests before it only warm the
    caches); else all of them."""
    fulls = [round(modeled.capacity * m) for m in multiples]
    requests = list(worker.buffer)
    counted_from = None
    if requests and worker.buffer_dropped:
        bucket_s = settings.shadow_window_s / settings.shadow_buckets
        counted_from = (math.floor(requests[0].ts / bucket_s) + 1) * bucket_s
    worker.warming = Warming(
        modeled,
        nominal=[sampler.scaled(full) for full in fulls],
        sizes=[worker.share.capacity(full) for full in fulls],
        doc=worker.doc,
        names=list(names),
        requests=requests,
        curves_since=counted_from,
    )
    follow_capacity(worker, multiples)
    return worker.warming


def warm(
    worker: WorkerState,
    warming: Warming,
    lock: FairLock,
    table: CategoryTable,
    settings: ShadowSettings,
    multiples: tuple[float, ...],
) -> None:
    """Warm ``warming`` with the lock released, catch it up on what came meanwhile
    (with the lock released while more than ``CATCH_UP_UNDER_LOCK`` accesses wait, at
    most ``CATCH_UP_ROUNDS`` times), then put it in the old miniatures' place, unless
    a later change (or forgetting the worker) put it aside. A failure puts it aside
    too (the next heartbeat starts another) and is raised (``set_capacities`` logs it)."""
    try:
        # Off the lock, the new miniatures read only what is theirs (the category names
        # as they stood when it began, each request's reuse class read from them).
        warming.warm(settings)
        for rounds in range(CATCH_UP_ROUNDS + 1):
            with lock:
                if worker.warming is not warming:
                    return
                last = rounds == CATCH_UP_ROUNDS
                if last or warming.pending_accesses() <= CATCH_UP_UNDER_LOCK:
                    install(worker, warming, table.names, multiples)
                    return
                items, warming.pending = warming.pending, []
                names = list(table.names)
            warming.catch_up(items, names)
    except BaseException:
        with lock:
            if worker.warming is warming:
                worker.warming = None
                follow_capacity(worker, multiples)
        raise


def install(
    worker: WorkerState, warming: Warming, names: list[str], multiples: tuple[float, ...]
) -> None:
    """``warming``, caught up on what is left, in place of the worker's miniatures."""
    warming.catch_up(warming.pending, names)
    worker.miniatures, worker.warming = warming.miniatures, None
    follow_capacity(worker, multiples)

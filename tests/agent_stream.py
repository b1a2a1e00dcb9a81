"""A trace as the wire batches an agent would send for it: the worker replays the trace
through its own evictor (the replay semantics), the engine's raw events (HIT for touched
blocks, FREE for every released block tail first, EVICT for victims) are resolved by the
agent's real ``AccessHistory`` and cut into batches, as the publisher does. For the shadow
evaluation's tests and benchmark."""

from __future__ import annotations

from itertools import compress

import numpy as np

from agent.history import AccessHistory
from agent.policies import create
from agent.policy_document import PolicyDocument
from agent.wire import EventBatch, EventKind, RawEvents
from controlplane.traces.model import Trace

HIT, FREE, EVICT = int(EventKind.HIT), int(EventKind.INSERT), int(EventKind.EVICT)


def raw_events(trace: Trace, capacity: int, policy: str = "lru") -> RawEvents:
    """Every raw event of the worker's replay of ``trace`` at ``capacity``."""
    evictor = create(policy, capacity)
    hashes = trace.hashes[trace.blocks].tolist()
    offsets, times = trace.offsets.tolist(), trace.timestamps.tolist()
    cats = trace.categories.tolist()
    ts: list[float] = []
    block: list[int] = []
    cat: list[int] = []
    off: list[int] = []
    kind: list[int] = []

    def record(k: int, t: float, blocks: list[int], c: int, positions: list[int]) -> None:
        ts.extend([t] * len(blocks))
        block.extend(blocks)
        cat.extend([c] * len(blocks))
        off.extend(positions)
        kind.extend([k] * len(blocks))

    for r in range(trace.n_requests):
        req = hashes[offsets[r] : offsets[r + 1]]
        n, now, c = len(req), times[r], cats[r]
        flags = [b in evictor for b in req]
        if any(flags):
            touched = list(compress(req, flags))
            evictor.touch(touched, now)
            record(HIT, now, touched, c, list(compress(range(n), flags)))
        released, positions = req[::-1], list(range(n - 1, -1, -1))
        evictor.free(released, positions, now, c)
        record(FREE, now, released, c, positions)
        excess = len(evictor) - capacity
        if excess > 0:
            victims = evictor.evict(excess)
            record(EVICT, now, victims, 0, [-1] * len(victims))
    return RawEvents(
        np.array(ts, np.float64),
        np.array(block, np.int64),
        np.array(cat, np.int32),
        np.array(off, np.int32),
        np.array(kind, np.uint8),
    )


def agent_batches(
    trace: Trace, capacity: int, *, batch_events: int = 4096, worker: str = "w1"
) -> list[EventBatch]:
    """The resolved batches of ``raw_events``, ``batch_events`` raw events each."""
    raw = raw_events(trace, capacity)
    history = AccessHistory(ghost_size=capacity)
    batches = []
    for lo in range(0, len(raw), batch_events):
        events = history.resolve(raw.rows(lo, lo + batch_events), unknown_category=0)
        batches.append(
            EventBatch.of(
                events,
                worker=worker,
                seq=len(batches) + 1,
                epoch="e1",
                categories=trace.category_names,
            )
        )
    return batches


def fitted_document(trace: Trace, version: int = 1) -> PolicyDocument:
    """The controller's fit of ``trace``'s whole span, by the trace's category labels."""
    from controlplane.fit.settings import FitSettings
    from controlplane.replay.accesses import access_columns
    from controlplane.replay.online import CensoredRefitter

    span = float(trace.timestamps[-1] - trace.timestamps[0]) + 1.0
    refitter = CensoredRefitter(trace.category_names, FitSettings(window_s=span))
    cols = access_columns(trace, trace.categories, "last")
    refitter.ingest(cols, slice(0, len(cols)))
    doc = refitter.document(float(trace.timestamps[-1]), version)
    assert doc is not None, "the trace has no accesses"
    return doc

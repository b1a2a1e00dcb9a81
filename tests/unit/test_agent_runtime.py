"""The agent's engine-thread side without a network: the bounded recorder, the access
history, the category table and the events the ``Agent`` hooks record."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from agent.category_table import OTHER_CATEGORY, CategoryTable
from agent.policies.lru import LRUPolicy
from agent.policies.wa import WAPolicy
from agent.policy_document import CategoryParams, PolicyDocument
from agent.recorder import EventRecorder
from agent.reuse_classes import ReturnTracker
from agent.runtime.agent import Agent
from agent.settings import AgentSettings
from agent.wire import COLUMNS, MAX_CATEGORY_NAME_CHARS, EventKind, Events, RawEvents
from controlplane.dev.simworker import TraceWorker
from controlplane.replay.engine import replay_hits
from controlplane.replay.online import build
from controlplane.replay.options import ReplayOptions
from controlplane.traces.model import Trace

# A port nothing listens on: an agent that is never started must not use it anyway.
OFFLINE = AgentSettings(redis_url="redis://127.0.0.1:9/0", evictor="lru", worker_id="t")
FIELDS = [name for name, _ in COLUMNS]


def record_n(rec: EventRecorder, blocks: Sequence[int], kind: int = 0) -> int:
    return rec.record(kind, 1.0, blocks, 0, range(len(blocks)))


def test_recorder_keeps_at_most_half_per_side_and_counts_drops() -> None:
    rec = EventRecorder(capacity=10, batch_events=4)
    assert rec.half == 5
    assert record_n(rec, [1, 2, 3]) == 3
    assert record_n(rec, [4, 5, 6, 7]) == 2  # only two fit
    assert record_n(rec, [8]) == 0
    assert (rec.recorded, rec.dropped, rec.pending) == (8, 3, 5)
    cols = rec.drain()
    assert cols.block.tolist() == [1, 2, 3, 4, 5]
    assert cols.offset.tolist() == [0, 1, 2, 0, 1]
    # The engine records into the other half while the drained one is read.
    assert record_n(rec, [9, 10]) == 2
    assert cols.block.tolist() == [1, 2, 3, 4, 5]
    assert rec.drain().block.tolist() == [9, 10]
    assert len(rec.drain()) == 0
    assert rec.recorded == rec.dropped + 7


def test_recorder_columns_broadcast_scalars_and_keep_arrays() -> None:
    rec = EventRecorder(capacity=100, batch_events=10)
    rec.record(EventKind.EVICT, 5.5, [10, 11], 3, -1)
    rec.record(EventKind.HIT, 6.0, np.array([12], np.int64), 1, np.array([4], np.int32))
    c: RawEvents = rec.drain()
    assert c.ts.tolist() == [5.5, 5.5, 6.0]
    assert c.kind.tolist() == [2, 2, 0]
    assert c.block.tolist() == [10, 11, 12]
    assert c.category.tolist() == [3, 3, 1]
    assert c.offset.tolist() == [-1, -1, 4]


def test_recorder_refuses_a_wrong_offset_count_whole_and_keeps_what_it_holds() -> None:
    rec = EventRecorder(capacity=100, batch_events=10)
    rec.record(EventKind.HIT, 1.0, [10, 11], 3, [0, 1])
    with pytest.raises(ValueError, match="1 offsets for 2 events"):
        rec.record(EventKind.INSERT, 2.0, [12, 13], 3, [2])
    rec.record(EventKind.INSERT, 3.0, [14], 3, 2)
    c: RawEvents = rec.drain()
    assert c.block.tolist() == [10, 11, 14]
    assert c.offset.tolist() == [0, 1, 2]
    assert c.ts.tolist() == [1.0, 1.0, 3.0]
    assert rec.pending == 0


def test_a_block_id_out_of_int64_is_refused_and_counted_without_breaking_the_buffer() -> None:
    """An unsigned hash (vLLM's other form) once made every second drain fail for good,
    the half never emptied, its events counted nowhere."""
    rec = EventRecorder(capacity=16, batch_events=4)
    record_n(rec, [1, 2**64 - 1, 3])
    cols = rec.drain()
    assert cols.block.tolist() == [1, 3] and cols.offset.tolist() == [0, 2]
    assert rec.dropped == 1
    for round_ in range(4):  # both halves keep working, and stay bounded
        record_n(rec, [10 + round_, 11 + round_])
        assert rec.drain().block.tolist() == [10 + round_, 11 + round_]
    assert rec.recorded == 11 and rec.dropped == 1


def test_recorder_wakes_the_publisher_once_per_full_batch() -> None:
    woken: list[int] = []
    rec = EventRecorder(capacity=100, batch_events=4, on_batch=lambda: woken.append(rec.pending))
    record_n(rec, [1, 2])
    assert woken == []
    record_n(rec, [3, 4, 5])
    record_n(rec, [6])
    assert woken == [5]
    rec.drain()
    record_n(rec, [1, 2, 3, 4])
    assert woken == [5, 4]


def test_category_table_grows_then_shares_other() -> None:
    seen: list[tuple[str, int]] = []
    t = CategoryTable(max_size=3, on_new=lambda name, code: seen.append((name, code)))
    assert [t.code("a"), t.code("b"), t.code("a")] == [0, 1, 0]
    assert t.code("c") == t.code("d") == 2
    assert t.snapshot() == ("a", "b", OTHER_CATEGORY)
    assert seen == [("a", 0), ("b", 1), (OTHER_CATEGORY, 2)]


def test_a_name_longer_than_the_wire_allows_shares_other() -> None:
    t = CategoryTable(max_size=8)
    long = "x" * (MAX_CATEGORY_NAME_CHARS + 1)
    assert t.code("a") == 0
    assert t.code(long) == t.code(OTHER_CATEGORY) == 1
    assert long not in t.snapshot()  # the controller would refuse every batch naming it


def drained(agent: Agent) -> Events:
    """What the publisher would send: the recorder drained and resolved (offline)."""
    chunks = agent.publisher.collect()
    return Events(*(np.concatenate([getattr(c, f) for c in chunks] or [[]]) for f in FIELDS))


def test_agent_hooks_record_hit_insert_evict_events() -> None:
    agent = Agent(OFFLINE, capacity=3)
    agent.free([12, 11, 10], [2, 1, 0], 1.0, "text_1")  # a miss: three inserts
    agent.touch([10, 11], 2.0, "text_2")  # prefix hit
    agent.free([13, 11, 10], [2, 1, 0], 2.0, "text_2")
    victims = agent.evict(len(agent.policy) - agent.capacity, 2.0)
    assert victims == [12]  # LRU: the first request's tail
    c = drained(agent)
    names = agent.categories.snapshot()
    assert names == ("unknown", "text_1", "text_2")  # "unknown" is always code 0
    kinds = [EventKind(k).name for k in c.kind.tolist()]
    assert kinds == ["INSERT"] * 3 + ["HIT"] * 2 + ["INSERT", "EVICT"]
    assert c.block.tolist() == [12, 11, 10, 10, 11, 13, 12]
    assert c.offset.tolist() == [2, 1, 0, 0, 1, 2, -1]
    assert c.category.tolist() == [1, 1, 1, 2, 2, 2, 1]
    assert c.ts.tolist() == [1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 2.0]
    # A hit knows the previous access; an eviction reports the block's last one.
    assert c.prev_ts[3:5].tolist() == [1.0, 1.0] and c.prev_category[3:5].tolist() == [1, 1]
    assert np.isnan(c.prev_ts[5]) and c.prev_category[5] == -1
    assert c.prev_ts[6] == 1.0 and c.prev_category[6] == 1
    assert (agent.hits, agent.accesses) == (2, 6)
    # Nine raw operations recorded; the release of the two held blocks is not an event.
    assert agent.recorder.recorded == 9 and agent.publisher.filtered == 2
    assert agent.events_dropped == 0
    agent.close()


def test_agent_accepts_numpy_block_arrays() -> None:
    agent = Agent(OFFLINE, capacity=10)
    agent.free(np.array([3, 2, 1], dtype=np.int64), np.array([2, 1, 0]), 1.0, "a")
    agent.touch(np.array([1, 2], dtype=np.int64), 2.0, "a")
    assert 1 in agent.policy and agent.hits == 2
    assert drained(agent).block.tolist() == [3, 2, 1, 1, 2]


def test_agent_hands_the_evictor_its_own_category_codes() -> None:
    class NumberingLRU(LRUPolicy):
        """An evictor that numbers categories itself, from 100."""

        def __init__(self) -> None:
            super().__init__()
            self.codes: dict[str, int] = {}
            self.freed: list[int] = []

        def add_category(self, name: str) -> int:
            return self.codes.setdefault(name, 100 + len(self.codes))

        def free(
            self, blocks: Sequence[int], offsets: Sequence[int], now: float, category: int
        ) -> None:
            self.freed.append(category)
            super().free(blocks, offsets, now, category)

    ev = NumberingLRU()
    agent = Agent(OFFLINE, capacity=10, policy=ev)
    agent.free([1], [0], 1.0, "b")
    agent.free([2], [0], 1.0, "a")
    agent.free([3], [0], 1.0, "b")
    assert ev.freed == [101, 102, 101]  # 100 is "unknown", registered first
    assert drained(agent).category.tolist() == [1, 2, 1]  # the wire keeps the agent's codes


def test_full_buffer_drops_and_counts_without_a_publisher() -> None:
    settings = OFFLINE.model_copy(update={"buffer_events": 16, "batch_events": 4})
    agent = Agent(settings, capacity=1000)
    for i in range(10):
        agent.free([i * 3 + 2, i * 3 + 1, i * 3], [2, 1, 0], float(i), "a")
    assert agent.recorder.recorded == 30
    assert agent.events_dropped == 30 - 8  # one half of 8 holds events; the rest drop
    assert len(drained(agent)) == 8


def _random_requests(
    rng: np.random.Generator, n: int, *, blocks: int, longest: int
) -> tuple[list[list[int]], list[str]]:
    """``n`` requests of 1 to ``longest`` distinct blocks among ``blocks``, typed text or
    image at random."""
    requests = [
        [int(x) for x in rng.choice(blocks, size=int(rng.integers(1, longest + 1)), replace=False)]
        for _ in range(n)
    ]
    return requests, [str(t) for t in rng.choice(["text", "image"], size=n)]


def test_simulated_worker_hits_equal_the_offline_replay() -> None:
    rng = np.random.default_rng(7)
    requests, types = _random_requests(rng, 300, blocks=40, longest=7)
    turns = [int(t) for t in rng.integers(1, 3, size=300)]
    trace = Trace.from_requests(requests, types=types, turns=turns)
    want = int(replay_hits(trace, LRUPolicy(), 25).sum())
    agent = Agent(OFFLINE.model_copy(update={"buffer_events": 1 << 16}), capacity=25)
    result = TraceWorker(agent, trace, speed=1e9).run()
    assert result.requests == 300 and result.loops == 1
    assert result.agent.hits == want
    assert result.agent.accesses == trace.n_accesses
    c = drained(agent)
    inserts = int((c.kind == EventKind.INSERT).sum())
    evicts = int((c.kind == EventKind.EVICT).sum())
    assert inserts - evicts == len(agent.policy) <= 25
    assert set(agent.categories.snapshot()) == {"unknown", *trace.category_names}
    assert np.all(np.diff(c.ts) >= 0)


def test_worker_loop_shifts_time_and_stops() -> None:
    trace = Trace.from_requests([[1, 2], [2, 3]], timestamps=[0.0, 1.0])
    agent = Agent(OFFLINE, capacity=10)
    worker = TraceWorker(agent, trace, speed=1000.0, loop=True)
    seen: list[int] = []

    def progress(p: object) -> None:
        seen.append(worker.requests)
        if worker.requests >= 9:
            worker.stop.set()

    result = worker.run(progress, every_s=0.0)
    assert result.requests == 9 and result.loops == 4
    assert seen == list(range(1, 10))
    ts = drained(agent).ts
    assert np.all(np.diff(ts) >= 0)
    # Each round is the span (1 s) plus one mean gap (1 s) later, at 1000x speed: the
    # ninth request is round 4's first, 8 trace seconds after the start.
    assert ts[-1] - ts[0] == pytest.approx(0.008, abs=1e-5)


def test_speed_must_be_positive() -> None:
    trace = Trace.from_requests([[1]])
    with pytest.raises(ValueError, match="speed"):
        TraceWorker(Agent(OFFLINE, capacity=1), trace, speed=0)


def test_evicting_blocks_the_agent_never_saw_reports_them_unknown() -> None:
    ev = LRUPolicy()
    ev.free([7, 8], [1, 0], 0.0, 0)  # cached before the agent existed
    agent = Agent(OFFLINE, capacity=10, policy=ev)
    agent.free([1], [0], 1.0, "text_1")
    assert agent.evict(3, 2.0) == [7, 8, 1]
    c = drained(agent)
    names = agent.categories.snapshot()
    assert [names[i] for i in c.category[1:].tolist()] == ["unknown", "unknown", "text_1"]
    assert c.prev_category[1:].tolist() == [-1, -1, 1]
    assert np.isnan(c.prev_ts[1:3]).all() and c.prev_ts[3] == 1.0


# --- reuse classes ---------------------------------------------------------------------

CLASSED = OFFLINE.model_copy(update={"reuse_classes": True, "buffer_events": 1 << 16})


def test_reuse_classes_file_found_blocks_apart_and_report_them() -> None:
    # "a/re" is never reused: with classes, the blocks request 2 found cached go first.
    doc = PolicyDocument(
        version=1,
        categories={"a/re": CategoryParams(rate=1.0, p_reuse=0.0, life_s=0.1)},
        default=CategoryParams(rate=0.01, p_reuse=0.9, life_s=0.1),
    )
    agent = Agent(CLASSED, capacity=10, policy=WAPolicy(doc=doc))
    agent.free([12, 11, 10], [2, 1, 0], 1.0, "a")  # three inserts
    agent.touch([10, 11], 2.0, "a")  # found cached
    agent.free([13, 11, 10], [2, 1, 0], 2.0, "a")
    assert agent.evict(2, 2.0) == [11, 10]
    names = agent.categories.snapshot()
    assert names == ("unknown", "a", "a/re")
    c = drained(agent)
    kinds = [EventKind(k).name for k in c.kind.tolist()]
    assert kinds == ["INSERT"] * 3 + ["HIT"] * 2 + ["INSERT", "EVICT", "EVICT"]
    # HITs carry the reuse class; the evictions report the blocks' last (class) category.
    assert c.category.tolist() == [1, 1, 1, 2, 2, 1, 2, 2]
    assert c.prev_category[3:5].tolist() == [1, 1]
    agent.close()


def test_simulated_worker_with_reuse_classes_equals_the_replay_of_them() -> None:
    # The replay's reuse classes by hit (``ReplayOptions(reuse_class="hit")``) are the
    # agent's: same document, same trace, same hits.
    requests, types = _random_requests(np.random.default_rng(11), 400, blocks=60, longest=8)
    turns = [1] * 400
    trace = Trace.from_requests(requests, [i * 0.5 for i in range(400)], types=types, turns=turns)
    one = {"rate": 0.5, "life_s": 0.1}
    doc = PolicyDocument(
        version=1,
        categories={
            "text_1": CategoryParams(p_reuse=0.9, **one),
            "text_1/re": CategoryParams(p_reuse=0.01, **one),
            "image_1": CategoryParams(p_reuse=0.5, rate=0.05, life_s=0.1),
            "image_1/re": CategoryParams(p_reuse=0.99, rate=0.05, life_s=0.1),
        },
    )
    replayed = build("wa", trace, ReplayOptions(reuse_class="hit", refit_every_s=1e9), capacity=20)
    replayed.inner.set_policy(doc)
    want = replay_hits(trace, replayed, 20)
    unclassed = build("wa", trace, ReplayOptions(refit_every_s=1e9))
    unclassed.inner.set_policy(doc)
    without = replay_hits(trace, unclassed, 20)
    agent = Agent(CLASSED, capacity=20, policy=WAPolicy(doc=doc))
    worker = TraceWorker(agent, trace)
    for r, now in enumerate(trace.timestamps.tolist()):
        worker._request(r, now)  # the worker's request step at trace time, not wall time
    assert agent.hits == int(want.sum()) == 181 != int(without.sum())
    assert set(agent.categories.snapshot()) == {"unknown", *replayed.inner.category_names}


def test_return_tracker_counts_found_and_lately_evicted_blocks_as_returns() -> None:
    tracker = ReturnTracker(ghost_size=2)
    tracker.touched([1, 2])
    assert tracker.returns([2, 3]) == [True, False]
    assert tracker.returns([2]) == [False]  # a release ends the "found" state
    tracker.evicted([4, 5, 6])  # the ghost keeps the two latest: 5, 6
    assert tracker.peek([4, 5, 6]) == [False, True, True]  # peeking changes nothing
    assert tracker.returns([4, 5, 6, 6]) == [False, True, True, False]
    tracker.touched([7])
    assert tracker.returns([1, 7]) == [True, True]  # 1: found, never released until now


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://u:p@ss@h:6379/0", "redis://u:***@h:6379/0"),  # the client reads p@ss
        ("redis://h:6379/0?password=hunter2&db=1", "redis://h:6379/0?password=***&db=1"),
        ("redis://:pw@h/0", "redis://:***@h/0"),
        ("redis://user@h/0", "redis://user@h/0"),
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        ("redis://u:pw@[::1/0", "redis://***"),  # too malformed to split
    ],
)
def test_redact_hides_every_password_the_client_would_read(url: str, shown: str) -> None:
    from agent.runtime.connection import redact

    assert redact(url) == shown

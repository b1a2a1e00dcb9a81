"""The shadow evaluation's parts: the prefix sampler, the request rebuild from wire
events, the windowed estimator, the exactness of a full-rate shadow against the offline
replay, and the refit guard's verdicts."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np
import pytest

from agent.policies import create
from agent.policies.lru import LRUPolicy
from agent.policies.wa import WAPolicy
from agent.policy_document import CategoryParams, PolicyDocument
from agent.reuse_classes import ReturnTracker
from agent.wire import EventBatch, EventKind
from controlplane.replay.engine import replay_hits
from controlplane.shadow.estimator import (
    MIN_REGRESSION_SUBTREES,
    MiniCache,
    ReuseClassing,
    Totals,
    WindowCounts,
)
from controlplane.shadow.evaluator import ShadowEvaluator
from controlplane.shadow.inflow import BAND, KEEP_STEPS, MIN_SEEN, InflowShare
from controlplane.shadow.rebuild import CategoryTable, Rebuilt, Request, RequestRebuilder
from controlplane.shadow.sampler import PrefixSampler
from controlplane.shadow.settings import ShadowSettings
from controlplane.traces.model import Trace
from controlplane.traces.synth import synthesize
from tests.agent_stream import agent_batches, fitted_document
from tests.wire_samples import event_batch

HIT, INSERT = int(EventKind.HIT), int(EventKind.INSERT)


@pytest.fixture(scope="module")
def trace() -> Trace:
    return synthesize("to-c", duration_s=300, qps=3, seed=7)


# --- sampler ---------------------------------------------------------------------------------
def test_sampler_keeps_its_share_and_always_the_same_trees() -> None:
    ids = np.random.default_rng(1).integers(-(2**63), 2**63 - 1, 200_000, dtype=np.int64)
    sampler = PrefixSampler(0.1)
    kept = sampler.keep(ids)
    assert abs(kept.mean() - 0.1) < 0.005
    assert np.array_equal(kept, PrefixSampler(0.1).keep(ids))
    assert not np.array_equal(kept, PrefixSampler(0.1, salt=3).keep(ids))
    assert PrefixSampler(1.0).keep(ids).all()
    assert (PrefixSampler(0.2).keep(ids) | ~kept).all()  # a lower rate keeps a subset
    assert sampler.scaled(1000) == 100 and sampler.scaled(3) == 1


def test_sampler_refuses_a_rate_out_of_range() -> None:
    for rate in (0.0, -0.1, 1.5):
        with pytest.raises(ValueError, match="sampling rate"):
            PrefixSampler(rate)


# --- rebuild ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("batch_events", "min_events"), [(97, 1), (4096, 1), (97, 5000)])
def test_rebuild_gives_back_every_request_of_the_trace(
    trace: Trace, batch_events: int, min_events: int
) -> None:
    capacity = 200
    table = CategoryTable()
    rebuilder = RequestRebuilder(PrefixSampler(1.0), table, min_events=min_events)
    requests = []
    for batch in agent_batches(trace, capacity, batch_events=batch_events):
        requests += rebuilder.feed(batch).sampled
    requests += rebuilder.flush().sampled
    hashes = trace.hashes[trace.blocks]
    offsets = trace.offsets.tolist()
    assert len(requests) == trace.n_requests
    # The leading HIT events are the worker's own prefix hits (its lru at ``capacity``).
    own = replay_hits(trace, create("lru", capacity), capacity)
    assert [r.seen_hits for r in requests] == own.tolist()
    for r, got in enumerate(requests):
        assert got.blocks == hashes[offsets[r] : offsets[r + 1]].tolist()
        assert got.ts == trace.timestamps[r]
        assert table.names[got.category] == trace.category_names[trace.categories[r]]


def test_rebuild_gathers_small_batches_until_drained(trace: Trace) -> None:
    batches = list(agent_batches(trace, 200, batch_events=50))
    rebuilder = RequestRebuilder(PrefixSampler(1.0), CategoryTable(), min_events=10**9)
    assert all(rebuilder.feed(batch).requests == 0 for batch in batches[:40])
    drained = rebuilder.drain()
    one_by_one = RequestRebuilder(PrefixSampler(1.0), CategoryTable())
    expected = [r for batch in batches[:40] for r in one_by_one.feed(batch).sampled]
    assert drained.requests == len(expected) > 0
    assert drained.sampled == expected
    assert rebuilder.drain().requests == 0  # the last run stays held until more come
    assert rebuilder.flush().sampled == one_by_one.flush().sampled


def _rebuild_at_full_rate(batch: EventBatch) -> tuple[RequestRebuilder, Rebuilt, Rebuilt]:
    """A rebuilder that samples every request, fed ``batch`` then flushed: the rebuilder,
    what the feed gave and what the flush gave."""
    rebuilder = RequestRebuilder(PrefixSampler(1.0), CategoryTable())
    return rebuilder, rebuilder.feed(batch), rebuilder.flush()


def test_rebuild_splits_two_requests_of_one_time_and_category() -> None:
    # A: two blocks, both hits. B: five new blocks, released tail first. Same time, same
    # category: the offsets tell them apart.
    batch = event_batch(
        ts=[1.0] * 7,
        block=[10, 11, 24, 23, 22, 21, 20],
        offset=[0, 1, 4, 3, 2, 1, 0],
        kind=[HIT, HIT] + [INSERT] * 5,
    )
    _, first, last = _rebuild_at_full_rate(batch)
    got = first.sampled + last.sampled
    assert [r.blocks for r in got] == [[10, 11], [20, 21, 22, 23, 24]]


def test_rebuild_keeps_a_request_whole_across_its_reuse_classes() -> None:
    # KVWISE_REUSE_CLASSES: the request's HITs are of "a/re", its INSERTs of "a".
    batch = event_batch(
        ts=[1.0] * 4,
        block=[10, 11, 13, 12],
        offset=[0, 1, 3, 2],
        kind=[HIT, HIT, INSERT, INSERT],
        categories=("a", "a/re"),
        category=[1, 1, 0, 0],
    )
    rebuilder, first, last = _rebuild_at_full_rate(batch)
    got = first.sampled + last.sampled
    assert [r.blocks for r in got] == [[10, 11, 12, 13]]
    # The table holds the category beside its reuse class (for a classing miniature wa);
    # the request is of the category.
    assert rebuilder.table.names == ["a", "a/re"]
    assert got[0].category == 0 and rebuilder.table.reuse_class_code(0) == 1


def test_rebuild_drops_a_run_whose_offsets_only_add_up_to_a_whole_request() -> None:
    """Offsets 0, 1, 4, 5, 6, 8 then 6, 5, 1 (2, 3 and 7 lost, 1, 5 and 6 twice) have the
    least, greatest, sum and sum of squares of 0..8: the run once passed as whole, and the
    lost blocks were whatever an uninitialised array held."""
    batch = event_batch(
        ts=[1.0] * 9 + [2.0],
        block=[10, 11, 14, 15, 16, 18, 16, 15, 11, 30],
        offset=[0, 1, 4, 5, 6, 8, 6, 5, 1, 0],
        kind=[HIT] * 6 + [INSERT] * 3 + [INSERT],
    )
    _, first, last = _rebuild_at_full_rate(batch)
    assert (first.incomplete, first.requests) == (1, 0)
    assert [r.blocks for r in last.sampled] == [[30]]


def test_rebuild_drops_and_counts_a_request_missing_its_first_block() -> None:
    batch = event_batch(
        ts=[1.0, 1.0, 2.0, 2.0],
        block=[11, 12, 20, 21],
        offset=[1, 2, 0, 1],
        kind=HIT,
        categories=("a", "b"),
        category=[0, 0, 1, 1],
    )
    rebuilder, first, last = _rebuild_at_full_rate(batch)
    assert (first.incomplete, first.requests) == (1, 0)
    assert [r.blocks for r in last.sampled] == [[20, 21]]
    assert rebuilder.table.names == ["a", "a/re", "b", "b/re"]


def test_rebuild_samples_whole_prefix_trees(trace: Trace) -> None:
    sampler = PrefixSampler(0.3)
    rebuilder = RequestRebuilder(sampler, CategoryTable())
    sampled = []
    for batch in agent_batches(trace, 200):
        sampled += rebuilder.feed(batch).sampled
    sampled += rebuilder.flush().sampled
    hashes = trace.hashes[trace.blocks]
    firsts = hashes[trace.offsets[:-1]]
    expected = int(sampler.keep(firsts).sum())
    assert len(sampled) == expected
    assert 0 < expected < trace.n_requests
    assert sampler.keep(np.array([r.blocks[0] for r in sampled], np.int64)).all()


# --- estimator -------------------------------------------------------------------------------
class _Filing(LRUPolicy):
    """An ``lru`` that remembers the category each released block was filed under."""

    def __init__(self) -> None:
        super().__init__()
        self.filed: list[tuple[int, int]] = []

    def free(
        self, blocks: Sequence[int], offsets: Sequence[int], now: float, category: int
    ) -> None:
        self.filed += [(block, category) for block in blocks]
        super().free(blocks, offsets, now, category)


def test_a_miniature_with_reuse_classes_files_returns_under_w_re() -> None:
    """Found cached, or evicted lately (the ghost), a released block is a return: filed
    under its category's ``w/re`` code; else under ``w``, as the agent files it."""
    filing = _Filing()
    cache = MiniCache(filing, 4, ReuseClassing(ReturnTracker(ghost_size=2), lambda code: code + 3))
    assert cache.serve(Request(0.0, 1, [10, 11, 12])) == 0
    assert cache.serve(Request(1.0, 1, [10, 11, 13, 14])) == 2  # 5 blocks over 4: 12 goes
    assert cache.serve(Request(2.0, 2, [20, 12])) == 0  # 12 is in the ghost
    assert filing.filed == [
        (12, 1), (11, 1), (10, 1),
        (14, 1), (13, 1), (11, 4), (10, 4),
        (12, 5), (20, 2),
    ]  # fmt: skip


def test_window_forgets_buckets_older_than_the_window() -> None:
    counts = WindowCounts(window_s=100.0, buckets=10)
    counts.add(5.0, hits=10, accesses=10, seen=10, subtree=1)
    assert counts.totals(95.0).estimate().hit_ratio == 1.0
    counts.add(150.0, hits=0, accesses=10, seen=0, subtree=2)
    totals = counts.totals(150.0)
    assert totals.estimate().hit_ratio == 0.0  # the first bucket left
    assert (totals.subtrees, totals.products[3]) == (1, 100.0)  # and its subtree with it
    assert counts.totals(400.0) == Totals()  # all gone: every sum back to zero


def test_interval_holds_the_ratio_and_narrows_with_more_subtrees() -> None:
    rng = np.random.default_rng(2)
    small, large = WindowCounts(1e9, 1), WindowCounts(1e9, 1)
    for i in range(4000):
        a = int(rng.integers(1, 20))
        h = int(rng.binomial(a, 0.4))
        large.add(float(i), h, a, h, subtree=i)
        if i < 100:
            small.add(float(i), h, a, h, subtree=i)
    e_small, e_large = small.totals(5000.0).estimate(), large.totals(5000.0).estimate()
    for e in (e_small, e_large):
        assert e.ci_low <= e.hit_ratio <= e.ci_high
        assert e.ci_low < 0.4 < e.ci_high
    assert (e_large.ci_high - e_large.ci_low) < (e_small.ci_high - e_small.ci_low) / 3


def test_a_point_with_no_access_is_all_uncertain() -> None:
    empty = Totals().estimate()
    assert (empty.accesses, empty.hit_ratio, empty.ci_low, empty.ci_high) == (0, 0.0, 0.0, 1.0)


def test_requests_of_one_subtree_count_as_one_draw_in_the_interval() -> None:
    """The sample draws subtrees, not requests: 4,000 requests in 40 subtrees whose hit
    ratios differ give a wider interval than the same requests drawn one by one."""
    rng = np.random.default_rng(3)
    alone, grouped = WindowCounts(1e9, 1), WindowCounts(1e9, 1)
    for i in range(4000):
        subtree = i % 40
        a = 10
        h = int(rng.binomial(a, 0.1 + 0.02 * subtree))
        alone.add(float(i), h, a, h, subtree=i)
        grouped.add(float(i), h, a, h, subtree=subtree)
    e_alone, e_grouped = alone.totals(1e6).estimate(), grouped.totals(1e6).estimate()
    assert e_alone.hit_ratio == e_grouped.hit_ratio
    assert e_grouped.requests == e_alone.requests == 4000
    assert (e_grouped.ci_high - e_grouped.ci_low) > 3 * (e_alone.ci_high - e_alone.ci_low)


def test_totals_add_up_across_workers() -> None:
    one, two = WindowCounts(1e9, 1), WindowCounts(1e9, 1)
    one.add(0.0, 2, 4, 1, subtree=7)
    two.add(0.0, 1, 2, 2, subtree=7)  # another worker's subtree, though the key is alike
    both = one.totals(1.0) + two.totals(1.0)
    assert (both.requests, both.hits, both.accesses, both.seen, both.subtrees) == (2, 3, 6, 3, 2)
    hh, ha, hs, aa, as_, ss = both.products
    assert (hh, aa, ss, ha, hs, as_) == (5, 20, 5, 10, 4, 8)


def test_the_regression_corrects_a_sample_poorer_in_reuse_than_the_traffic() -> None:
    """A cache whose hits per subtree follow the worker's own: when the subtrees drawn
    reuse less than the traffic (the worker says by how much), the estimate moves up by
    what the sample misses, and its interval holds the traffic's figure."""
    rng = np.random.default_rng(5)
    reuse = rng.uniform(0.0, 0.8, size=2000)  # per subtree
    accesses = rng.integers(20, 200, size=2000)
    seen = rng.binomial(accesses, reuse)  # the worker's own hits
    hits = rng.binomial(accesses, np.clip(reuse * 1.1, 0, 1))  # this cache's
    truth = hits.sum() / accesses.sum()
    poor = 1.0 - reuse
    drawn = rng.choice(2000, size=150, replace=False, p=poor / poor.sum())  # poor in reuse
    counts = WindowCounts(1e9, 1)
    for k in drawn.tolist():
        counts.add(0.0, int(hits[k]), int(accesses[k]), int(seen[k]), subtree=k)
    totals = counts.totals(1.0)
    raw = totals.estimate()
    moved = totals.estimate(seen_ratio=float(seen.sum() / accesses.sum()))
    assert raw.hit_ratio < truth - 0.05
    assert abs(moved.hit_ratio - truth) < (truth - raw.hit_ratio) / 5
    assert moved.sampled_ratio == raw.hit_ratio
    assert moved.ci_low <= truth <= moved.ci_high


# --- exactness -------------------------------------------------------------------------------
def _shadow_at_full_rate(
    trace: Trace,
    capacity: int,
    doc: PolicyDocument,
    reuse_ghost: int | None = None,
    supersedes: bool = False,
) -> ShadowEvaluator:
    """Worker ``w1`` of ``capacity`` blocks (``reuse_ghost``, and whether its eviction runs
    the ``supersede`` rule) shadowed with every request sampled, in one window, and the
    guard replaying all of it: the offline replay's twin."""
    settings = ShadowSettings(
        shadow_rate=1.0,
        shadow_policies="lru,s3fifo,arc",
        shadow_ladder="0.5,1,2",
        shadow_window_s=1e9,
        shadow_buckets=1,
        shadow_max_requests=trace.n_requests,
        guard_max_accesses=trace.n_accesses,
    )
    shadow = ShadowEvaluator(settings)
    shadow.set_capacities({"w1": capacity}, {"w1": True}, {"w1": reuse_ghost}, {"w1": supersedes})
    shadow.set_policy(doc)
    for batch in agent_batches(trace, capacity, batch_events=1000):
        shadow.apply(batch)
    shadow.flush("w1")
    return shadow


def test_full_rate_shadow_equals_the_offline_replay(trace: Trace) -> None:
    capacity = 300
    doc = fitted_document(trace)
    view = _shadow_at_full_rate(trace, capacity, doc).view()
    (group,) = view.groups
    assert group.accesses_seen == trace.n_accesses
    assert group.requests_seen == trace.n_requests
    assert group.whole_requests and group.incomplete_runs == 0
    curves = {c.policy: c.points for c in group.curves}
    assert set(curves) == {"wa", "lru", "s3fifo", "arc"}
    for name, points in curves.items():
        for point in points:
            size = point.capacity
            if name == "wa":
                policy = WAPolicy(size, category_names=trace.category_names, doc=doc)
            else:
                policy = create(name, size)
            hits = int(replay_hits(trace, policy, size).sum())
            assert point.accesses == trace.n_accesses
            assert point.hit_ratio == hits / trace.n_accesses, (name, size)
            assert point.ci_low <= point.hit_ratio <= point.ci_high


def test_each_point_says_how_many_blocks_its_miniatures_hold(trace: Trace) -> None:
    """A vLLM user's 64-block engine got miniatures of about 3 blocks at the default rate,
    whose curves said nothing, and nothing in the view told so: each point now says what
    its miniatures hold (at rate 1, the full size), the group how long a sampled request
    is."""
    shadow = _shadow_at_full_rate(trace, 300, fitted_document(trace))
    (group,) = shadow.view().groups
    assert group.sampled_request_blocks == pytest.approx(trace.n_accesses / trace.n_requests)
    for curve in group.curves:
        assert [p.miniature_blocks for p in curve.points] == [150, 300, 600], curve.policy


def test_full_rate_shadow_of_a_classing_worker_files_as_the_worker_does(trace: Trace) -> None:
    """A worker whose heartbeat says it files by reuse class: the shadow's ``wa`` at each
    ladder step files a release under ``w/re`` when its own miniature found the block
    cached or evicted it lately (a ghost of the worker's ghost-to-capacity share), as a
    direct replay of that rule scores it; without the heartbeat's word it does not."""
    capacity, ghost = 300, 600
    doc = _with_reuse_classes(fitted_document(trace))
    classing = _shadow_at_full_rate(trace, capacity, doc, reuse_ghost=ghost).view()
    plain = _shadow_at_full_rate(trace, capacity, doc).view()
    (wa,) = (c.points for c in classing.groups[0].curves if c.policy == "wa")
    (wa_plain,) = (c.points for c in plain.groups[0].curves if c.policy == "wa")
    for point in wa:
        size = point.capacity
        hits = _hits_filing_by_reuse_class(trace, doc, size, round(size * ghost / capacity))
        assert point.hit_ratio == hits / trace.n_accesses, size
    assert [p.hit_ratio for p in wa] != [p.hit_ratio for p in wa_plain]


def test_guard_replays_a_classing_worker_by_reuse_class(trace: Trace) -> None:
    capacity, ghost = 300, 600
    doc = _with_reuse_classes(fitted_document(trace))
    shadow = _shadow_at_full_rate(trace, capacity, doc, reuse_ghost=ghost)
    verdict = shadow.judge(doc.model_copy(update={"version": 9}), doc)
    filed = _hits_filing_by_reuse_class(trace, doc, capacity, ghost) / trace.n_accesses
    assert verdict.in_force_hit_ratio == filed == verdict.candidate_hit_ratio


def _with_reuse_classes(doc: PolicyDocument) -> PolicyDocument:
    """``doc`` with a curve for each category's reuse class, unlike the category's."""
    returns = {
        name + "/re": params.model_copy(update={"p_reuse": 0.99, "rate": 0.01})
        for name, params in doc.categories.items()
    }
    return doc.model_copy(update={"categories": {**doc.categories, **returns}})


def _hits_filing_by_reuse_class(trace: Trace, doc: PolicyDocument, size: int, ghost: int) -> int:
    """The replay's semantics, with ``wa`` told each released block's class: ``w/re`` if
    this cache found it or evicted it among its last ``ghost`` victims, ``w`` otherwise."""
    names = [n for c in trace.category_names for n in (c, c + "/re")]
    wa = WAPolicy(size, category_names=names, doc=doc)
    cached: set[int] = set()
    lately: dict[int, None] = {}  # evicted blocks, oldest first
    hits = 0
    hashes = trace.hashes[trace.blocks].tolist()
    for r in range(trace.n_requests):
        blocks = hashes[trace.offsets[r] : trace.offsets[r + 1]]
        now, code = float(trace.timestamps[r]), 2 * int(trace.categories[r])
        found = [b for b in blocks if b in cached]
        hits += next((i for i, b in enumerate(blocks) if b not in cached), len(blocks))
        if found:
            wa.touch(found, now)
        for offset in range(len(blocks) - 1, -1, -1):
            block = blocks[offset]
            again = block in found or lately.pop(block, 0) is None
            wa.free([block], [offset], now, code + again)
        cached.update(blocks)
        if len(wa) > size:
            victims = wa.evict(len(wa) - size)
            cached.difference_update(victims)
            lately.update(dict.fromkeys(victims))
            for old in list(lately)[: max(len(lately) - ghost, 0)]:
                del lately[old]
    return hits


def test_observed_hit_ratio_counts_every_request_even_with_none_sampled(trace: Trace) -> None:
    """The window of the workers' own hits follows every whole request, not only sampled
    ones (at a low rate a small worker may have none sampled yet)."""
    shadow = ShadowEvaluator(ShadowSettings(shadow_rate=1e-9))
    shadow.set_capacities({"w1": 300})
    batches = agent_batches(trace, 300, batch_events=1000)
    for batch in batches:
        shadow.apply(batch)
    shadow.flush("w1")
    (group,) = shadow.view().groups
    assert group.sampled_requests == 0 and group.requests_seen == trace.n_requests
    hits = sum(int((b.kind == HIT).sum()) for b in batches)
    assert group.observed_hit_ratio == pytest.approx(hits / trace.n_accesses)
    assert hits > 0


def test_too_few_subtrees_give_no_regression_and_a_wide_interval() -> None:
    counts = WindowCounts(1e9, 1)
    counts.add(0.0, 3, 10, 9, subtree=1)
    one = counts.totals(1.0).estimate(seen_ratio=0.5)
    assert (one.hit_ratio, one.ci_low, one.ci_high) == (0.3, 0.0, 1.0)
    for k in range(2, 10):
        counts.add(0.0, k, 10, 10 - k, subtree=k)
    few = counts.totals(1.0).estimate(seen_ratio=0.9)
    assert few.hit_ratio == few.sampled_ratio  # under MIN_REGRESSION_SUBTREES: not moved
    assert 0.0 < few.ci_low < few.hit_ratio < few.ci_high < 1.0


def test_a_regression_that_would_leave_0_1_is_not_made() -> None:
    """Hits that follow the worker's own steeply, and a worker far richer in reuse than
    the sample: the move would pass 1, so the sample's figure is served."""
    counts = WindowCounts(1e9, 1)
    for k in range(40):
        seen = k % 5
        counts.add(0.0, min(10, 3 * seen), 10, seen, subtree=k)
    totals = counts.totals(1.0)
    assert totals.subtrees >= MIN_REGRESSION_SUBTREES
    moved = totals.estimate(seen_ratio=0.95)
    assert moved.hit_ratio == moved.sampled_ratio
    assert moved.ci_low <= moved.hit_ratio <= moved.ci_high


def test_a_resized_miniature_resizes_its_policy_and_its_ghost() -> None:
    s3fifo = create("s3fifo", 100)
    cache = MiniCache(s3fifo, 100, ReuseClassing(ReturnTracker(ghost_size=400), lambda c: c))
    cache.resize(250)
    fresh = create("s3fifo", 250)
    assert cache.capacity == 250 and cache.classing is not None
    assert cache.classing.tracker.ghost_size == 1000
    for name in ("_small_size", "_main_size", "_ghost_size"):
        assert getattr(s3fifo, name) == getattr(fresh, name)
    arc = create("arc", 200)
    mini = MiniCache(arc, 200)
    rng = np.random.default_rng(1)
    for i in range(2000):  # three of 600 blocks each time: ARC's ghosts fill up
        mini.serve(Request(float(i), 1, rng.integers(0, 600, 3).tolist()))
    assert len(arc._b1) + len(arc._b2) > 100
    mini.resize(50)
    mini.serve(Request(300.0, 1, [10_000, 10_001]))
    assert arc._capacity == 50
    assert arc._n1 + len(arc._b1) <= 50
    assert arc._n1 + arc._n2 + len(arc._b1) + len(arc._b2) <= 100


def test_inflow_share_sizes_a_miniature_by_what_the_sample_computed_lately() -> None:
    """Nominal ``capacity x rate`` until a quarter of the capacity's inflow is seen; then the
    sampled share of the newest ``capacity`` blocks of inflow, whatever came before."""
    share = InflowShare(rate=0.05, horizon=4000)
    assert share.capacity(1000) == 50
    share.add(every=200.0, sampled=40.0)
    assert MIN_SEEN * 1000 > 200 and share.capacity(1000) == 50  # too little seen
    share.add(every=200.0, sampled=40.0)
    assert share.capacity(1000) == 200  # 80 of 400: a share of 0.2
    for _ in range(50):
        share.add(every=100.0, sampled=5.0)
    assert share.capacity(1000) == 50  # only the newest 1,000 blocks count
    assert share.capacity(4000) == 200  # 200 of 4,000, a share of 0.05
    assert share.capacity(1) == 1


def test_inflow_share_starts_its_window_inside_a_batch() -> None:
    """The newest 1,500 blocks: the last batch (100 sampled of 1,000) and half of the one
    before (none sampled), read as if its blocks came evenly; not both whole batches."""
    share = InflowShare(rate=0.05, horizon=4000)
    share.add(every=1000.0, sampled=0.0)
    share.add(every=1000.0, sampled=100.0)
    assert share.capacity(1500) == 100  # 100 of 1,500 (both whole: 75)
    assert share.capacity(1000) == 100  # the last batch alone
    assert share.capacity(4000) == 200  # more than was seen: all 2,000 of it, 0.05


def test_inflow_share_keeps_its_horizon_as_it_drops_old_steps() -> None:
    share = InflowShare(rate=0.1, horizon=2000)
    for i in range(5000):
        share.add(every=10.0, sampled=1.0 if i < 4900 else 3.0)
    assert share.capacity(1000) == 300  # the last 100 steps: 300 of 1,000
    assert share.capacity(2000) == 400  # the last 200: 400 of 2,000
    assert len(share._every) <= 2 * KEEP_STEPS + 1  # old steps dropped
    assert share.totals == (50_000.0, 5_200.0)
    for _ in range(10_000):
        share.add(every=0.0, sampled=0.0)  # nothing computed: nothing kept
    assert len(share._every) <= 2 * KEEP_STEPS + 1
    unknown = InflowShare(rate=0.1)  # no capacity known yet: no horizon
    for _ in range(5000):
        unknown.add(every=10.0, sampled=1.0)
    assert KEEP_STEPS <= len(unknown._every) - 1 <= 2 * KEEP_STEPS


def test_inflow_share_is_told_each_request_and_read_once_it_is_in() -> None:
    """Requests of inflow 100, 100, 50 and 100, the last two sampled: the third's
    capacity counts its own 50 blocks (50 of 250: 0.2), the fourth's its 100 (150 of
    350, kept at 4 x the rate); told in two batches, the same."""
    inflows = np.array([100, 100, 50, 100], dtype=np.int64)
    at = np.array([2, 3], dtype=np.intp)
    whole = InflowShare(rate=0.1, horizon=1000)
    assert whole.tell(inflows, at, [50, 100], [1000]) == [[200], [400]]
    assert whole.totals == (350.0, 150.0)
    parts = InflowShare(rate=0.1, horizon=1000)
    first = parts.tell(inflows[:3], at[:1], [50], [1000])
    second = parts.tell(inflows[3:], at[1:] - 3, [100], [1000])
    assert first + second == [[200], [400]] and parts.totals == whole.totals


def test_inflow_share_stays_in_a_band_around_the_rate() -> None:
    """A sample that computes nothing for a while (its subtrees only hit) still holds its
    blocks: the miniature keeps at least a quarter of the nominal size, and at most four
    times it."""
    share = InflowShare(rate=0.05, horizon=1000)
    for _ in range(4):
        share.add(every=300.0, sampled=0.0)
    assert share.capacity(1000) == round(1000 * 0.05 / BAND)
    for _ in range(4):
        share.add(every=300.0, sampled=300.0)
    assert share.capacity(1000) == round(1000 * 0.05 * BAND)


def test_shadow_estimates_are_moved_toward_the_full_replay(trace: Trace) -> None:
    """Over eight samples (salts) of a fifth of the subtrees, the estimate for ``lru`` at
    twice the worker's capacity, moved by what each sample misses of the worker's own
    hit ratio, lands closer to the full replay's figure than the miniature's own figure
    does, and the miniatures are sized by the sample's inflow, not by the rate alone."""
    capacity = trace.capacity_for(0.1)
    truth = replay_hits(trace, LRUPolicy(), 2 * capacity).sum() / trace.n_accesses
    batches = agent_batches(trace, capacity, batch_events=1000)
    settings = ShadowSettings(
        shadow_rate=0.2, shadow_policies="lru", shadow_ladder="1,2", shadow_buckets=1,
        shadow_window_s=1e9,
    )  # fmt: skip
    served, own, sizes = [], [], set()
    for salt in range(8):
        shadow = ShadowEvaluator(settings, salt)
        shadow.set_capacities({"w1": capacity})
        for batch in batches:
            shadow.apply(batch)
        shadow.flush("w1")
        (group,) = shadow.view().groups
        point = next(c for c in group.curves if c.policy == "lru").points[1]
        served.append(abs(point.hit_ratio - truth))
        own.append(abs(point.sampled_hit_ratio - truth))
        sizes.update(cache.capacity for cache in shadow.miniatures("w1"))
    assert sum(served) < sum(own)
    assert sizes - {round(capacity * 0.2), round(2 * capacity * 0.2)}


def test_shadow_curves_do_not_depend_on_how_the_worker_batches(trace: Trace) -> None:
    """Each sampled request's miniatures are sized by the inflow share as it stands once
    the request is in, so the same stream in batches of 97 or of 4,096 events, gathered
    and drained at other points, gives the same curves."""
    capacity = trace.capacity_for(0.1)
    settings = ShadowSettings(shadow_rate=0.2, shadow_buckets=1, shadow_window_s=1e9)
    views = []
    for batch_events in (97, 4096):
        shadow = ShadowEvaluator(settings, salt=3)
        shadow.set_capacities({"w1": capacity})
        for i, batch in enumerate(agent_batches(trace, capacity, batch_events=batch_events)):
            shadow.apply(batch)
            if i % 7 == 0:
                shadow.view()  # a read drains what is gathered
        shadow.flush("w1")
        views.append(shadow.view().groups[0])
    nominal = {round(capacity * m * 0.2) for m in settings.multiples}
    assert {cache.capacity for cache in shadow.miniatures("w1")} - nominal  # sized by share
    assert views[0].curves == views[1].curves
    assert views[0].sampled_accesses == views[1].sampled_accesses > 0


def test_curves_do_not_depend_on_a_read_before_the_capacity_or_document(
    trace: Trace,
) -> None:
    """A worker's capacity (its heartbeat) or a new document can come while events are
    gathered: what was gathered is replayed first, as it came, whether or not a read
    (which drains the gather) happened just before."""
    capacity = trace.capacity_for(0.1)
    settings = ShadowSettings(shadow_rate=0.2, shadow_buckets=1, shadow_window_s=1e9)
    batches = agent_batches(trace, capacity, batch_events=97)
    doc = fitted_document(trace)
    views = []
    for read_first in (False, True):
        shadow = ShadowEvaluator(settings, salt=3)
        for i, batch in enumerate(batches):
            shadow.apply(batch)
            if i in (len(batches) // 3, 2 * len(batches) // 3) and read_first:
                shadow.view()
            if i == len(batches) // 3:
                shadow.set_capacities({"w1": capacity})
            if i == 2 * len(batches) // 3:
                shadow.set_policy(doc)
        shadow.flush("w1")
        views.append(shadow.view().groups[0])
    assert views[0].curves == views[1].curves
    assert views[0].sampled_accesses > 0


def test_the_view_names_no_version_before_one_is_read(trace: Trace) -> None:
    """A standby (or a leader before its first read) replays the built-in parameters: no
    published version to name."""
    shadow = ShadowEvaluator(ShadowSettings())
    assert shadow.view().policy_version is None
    doc = fitted_document(trace)
    shadow.set_policy(doc)
    assert shadow.view().policy_version == doc.version


class _FailingRebuilder(RequestRebuilder):
    """Gathers as any rebuilder does; rebuilding what it gathered fails ``failures``
    times (losing it), then works."""

    def __init__(self, failures: int, *args: object) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self.failures = failures

    def drain(self) -> Rebuilt:
        if self.failures <= 0:
            return super().drain()
        self.failures -= 1
        self._pending.clear()
        self._pending_events = 0
        raise ValueError("a rebuild that fails")


def test_a_failed_rebuild_loses_its_events_to_the_shadow_only(
    trace: Trace, caplog: pytest.LogCaptureFixture
) -> None:
    """Reads rebuild what is gathered; when that fails, the read still answers, the
    failure is logged once per kind, and later events are taken as before."""
    shadow = ShadowEvaluator(ShadowSettings(shadow_rate=1.0))
    shadow.set_capacities({"w1": 300})
    batches = agent_batches(trace, 300, batch_events=500)
    shadow.apply(batches[0])  # the worker's state exists from here on
    broken = _FailingRebuilder(3, shadow.sampler, shadow.table, 0, 10**9)
    shadow._workers["w1"].rebuilder = broken
    with caplog.at_level(logging.ERROR, logger="controlplane.shadow.evaluator"):
        for batch in batches[1:4]:
            shadow.apply(batch)
            (group,) = shadow.view().groups  # answers though the rebuild failed
    failures = [r for r in caplog.records if "dropped events of w1" in r.getMessage()]
    assert len(failures) == 1
    lost_until = group.requests_seen
    for batch in batches[4:]:
        shadow.apply(batch)
    shadow.flush("w1")
    (group,) = shadow.view().groups
    assert lost_until < group.requests_seen < trace.n_requests


def test_a_capacity_learned_late_reads_the_workers_own_hits_over_the_same_span(
    trace: Trace,
) -> None:
    """The miniatures of a worker whose heartbeat came late replay only the requests still
    kept, counted from a whole time bucket on; the workers' own hit ratio that moves their
    estimates is read over that span too. With (all but) every subtree sampled, the sample
    is the traffic: nothing moves."""
    settings = ShadowSettings(
        shadow_rate=1 - 1e-9, shadow_policies="lru", shadow_ladder="1", shadow_max_requests=150
    )  # the default window and buckets
    shadow = ShadowEvaluator(settings)
    batches = agent_batches(trace, 300, batch_events=1000)
    half = len(batches) // 2
    for batch in batches[:half]:
        shadow.apply(batch)
    shadow.set_capacities({"w1": 300})
    for batch in batches[half:]:
        shadow.apply(batch)
    shadow.flush("w1")
    (group,) = shadow.view().groups
    point = group.curves[1].points[0]
    assert group.sampled_requests < group.requests_seen  # the curves start late
    assert point.hit_ratio == pytest.approx(point.sampled_hit_ratio, abs=1e-9)


def test_window_sums_equal_a_recount_of_the_live_buckets() -> None:
    """Running sums and products, against a recount of every add still in the window, as
    time moves on by small and large steps and some adds come late."""
    rng = np.random.default_rng(11)
    counts = WindowCounts(window_s=100.0, buckets=10)
    log: list[tuple[int, int, int, int, int]] = []  # bucket, subtree, hits, accesses, seen
    now = -50.0  # negative times too
    for _ in range(400):
        now += float(rng.choice([0.0, 3.0, 17.0, 250.0], p=[0.4, 0.4, 0.15, 0.05]))
        ts = now - float(rng.uniform(0, 120))
        a = int(rng.integers(1, 30))
        h, seen = int(rng.integers(0, a + 1)), int(rng.integers(0, a + 1))
        subtree = int(rng.integers(0, 12))
        counts.add(ts, h, a, seen, subtree)
        bucket = int(ts // 10.0)
        newest = int(now // 10.0)
        log = [row for row in log if row[0] > newest - 10]
        if bucket > newest - 10 and all(
            row[0] <= bucket or row[0] % 10 != bucket % 10 for row in log
        ):
            log.append((bucket, subtree, h, a, seen))
        totals = counts.totals(now)
        per: dict[int, list[int]] = {}
        for _, k, hh, aa, ss in log:
            row = per.setdefault(k, [0, 0, 0])
            row[0] += hh
            row[1] += aa
            row[2] += ss
        pairs = [(i, j) for i in range(3) for j in range(i, 3)]  # hh, ha, hs, aa, as, ss
        want = [sum(r[i] * r[j] for r in per.values()) for i, j in pairs]
        assert totals.subtrees == len(per)
        assert list(totals.products) == want
        assert totals.hits == sum(r[2] for r in log)


# --- guard -----------------------------------------------------------------------------------
def _inverted(doc: PolicyDocument) -> PolicyDocument:
    """``doc`` with each category's reuse probability turned upside down: a bad fit."""
    cats = {
        name: CategoryParams(
            rate=p.rate, p_reuse=1.0 - p.p_reuse, life_s=p.life_s, samples=p.samples, source="fit"
        )
        for name, p in doc.categories.items()
    }
    return doc.model_copy(update={"categories": cats, "version": doc.version + 1})


def test_guard_refuses_a_bad_candidate_and_passes_a_good_one(trace: Trace) -> None:
    doc = fitted_document(trace)
    shadow = _shadow_at_full_rate(trace, 300, doc)
    verdict = shadow.judge(_inverted(doc), doc)
    assert verdict.outcome == "refused", verdict.reason
    assert verdict.candidate_hit_ratio is not None and verdict.in_force_hit_ratio is not None
    assert verdict.candidate_hit_ratio < verdict.in_force_hit_ratio - verdict.margin
    assert f"{verdict.candidate_hit_ratio:.4f}" in verdict.reason
    same = shadow.judge(doc.model_copy(update={"version": 9}), doc)
    assert same.outcome == "passed" and same.candidate_hit_ratio == same.in_force_hit_ratio
    assert shadow.view().guard == same


def test_guard_waits_while_the_window_holds_too_little(trace: Trace) -> None:
    doc = fitted_document(trace)
    settings = ShadowSettings(shadow_rate=1.0, guard_min_accesses=10**9)
    shadow = ShadowEvaluator(settings)
    shadow.set_capacities({"w1": 300})
    for batch in agent_batches(trace, 300)[:3]:
        shadow.apply(batch)
    verdict = shadow.judge(_inverted(doc), doc)
    assert verdict.outcome == "waiting"
    assert "guard_min_accesses" in verdict.reason


def test_settings_refuse_unknown_policies_and_bad_ladders() -> None:
    with pytest.raises(ValueError, match="unknown policy 'nope'"):
        ShadowSettings(shadow_policies="lru,nope")
    with pytest.raises(ValueError, match="not a number"):
        ShadowSettings(shadow_ladder="1,two")
    with pytest.raises(ValueError, match=r"not in \(0, 64\]"):
        ShadowSettings(shadow_ladder="0,1")
    s = ShadowSettings(shadow_policies="arc,wa,lru,arc", shadow_ladder="2,0.5,1,2")
    assert s.baselines == ("arc", "lru") and s.multiples == (0.5, 1.0, 2.0)


def test_rebuild_keys_a_request_by_the_block_at_the_key_depth(trace: Trace) -> None:
    depth = 4
    sampler = PrefixSampler(0.3)
    rebuilder = RequestRebuilder(sampler, CategoryTable(), key_depth=depth)
    sampled = []
    for batch in agent_batches(trace, 200):
        sampled += rebuilder.feed(batch).sampled
    sampled += rebuilder.flush().sampled
    hashes = trace.hashes[trace.blocks]
    lengths = trace.lengths
    keys = hashes[trace.offsets[:-1] + np.minimum(lengths - 1, depth)]
    assert len(sampled) == int(sampler.keep(keys).sum()) > 0
    got = np.array([r.blocks[min(len(r.blocks) - 1, depth)] for r in sampled], np.int64)
    assert sampler.keep(got).all()


def test_guard_replays_at_most_its_share_of_the_newest_requests(trace: Trace) -> None:
    doc = fitted_document(trace)
    settings = ShadowSettings(shadow_rate=1.0, guard_min_accesses=1, guard_max_accesses=5000)
    shadow = ShadowEvaluator(settings)
    shadow.set_capacities({"w1": 300})
    for batch in agent_batches(trace, 300):
        shadow.apply(batch)
    verdict = shadow.judge(doc, doc)
    assert verdict.outcome == "passed"
    assert 0 < verdict.sampled_accesses <= 5000 < trace.n_accesses


def test_a_worker_gone_for_a_whole_window_is_forgotten(trace: Trace) -> None:
    # A window long enough that applying one batch on a loaded machine stays inside it.
    shadow = ShadowEvaluator(ShadowSettings(shadow_rate=1.0, shadow_window_s=1.0))
    shadow.set_capacities({"w1": 300})
    shadow.apply(agent_batches(trace, 300)[0])
    assert shadow.forget_gone(set()) == []  # it sent a batch just now
    time.sleep(1.1)
    assert shadow.forget_gone({"w1"}) == []  # its heartbeat is live
    assert shadow.forget_gone(set()) == ["w1"]
    assert shadow.view().groups == []


def _hits_apart(batch: EventBatch) -> EventBatch:
    """A request's inserts reported a moment after its hits (an engine that does not
    report requests whole)."""
    later = batch.kind == INSERT
    return replace(batch, ts=np.where(later, batch.ts + 1e-3, batch.ts))


def _first_hits_lost(batch: EventBatch) -> EventBatch:
    """Every HIT at prompt offset 0 lost on the way."""
    kept = ~((batch.kind == HIT) & (batch.offset == 0))
    return replace(batch, **{name: getattr(batch, name)[kept] for name in batch.columns})


@pytest.mark.parametrize(
    ("declares_whole", "damage"),
    [(False, _hits_apart), (True, _first_hits_lost)],
    ids=["heartbeat-says-not-whole", "runs-broken"],
)
def test_guard_leaves_out_a_worker_whose_events_do_not_rebuild_into_requests(
    trace: Trace, declares_whole: bool, damage: Callable[[EventBatch], EventBatch]
) -> None:
    """A worker whose heartbeat does not say it reports requests whole (SGLang, older
    agents), or whose runs come broken, must not judge a fit."""
    doc = fitted_document(trace)
    shadow = ShadowEvaluator(ShadowSettings(shadow_rate=1.0, guard_min_accesses=1))
    shadow.set_capacities({"w1": 300}, {"w1": declares_whole})
    for batch in agent_batches(trace, 300, batch_events=1000):
        shadow.apply(damage(batch))
    shadow.flush("w1")
    (group,) = shadow.view().groups
    assert not group.whole_requests
    if declares_whole:
        assert group.incomplete_runs > 0.1 * (group.requests_seen + group.incomplete_runs)
    verdict = shadow.judge(_inverted(doc), doc)
    assert verdict.outcome == "waiting", verdict.reason
    assert "do not rebuild into whole requests" in verdict.reason


def test_events_lost_once_no_longer_count_once_they_have_left_the_window(trace: Trace) -> None:
    """Losses at a worker's start (a Redis restart, a full buffer) made it count as not
    reporting whole requests for the rest of its life: the share was of lifetime runs."""
    settings = ShadowSettings(shadow_rate=1.0, shadow_window_s=60.0, shadow_buckets=6)
    shadow = ShadowEvaluator(settings)
    shadow.set_capacities({"w1": 300}, {"w1": True})
    batches = agent_batches(trace, 300, batch_events=1000)
    start = float(batches[0].ts.min())
    damaged = 0
    for batch in batches:
        lossy = float(batch.ts.max()) < start + 100.0
        damaged += lossy
        shadow.apply(_first_hits_lost(batch) if lossy else batch)
    shadow.flush("w1")
    (group,) = shadow.view().groups
    assert damaged and float(batches[-1].ts.max()) > start + 100.0 + 60.0
    assert group.whole_requests and group.incomplete_runs == 0


def test_rebuild_counts_blocks_stored_after_a_prompt_as_a_continuation() -> None:
    """INSERTs only, none at offset 0 (blocks filled while decoding): skipped, not broken;
    a run with HITs that misses offset 0 is broken."""
    batch = event_batch(
        ts=[1.0, 2.0, 2.0, 3.0, 3.0],
        block=[7, 8, 9, 10, 11],
        offset=[5, 6, 5, 1, 2],
        kind=[INSERT, INSERT, INSERT, HIT, HIT],
    )
    _, first, last = _rebuild_at_full_rate(batch)
    assert (first.continued, first.incomplete, first.requests) == (2, 0, 0)
    assert (last.continued, last.incomplete, last.requests) == (0, 1, 0)

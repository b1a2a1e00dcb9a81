"""The shadow's memory bounds: what one worker's stream (network input) could make the
shadow hold without limit, found in review, and what it holds instead."""

from __future__ import annotations

import numpy as np
import pytest

from agent.policies.wa import WAPolicy
from agent.reuse_classes import REUSE_GHOST_CAPACITIES
from agent.wire import BatchLimits, EventBatch, EventKind
from controlplane.fit.reuse_window import ReuseStats
from controlplane.service.window import BatchRefused, LiveWindow, WindowLimits
from controlplane.shadow.estimator import WindowCounts
from controlplane.shadow.evaluator import GATHER_EVENTS, ShadowEvaluator
from controlplane.shadow.inflow import MAX_STEPS, InflowShare
from controlplane.shadow.miniatures import Warming
from controlplane.shadow.rebuild import MAX_HELD_EVENTS, CategoryTable, RequestRebuilder
from controlplane.shadow.sampler import PrefixSampler
from controlplane.shadow.settings import ShadowSettings
from tests.wire_samples import event_batch

HIT = int(EventKind.HIT)
INSERT = int(EventKind.INSERT)


def test_a_run_that_never_ends_is_not_held_without_bound() -> None:
    rebuilder = RequestRebuilder(PrefixSampler(1.0), CategoryTable(), 4, GATHER_EVENTS)
    per_batch = 8192
    for seq in range(1, 41):  # 327,680 events of one endless run, 40 batches
        offsets = np.arange((seq - 1) * per_batch, seq * per_batch)
        rebuilder.feed(
            event_batch(seq=seq, ts=np.ones(per_batch), block=offsets + 1, offset=offsets, kind=HIT)
        )
    held = rebuilder.held_events
    assert held <= BatchLimits().max_events, f"{held:,} events of one run held"


def test_a_run_longer_than_the_bound_is_closed_as_its_first_blocks() -> None:
    """A prompt of more blocks than are held: its first ``MAX_HELD_EVENTS`` and more come
    out as a request, the rest (HITs past offset 0) as an incomplete run."""
    rebuilder = RequestRebuilder(PrefixSampler(1.0), CategoryTable(), 4, GATHER_EVENTS)
    per_batch, batches = 8192, MAX_HELD_EVENTS // 8192 + 2
    rebuilt = []
    for seq in range(1, batches + 1):
        offsets = np.arange((seq - 1) * per_batch, seq * per_batch)
        batch = event_batch(
            seq=seq, ts=np.ones(per_batch), block=offsets + 1, offset=offsets, kind=HIT
        )
        rebuilt.append(rebuilder.feed(batch))
    rebuilt.append(rebuilder.flush())
    requests = [r for part in rebuilt for r in part.sampled]
    assert [len(r.blocks) for r in requests] == [MAX_HELD_EVENTS + per_batch]
    assert requests[0].blocks == list(range(1, MAX_HELD_EVENTS + per_batch + 1))
    assert sum(part.incomplete for part in rebuilt) == 1
    assert rebuilder.held_events == 0


def test_the_shadow_forgets_categories_the_window_aged_out() -> None:
    limits = WindowLimits(clock_tolerance_s=5.0, max_categories=8, max_categories_per_worker=8)
    window = LiveWindow(ReuseStats(60.0, n_buckets=4, near_concurrent_s=0.5), limits)
    shadow = ShadowEvaluator(ShadowSettings(shadow_window_s=60.0, shadow_buckets=4))
    refused = 0
    seq = 0
    for round_ in range(50):  # every round a window later, 7 names never seen before
        now = 1000.0 + round_ * 200.0
        fresh = tuple(f"c{round_}_{i}" for i in range(7))
        # A category the worker keeps using comes first: it moves the window on, so the
        # names of the rounds before age out (the window's own clock is its newest access).
        for names in (("kept",), fresh):
            if names is fresh:
                window.age_out()  # as the controller's periodic job does
            seq += 1
            n = len(names)
            batch = event_batch(
                seq=seq,
                categories=names,
                ts=np.full(n, now),
                block=np.arange(n) + 1 + seq * 100,
                offset=np.arange(n),
                category=np.arange(n),
                kind=HIT,
            )
            try:  # as the controller's _apply: the shadow sees what the window took
                rejected = window.apply(batch, now)
            except BatchRefused:
                refused += 1
                continue
            shadow.apply(window.timely(batch, now) if rejected else batch)
    assert refused == 0, "the window admits every round: its old names aged out"
    assert window.categories <= limits.max_categories
    # Each category comes with its reuse class: two codes a name.
    assert len(shadow.table.names) <= 2 * limits.max_categories, len(shadow.table.names)


def _one_request(seq: int, name: str, now: float) -> EventBatch:
    """One whole request of ``name`` at ``now``: two blocks of its own, inserted."""
    return event_batch(
        seq=seq,
        categories=(name,),
        ts=np.full(2, now),
        block=np.array([2 * seq, 2 * seq + 1]),
        offset=np.array([1, 0]),
        category=0,
        kind=int(EventKind.INSERT),
    )


def test_a_forgotten_code_given_again_is_renamed_in_every_wa_miniature() -> None:
    """The ``wa`` miniatures name each code as the table does, after a category is
    forgotten and its codes go to a new one; a name back in time takes its codes back."""
    settings = ShadowSettings(shadow_rate=1.0, shadow_window_s=60.0, shadow_buckets=4)
    shadow = ShadowEvaluator(settings)
    shadow.set_capacities({"w": 64})
    for seq, (name, now) in enumerate([("a", 0.0), ("b", 10.0), ("c", 100.0), ("b", 101.0)], 1):
        shadow.apply(_one_request(seq, name, now))
        shadow.flush("w")
    # a and b were last used over a window before c came: c takes a's codes, the oldest
    # forgotten; b, back before its codes went to another, takes them back.
    assert shadow.table.names == ["c", "c/re", "b", "b/re"]
    was = [c.policy for c in shadow.miniatures("w") if isinstance(c.policy, WAPolicy)]
    assert was and all(wa.category_names == tuple(shadow.table.names) for wa in was)


def test_a_batch_brings_a_new_category_only_when_a_name_it_uses_has_no_code() -> None:
    """Whichever table the batch before it sent (another worker's): otherwise two workers'
    batches in turn would each have the gather rebuilt early (``ShadowEvaluator.apply``)."""
    table = CategoryTable(60.0)
    first, second = (RequestRebuilder(PrefixSampler(1.0), table) for _ in range(2))
    assert first.brings_new(_one_request(1, "a", 1.0))
    first.feed(_one_request(1, "a", 1.0))
    assert second.brings_new(_one_request(2, "b", 2.0))
    second.feed(_one_request(2, "b", 2.0))
    assert not first.brings_new(_one_request(3, "a", 3.0))
    assert not second.brings_new(_one_request(4, "b", 4.0))


def test_the_inflow_share_keeps_a_bounded_number_of_steps_at_any_horizon() -> None:
    """Requests of one block each at the horizon of a capacity of 100,000 blocks (the
    ladder's 4x): the steps are merged past ``MAX_STEPS / 2`` (at 49 blocks each), and
    the shares read still follow the stream."""
    share = InflowShare(rate=0.05, horizon=4 * 100_000)
    for i in range(120_000):  # one request in 10 sampled, then one in 20
        share.add(every=1.0, sampled=1.0 if i % (10 if i < 80_000 else 20) == 0 else 0.0)
    assert len(share._every) <= MAX_STEPS
    assert share.totals == (120_000.0, 8_000.0 + 2_000.0)
    assert abs(share.capacity(40_000) - 2_000) <= 5  # the last 40,000: one in 20
    assert abs(share.capacity(80_000) - 6_000) <= 5  # and 40,000 of one in 10


def test_the_inflow_horizon_follows_the_capacity_the_miniatures_stand_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The share keeps the inflow of the ladder's top step at the worker's capacity as it
    stands: smaller when it reports a smaller one, and back to it when a warm at a larger
    one fails (kept at the larger, a capacity that never warms would keep its inflow)."""
    shadow = ShadowEvaluator(ShadowSettings(shadow_rate=1.0))
    shadow.set_capacities({"w": 1000})
    share = shadow._workers["w"].share
    assert share.horizon == 4000
    shadow.set_capacities({"w": 100})
    assert share.horizon == 400

    def failing(warming: Warming, settings: ShadowSettings) -> None:
        raise ValueError("a warm that fails")

    monkeypatch.setattr(Warming, "warm", failing)
    shadow.set_capacities({"w": 1_000_000})
    assert shadow.view().groups[0].capacity == 100
    assert share.horizon == 400


def test_a_capacity_above_the_limit_is_modeled_at_the_limit_and_shown_capped() -> None:
    """A heartbeat may say any capacity, and the miniatures are sized by it (times the
    rate and the ladder): one above ``shadow_max_capacity`` is modeled at the limit, and
    the view names the workers so modeled."""
    settings = ShadowSettings()
    limit = 2**23  # shadow_max_capacity's default
    shadow = ShadowEvaluator(settings)
    shadow.set_capacities({"huge": 2**40, "limit": limit, "small": 1000})
    groups = {group.capacity: group for group in shadow.view().groups}
    assert sorted(groups) == [1000, limit]
    assert groups[limit].workers == ["huge", "limit"]
    assert groups[limit].capped_workers == ["huge"]
    assert groups[1000].capped_workers == []
    top = round(limit * max(settings.multiples) * settings.shadow_rate)
    assert max(cache.capacity for cache in shadow.miniatures("huge")) == top
    shadow.set_capacities({"huge": 2**41})  # above the limit still: nothing to warm again
    assert shadow.view().groups[1].capped_workers == ["huge"]


def _ghost_per_block(shadow: ShadowEvaluator, worker: str) -> set[float]:
    """The ghost of each ``wa`` miniature of ``worker`` over its size."""
    return {
        cache.classing.tracker.ghost_size / cache.capacity
        for cache in shadow.miniatures(worker)
        if cache.classing is not None
    }


def test_a_capped_workers_reuse_ghost_is_modeled_at_its_share_and_bounded() -> None:
    """A worker modeled at the limit keeps its ghost-to-capacity share (its ghost scaled
    as its capacity is); a ghost past ``REUSE_GHOST_CAPACITIES`` x the limit, whatever
    the capacity, is modeled there, and the worker shown capped."""
    settings = ShadowSettings(shadow_max_capacity=1000)
    shadow = ShadowEvaluator(settings)
    shadow.set_capacities({"big": 4000}, None, {"big": 4 * 4000})
    assert _ghost_per_block(shadow, "big") == {4.0}
    shadow.set_capacities({"ghostly": 100}, None, {"ghostly": 2**60})
    ghost_limit = REUSE_GHOST_CAPACITIES * 1000
    assert _ghost_per_block(shadow, "ghostly") == {ghost_limit / 100}
    groups = {group.capacity: group for group in shadow.view().groups}
    assert groups[1000].capped_workers == ["big"]
    assert groups[100].capped_workers == ["ghostly"]


def _request_of(seq: int, blocks: int, now: float = 1.0) -> EventBatch:
    """One whole request of ``blocks`` blocks of its own, inserted, at ``now``."""
    first = seq * blocks
    return event_batch(
        seq=seq,
        ts=np.full(blocks, now),
        block=np.arange(first, first + blocks) + 1,
        offset=np.arange(blocks)[::-1],
        category=0,
        kind=int(EventKind.INSERT),
    )


def _kept_blocks(shadow: ShadowEvaluator, worker: str) -> int:
    return sum(len(request.blocks) for request in shadow._workers[worker].buffer)


def test_the_kept_requests_are_bounded_in_blocks_not_only_in_number() -> None:
    """A stream of the longest requests a batch holds (65,536 blocks each): the 5,000
    requests kept by default would hold 327,680,000 blocks (gigabytes); the blocks kept
    stay at most 1,000,000 (tens of megabytes) by default."""
    shadow = ShadowEvaluator(ShadowSettings(shadow_rate=1.0))
    per_request = BatchLimits().max_events
    for seq in range(1, 21):  # 1,310,720 blocks
        shadow.apply(_request_of(seq, per_request))
        shadow.flush("w")
    assert 0 < _kept_blocks(shadow, "w") <= 1_000_000


def test_the_requests_let_go_for_the_bounds_are_counted_oldest_first() -> None:
    settings = ShadowSettings(shadow_rate=1.0, shadow_max_kept_blocks=1000)
    shadow = ShadowEvaluator(settings)
    shadow.set_capacities({"w": 100})
    for seq in range(1, 11):  # ten requests of 300 blocks: three fit
        shadow.apply(_request_of(seq, 300, now=float(seq)))
        shadow.flush("w")
    assert [request.ts for request in shadow._workers["w"].buffer] == [8.0, 9.0, 10.0]
    assert _kept_blocks(shadow, "w") == 900
    assert shadow.view().groups[0].kept_requests_dropped == 7
    shadow.apply(_request_of(11, 1001, now=11.0))  # alone above the bound: let go too
    shadow.flush("w")
    assert _kept_blocks(shadow, "w") == 0
    assert shadow.view().groups[0].kept_requests_dropped == 11


def test_the_window_counts_per_subtree_are_bounded_per_worker() -> None:
    """8,000 one-block requests, each its own subtree, in one window: every miniature's
    counts per subtree hold at most 4,096 of them, and the view counts those forgotten;
    the window's sums still count every request."""
    shadow = ShadowEvaluator(ShadowSettings(shadow_rate=1.0))
    shadow.set_capacities({"w": 1000})
    n = 8000
    shadow.apply(
        event_batch(ts=np.linspace(1.0, 2.0, n), block=np.arange(n) + 1, offset=0, kind=INSERT)
    )
    shadow.flush("w")
    group = shadow.view().groups[0]
    assert group.sampled_requests == n
    for ladder in shadow._workers["w"].ladders.values():
        for counts in ladder.counts:
            assert len(counts._subtrees) <= 4096
            assert sum(len(added) for added in counts._added) <= 4096
    assert group.forgotten_subtrees >= n - 4096


def _counts_of(subtrees: list[tuple[int, int, int]], cap: int | None) -> WindowCounts:
    """``WindowCounts`` of one request per (subtree, hits, accesses), in order."""
    counts = WindowCounts(100.0, 10, max_subtrees=cap)
    for at, (subtree, hits, accesses) in enumerate(subtrees):
        counts.add(float(at), hits, accesses, hits, subtree)
    return counts


def test_the_counts_forget_the_least_used_subtrees_past_the_cap_and_count_them() -> None:
    """Up to the cap nothing is forgotten (the estimate is the unbounded one); past it the
    subtrees of fewest accesses go (the oldest first among equals), counted, while the
    window's sums keep every request."""
    requests = [(1, 1, 5), (2, 0, 1), (3, 2, 9), (2, 1, 1), (4, 0, 3)]
    assert _counts_of(requests, 4).totals(10.0) == _counts_of(requests, None).totals(10.0)
    assert _counts_of(requests, 4).forgotten_subtrees == 0
    capped = _counts_of([*requests, (5, 1, 4)], 4)
    assert capped.forgotten_subtrees == 1
    assert set(capped._subtrees) == {1, 3, 4, 5}  # 2 had 2 accesses, the fewest
    assert {s for added in capped._added for s in added} == {1, 3, 4, 5}
    totals = capped.totals(10.0)
    assert (totals.requests, totals.hits, totals.accesses) == (6, 5, 23)
    kept = _counts_of([(1, 1, 5), (3, 2, 9), (4, 0, 3), (5, 1, 4)], None).totals(10.0)
    assert (totals.subtrees, totals.products) == (kept.subtrees, kept.products)


def test_workers_past_max_workers_are_left_out_of_the_shadow_and_told_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    shadow = ShadowEvaluator(ShadowSettings(shadow_rate=1.0), max_workers=2)
    shadow.set_capacities({"w1": 100, "w2": 100, "w3": 100})
    shadow.apply(event_batch(worker="w4", ts=np.ones(2), block=[1, 2], offset=[1, 0], kind=INSERT))
    shadow.set_capacities({"w3": 100})
    assert sorted(shadow._workers) == ["w1", "w2"]
    assert shadow.view().refused_workers == ["w3", "w4"]
    assert len([m for m in caplog.messages if "KVWISE_MAX_WORKERS" in m]) == 2
    shadow.forget_gone({"w1", "w2", "w3"})  # w4 sends nothing and has no heartbeat
    assert shadow.view().refused_workers == ["w3"]

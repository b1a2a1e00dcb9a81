"""ReuseStats: exact counts on hand-made streams, the window, the near-concurrent rule."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from agent.wire import EventKind
from controlplane.fit.reuse_window import ReuseStats, StatsSnapshot, counter_bytes, gap_edges
from tests.synth_reuse import chain_stream
from tests.wire_samples import event_batch

NAN = np.nan


def _cols(rows: list[tuple[float, int, float, int]]) -> tuple[np.ndarray, ...]:
    ts, cat, pts, pcat = zip(*rows, strict=True)
    return (
        np.array(ts, np.float64),
        np.array(cat, np.int32),
        np.array(pts, np.float64),
        np.array(pcat, np.int32),
    )


# (ts, category, prev_ts, prev_category): a, b are categories 0, 1.
HAND = [
    (1.0, 0, NAN, -1),  # a opens
    (2.0, 1, NAN, -1),  # b opens
    (5.0, 0, 1.0, 0),  # reuse of a@1: gap 4 (a); opens a@5
    (5.1, 1, 5.0, 0),  # reuse of a@5 after 0.1 s; opens b@5.1
    (25.0, 0, 2.0, 1),  # reuse of b@2: gap 23 (b); the block is now a: opens a@25
]


def _hand(near_s: float) -> ReuseStats:
    st = ReuseStats(100.0, n_buckets=10, near_concurrent_s=near_s, categories=["a", "b"])
    st.ingest(*_cols(HAND))
    return st


def _bin(snap: StatsSnapshot, gap: float) -> int:
    return int(np.searchsorted(snap.edges, gap, side="right") - 1)


def test_hand_made_stream_gives_exact_counts() -> None:
    snap = _hand(near_s=0.5).snapshot(30.0)
    a, b = snap.of("a"), snap.of("b")
    assert (a.accesses, a.reuses, a.near_concurrent) == (3, 1, 1)
    assert (b.accesses, b.reuses, b.near_concurrent) == (2, 1, 0)
    assert np.flatnonzero(a.observed).tolist() == [_bin(snap, 4.0)]
    assert np.flatnonzero(b.observed).tolist() == [_bin(snap, 23.0)]
    assert a.observed.sum() == b.observed.sum() == 1
    # One open exposure each: a@25 (bucket [20, 30): age 0..10 s), b@5.1 (age 20..30 s).
    assert a.censored.sum() == pytest.approx(1.0)
    assert b.censored.sum() == pytest.approx(1.0)
    a_ages = snap.edges[np.flatnonzero(a.censored)]
    b_ages = snap.edges[np.flatnonzero(b.censored) + 1]
    assert a_ages.min() == 0.0 and snap.edges[np.flatnonzero(a.censored)[-1]] < 10.0
    assert b_ages.min() > 20.0 and snap.edges[np.flatnonzero(b.censored)[-1]] < 30.0
    assert snap.dropped == 0


def test_near_concurrent_threshold_decides_what_is_a_reuse() -> None:
    with_threshold = _hand(near_s=0.5).snapshot(30.0).of("a")
    without = _hand(near_s=0.0).snapshot(30.0)
    a = without.of("a")
    assert (with_threshold.reuses, with_threshold.near_concurrent) == (1, 1)
    assert (a.reuses, a.near_concurrent) == (2, 0)
    assert a.observed[_bin(without, 5.1 - 5.0)] == 1
    # Merged: a@5 left the fit's exposures; without the threshold it was a reuse.
    assert with_threshold.exposures == 2 and a.exposures == 3
    # A gap exactly at the threshold is a reuse (the threshold is exclusive).
    st = ReuseStats(100.0, near_concurrent_s=0.5, categories=["a"])
    st.ingest(*_cols([(1.0, 0, NAN, -1), (1.5, 0, 1.0, 0), (1.9, 0, 1.5, 0)]))
    row = st.snapshot(2.0).of("a")
    assert (row.reuses, row.near_concurrent) == (1, 1)


def test_every_access_is_reused_merged_or_open() -> None:
    s = chain_stream([3000, 2000], [0.5, 0.9], [0.2, 5.0], 200.0, seed=4, near_prob=0.3, near_s=1)
    st = ReuseStats(300.0, near_concurrent_s=0.5, categories=["x", "y"])
    st.ingest(s.ts, s.category, s.prev_ts, s.prev_category)
    snap = st.snapshot(200.0)
    open_ = snap.accesses - snap.reuses - snap.near_concurrent
    np.testing.assert_allclose(snap.censored.sum(axis=1), open_, rtol=1e-12)
    np.testing.assert_array_equal(snap.observed.sum(axis=1), snap.reuses)
    assert snap.accesses.tolist() == [s.accesses(0), s.accesses(1)]
    assert snap.near_concurrent.sum() > 0


def test_sliding_window_forgets_old_accesses() -> None:
    st = _hand(near_s=0.0)
    # 100 s window in 10 s buckets: at t=115 the buckets before [20, 30) are gone.
    st.ingest(*_cols([(115.0, 1, 25.0, 0), (116.0, 1, 5.1, 1)]))
    snap = st.snapshot(116.0)
    a, b = snap.of("a"), snap.of("b")
    assert (a.accesses, a.reuses) == (1, 1)  # a@25 and its reuse 90 s later
    assert a.observed[_bin(snap, 90.0)] == 1
    assert (b.accesses, b.reuses) == (2, 0)  # b@115, b@116; b@5.1 expired
    assert snap.dropped == 1  # the reuse of b@5.1 closed an access the window forgot
    # With no traffic, the window still slides: everything is forgotten by t=1000.
    late = st.snapshot(1000.0)
    assert late.total_accesses == 0 and late.censored.sum() == 0 and late.observed.sum() == 0


def test_batches_in_any_order_give_the_same_snapshot() -> None:
    s = chain_stream([2000, 1000], [0.4, 0.7], [0.05, 1.0], 300.0, seed=9)
    one = ReuseStats(600.0, categories=["x", "y"], origin=0.0)
    one.ingest(s.ts, s.category, s.prev_ts, s.prev_category)
    many = ReuseStats(600.0, categories=["x", "y"], origin=0.0)
    order = np.random.default_rng(1).permutation(len(s))
    for part in np.array_split(order, 37):
        many.ingest(s.ts[part], s.category[part], s.prev_ts[part], s.prev_category[part])
    a, b = one.snapshot(300.0), many.snapshot(300.0)
    np.testing.assert_array_equal(a.observed, b.observed)
    np.testing.assert_array_equal(a.accesses, b.accesses)
    np.testing.assert_allclose(a.censored, b.censored)


def test_accesses_before_the_origin_and_their_reuses_are_dropped() -> None:
    st = ReuseStats(100.0, categories=["a"])
    st.ingest(*_cols([(50.0, 0, 10.0, 0), (60.0, 0, NAN, -1)]))  # prev@10 predates the stats
    # A later batch from a slower sender: before the origin (50), so not counted either.
    st.ingest(*_cols([(40.0, 0, NAN, -1), (61.0, 0, 40.0, 0)]))
    row = st.snapshot(61.0).of("a")
    assert (row.accesses, row.reuses) == (3, 0)
    assert row.censored.sum() == pytest.approx(3.0)
    assert st.dropped == 3


def test_names_of_a_batch_are_remapped_to_the_stats_table() -> None:
    st = ReuseStats(100.0, categories=["text_1"])
    st.ingest(*_cols([(1.0, 0, NAN, -1), (2.0, 1, 1.0, 0)]), names=["file_2", "text_1"])
    assert st.categories == ("text_1", "file_2")
    snap = st.snapshot(3.0)
    assert snap.of("file_2").reuses == 1 and snap.of("text_1").accesses == 1
    with pytest.raises(ValueError, match="out of range"):
        st.ingest(*_cols([(3.0, 2, NAN, -1)]), names=["a", "b"])


def test_wire_batch_counts_hits_and_inserts_not_evictions() -> None:
    kinds = np.array([EventKind.INSERT, EventKind.HIT, EventKind.EVICT], np.uint8)
    batch = event_batch(
        worker="w0",
        categories=("text_1",),
        ts=[1.0, 2.0, 3.0],
        block=7,
        kind=kinds,
        prev_ts=[NAN, 1.0, 2.0],
        prev_category=[-1, 0, 0],
    )
    st = ReuseStats(100.0)
    st.ingest_batch(batch)
    row = st.snapshot(3.0).of("text_1")
    assert (row.accesses, row.reuses) == (2, 1)


def test_memory_does_not_grow_with_blocks_or_events() -> None:
    st = ReuseStats(3600.0, categories=[f"c{i}" for i in range(20)])
    before = st.nbytes()
    s = chain_stream([5000] * 20, [0.5] * 20, [0.1] * 20, 3000.0, seed=2)
    st.ingest(s.ts, s.category, s.prev_ts, s.prev_category)
    assert len(s) > 100_000
    assert st.nbytes() == before


def test_gap_edges_cover_the_window_log_spaced() -> None:
    e = gap_edges(3600.0, min_s=1e-3, per_decade=20)
    assert e[0] == 0.0 and np.isinf(e[-1]) and e[-2] >= 3600.0
    ratios = e[2:-1] / e[1:-2]
    np.testing.assert_allclose(ratios, 10 ** (1 / 20))


def _snapshots_equal(a: StatsSnapshot, b: StatsSnapshot) -> None:
    assert a.categories == b.categories
    for name in ("observed", "censored", "accesses", "reuses", "near_concurrent"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    assert a.dropped == b.dropped


def test_state_restores_the_same_window() -> None:
    st = _hand(0.5)
    st.ingest(*_cols(HAND))
    again = ReuseStats(100.0, n_buckets=10, near_concurrent_s=0.5)
    again.restore(st.state())
    _snapshots_equal(st.snapshot(12.0), again.snapshot(12.0))
    # Both go on alike.
    more = [(40.0, 0, 5.0, 0), (41.0, 1, NAN, -1)]
    st.ingest(*_cols(more))
    again.ingest(*_cols(more))
    _snapshots_equal(st.snapshot(45.0), again.snapshot(45.0))
    # Restoring into a window that already counted (and grew its table) works too.
    busy = ReuseStats(100.0, n_buckets=10, near_concurrent_s=0.5, categories=list("abcdefghij"))
    busy.ingest(*_cols([(1.0, 9, NAN, -1)]))
    busy.restore(st.state())
    busy.ingest(*_cols(more), names=["a", "new"])
    assert busy.categories == ("a", "b", "new")
    with pytest.raises(ValueError, match="other window settings"):
        ReuseStats(200.0, n_buckets=10, near_concurrent_s=0.5).restore(st.state())


def test_unused_categories_age_out_with_the_window() -> None:
    st = ReuseStats(100.0, n_buckets=10, categories=["a", "b", "c"])
    st.ingest(*_cols([(1.0, 0, NAN, -1), (2.0, 1, NAN, -1)]))
    assert st.forget_unused() == 1  # "c" was named but never counted
    assert st.categories == ("a", "b")
    # 150 s later "a" is still used, "b" left the window with its bucket.
    st.ingest(*_cols([(150.0, 0, NAN, -1)]))
    assert st.forget_unused() == 1
    assert st.categories == ("a",)
    assert st.snapshot(150.0).total_accesses == 1
    assert st.nbytes() <= ReuseStats(100.0, n_buckets=10, categories=["a"] * 8).nbytes()


def test_the_live_windows_revision_moves_with_accesses_and_restores_only() -> None:
    """The controller refits only when the revision moved: new accesses move it, so does a
    checkpoint restored (another leader's evidence); a batch of evictions does not."""
    from controlplane.service.window import LiveWindow, WindowLimits

    limits = WindowLimits(clock_tolerance_s=1e9, max_categories=10, max_categories_per_worker=10)
    window = LiveWindow(ReuseStats(100.0, n_buckets=10, near_concurrent_s=0.5), limits)
    start = window.revision
    window.apply(event_batch(ts=[1.0, 2.0], block=[1, 2], kind=int(EventKind.HIT)), 3.0)
    after_hits = window.revision
    assert after_hits > start
    window.apply(event_batch(seq=2, ts=[2.5], block=[1], kind=int(EventKind.EVICT)), 3.0)
    assert window.revision == after_hits
    window.restore(window.stats.state())
    assert window.revision > after_hits


def test_a_worker_whose_categories_all_aged_out_leaves_the_live_windows_books() -> None:
    """A worker that no longer brought any category stayed in the window's per-worker
    counts at zero: memory grew with worker churn."""
    from controlplane.service.window import LiveWindow, WindowLimits

    limits = WindowLimits(clock_tolerance_s=1e9, max_categories=10, max_categories_per_worker=10)
    window = LiveWindow(ReuseStats(100.0, n_buckets=10, near_concurrent_s=0.5), limits)
    insert = int(EventKind.INSERT)
    for worker, name, t in (("gone", "a", 1.0), ("here", "b", 150.0)):
        batch = event_batch(worker=worker, categories=(name,), ts=[t], block=1, kind=insert)
        window.apply(batch, t)
    assert window.age_out() == 1
    assert dict(window._brought) == {"here": 1}


def test_a_worker_at_its_category_limit_is_admitted_once_its_old_ones_aged_out() -> None:
    """The per-worker limit counted categories no bucket counts any more: a worker whose
    old categories left the window had a batch of new ones refused until the periodic
    age-out ran, though an age-out would have admitted it. One it names again after the
    age-out is counted as brought again (the window's count is what it holds)."""
    from controlplane.service.window import LiveWindow, WindowLimits

    limits = WindowLimits(clock_tolerance_s=1e9, max_categories=10, max_categories_per_worker=2)
    window = LiveWindow(ReuseStats(100.0, n_buckets=10, near_concurrent_s=0.5), limits)
    insert = int(EventKind.INSERT)
    for seq, (worker, names, t) in enumerate(
        [("w", ("a", "b"), 1.0), ("v", ("x",), 150.0), ("w", ("a", "c"), 150.0)], start=1
    ):
        n = len(names)
        batch = event_batch(
            worker=worker,
            seq=seq,
            categories=names,
            ts=[t] * n,
            block=np.arange(n) + 1,
            category=np.arange(n),
            kind=insert,
        )
        window.apply(batch, t)  # "a" and "b" left the window when "x" came at 150 s
    assert window.stats.categories == ("x", "a", "c")
    assert window.categories == 3


BAD_BATCHES = [
    # (rows, batch names, what the error must say)
    ([(6.0, 0, NAN, -1), (NAN, 1, NAN, -1)], ["a", "new"], r"ts: row 1 .*nan"),
    ([(6.0, 0, NAN, -1), (7.0, 1, np.inf, 0)], ["a", "new"], r"prev_ts: row 1 .*inf"),
    ([(6.0, 1, NAN, -1), (7.0, 2, NAN, -1)], ["a", "new"], r"category: row 1 .*code 2.*\[0, 2\)"),
    ([(6.0, 0, 5.0, 3), (7.0, 1, NAN, -1)], ["a", "new"], r"prev_category: row 0 .*code 3"),
    ([(6.0, 0, 5.0, -2)], None, r"prev_category: row 0 .*code -2.*\[-1, 2\)"),
]


@pytest.mark.parametrize(("rows", "names", "says"), BAD_BATCHES)
def test_a_bad_batch_is_refused_whole_naming_the_column_and_row(
    rows: list[tuple[float, int, float, int]], names: list[str] | None, says: str
) -> None:
    """The error says which column, which row and what is wrong with it; and the batch is
    checked before anything changes: the names it brings are not added (they once were,
    before a bad timestamp was found), nothing accepted before is lost."""
    st = _hand(near_s=0.5)
    before = st.snapshot(30.0)
    with pytest.raises(ValueError, match=says):
        st.ingest(*_cols(rows), names=names)
    assert st.categories == ("a", "b")
    _snapshots_equal(st.snapshot(30.0), before)


def test_columns_of_different_lengths_are_named() -> None:
    st = ReuseStats(100.0, categories=["a"])
    ts, cat, pts, pcat = _cols([(1.0, 0, NAN, -1), (2.0, 0, NAN, -1)])
    with pytest.raises(ValueError, match=r"prev_ts has 1 rows, ts 2"):
        st.ingest(ts, cat, pts[:1], pcat)


def test_a_bad_wire_batch_is_named_by_worker_sequence_and_its_own_row() -> None:
    """Rows are counted in the batch as sent, evictions included, not among the accesses
    kept from it."""
    kinds = np.array([EventKind.EVICT, EventKind.INSERT, EventKind.HIT], np.uint8)
    batch = event_batch(
        worker="w7",
        seq=12,
        categories=("text_1",),
        ts=[1.0, 2.0, 3.0],
        block=7,
        kind=kinds,
        prev_ts=[NAN, NAN, 2.0],
        prev_category=[-1, -1, 1],
    )
    st = ReuseStats(100.0)
    with pytest.raises(ValueError, match=r"batch 12 of worker 'w7': prev_category: row 2 "):
        st.ingest_batch(batch)
    assert st.categories == ()


def test_a_reuse_before_its_previous_access_is_dropped_and_counted() -> None:
    """A negative gap (a sender's clock stepped back) is no reuse observation: it was
    once counted as a reuse at 0 s. The earlier access stays open; the event's own access
    counts."""
    st = ReuseStats(100.0, categories=["a"], origin=0.0)
    st.ingest(*_cols([(10.0, 0, NAN, -1), (8.0, 0, 10.0, 0)]))
    row = st.snapshot(20.0).of("a")
    assert (row.accesses, row.reuses, row.near_concurrent) == (2, 0, 0)
    assert row.observed.sum() == 0 and row.censored.sum() == pytest.approx(2.0)
    assert st.dropped == 1


def test_a_full_gap_counter_saturates_instead_of_wrapping() -> None:
    """Gap counters are int32 (memory): one that would pass 2**31 - 1 stays there, the
    reuses past it dropped and counted (it once wrapped to a negative count)."""
    top = int(np.iinfo(np.int32).max)
    st = ReuseStats(100.0, n_buckets=10, categories=["a"], origin=0.0)
    st.ingest(*_cols([(1.0, 0, NAN, -1), (3.0, 0, 1.0, 0)]))
    state = st.state()
    gaps = state.gaps.copy()
    cell = np.argwhere(gaps)[0]
    gaps[tuple(cell)] = top - 1
    accesses = state.accesses.copy()
    accesses[cell[0], cell[1]] = top  # as many accesses as the reuses they opened
    st.restore(dataclasses.replace(state, gaps=gaps, accesses=accesses))
    st.ingest(*_cols([(3.2, 0, 1.2, 0), (3.3, 0, 1.3, 0), (3.4, 0, 1.4, 0)]))  # gaps of 2 s
    row = st.snapshot(4.0).of("a")
    assert row.observed.max() == top and row.observed.min() >= 0
    assert st.dropped == 2


def test_counter_bytes_is_what_the_window_holds_at_its_category_bound() -> None:
    """The settings' bound is computed, not measured: it must be what ``ReuseStats``
    allocates, even after a category left and came back (room grown from a shrunk table of
    99 once reached 198 for 100 categories: twice what a fresh table of 100 holds)."""
    bound = 100
    st = ReuseStats(3600.0, n_buckets=12, categories=[f"c{i}" for i in range(bound)])
    assert st.nbytes() == counter_bytes(3600.0, 12, bound)
    used = bound - 1
    st.ingest(
        np.full(used, 10.0),
        np.arange(used, dtype=np.int32),
        np.full(used, np.nan),
        np.full(used, -1, dtype=np.int32),
    )
    assert st.forget_unused() == 1  # the last one never counted anything
    st.code(f"c{used}")  # and comes back
    assert st.nbytes() == counter_bytes(3600.0, 12, bound) == 12 * (128 * 552 + 16)
    assert counter_bytes(3600.0, 10_000, 2048) == 11_305_120_000  # 552 bytes per row

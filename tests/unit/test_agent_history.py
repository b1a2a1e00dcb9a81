"""The access history: raw block operations resolved into wire events, checked on small
cases by hand and against a plain-dict model of its contract."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.history import EVICT, FREE, HIT, AccessHistory
from agent.wire import EventKind, Events, RawEvents

UNKNOWN = 9


def raw(*ops: tuple[int, float, list[int], int]) -> RawEvents:
    """Raw events from (kind, time, blocks, category) operations, offsets 0..n-1."""
    rows = [(k, t, b, c, i) for k, t, bs, c in ops for i, b in enumerate(bs)]
    return RawEvents(
        ts=np.array([r[1] for r in rows], np.float64),
        block=np.array([r[2] for r in rows], np.int64),
        category=np.array([r[3] for r in rows], np.int32),
        offset=np.array([-1 if r[0] == EVICT else r[4] for r in rows], np.int32),
        kind=np.array([r[0] for r in rows], np.uint8),
    )


def table(e: Events) -> list[tuple[str, int, int, float, int]]:
    """(kind, block, category, prev_ts, prev_category) per event; NaN shown as -1.0."""
    return [
        (EventKind(k).name, b, c, -1.0 if math.isnan(p) else p, pc)
        for k, b, c, p, pc in zip(
            e.kind.tolist(), e.block.tolist(), e.category.tolist(),
            e.prev_ts.tolist(), e.prev_category.tolist(), strict=True,
        )
    ]  # fmt: skip


def test_free_of_held_blocks_is_dropped_and_new_ones_are_inserts() -> None:
    h = AccessHistory(ghost_size=4)
    e = h.resolve(raw((FREE, 1.0, [12, 11, 10], 0)), UNKNOWN)
    assert table(e) == [("INSERT", 12, 0, -1.0, -1), ("INSERT", 11, 0, -1.0, -1),
                        ("INSERT", 10, 0, -1.0, -1)]  # fmt: skip
    e = h.resolve(raw((HIT, 2.0, [10, 11], 1), (FREE, 2.0, [13, 11, 10], 1)), UNKNOWN)
    assert table(e) == [("HIT", 10, 1, 1.0, 0), ("HIT", 11, 1, 1.0, 0),
                        ("INSERT", 13, 1, -1.0, -1)]  # fmt: skip
    assert e.offset.tolist() == [0, 1, 0]
    assert len(h) == 4


def test_evictions_carry_the_last_access_and_the_ghost_remembers() -> None:
    h = AccessHistory(ghost_size=1)
    h.resolve(raw((FREE, 1.0, [1, 2], 0), (HIT, 2.0, [2], 1), (FREE, 2.0, [2], 1)), UNKNOWN)
    e = h.resolve(raw((EVICT, 3.0, [1, 2], -1)), UNKNOWN)
    # An EVICT's category is the block's last one; its offset stays -1.
    assert table(e) == [("EVICT", 1, 0, 1.0, 0), ("EVICT", 2, 1, 2.0, 1)]
    assert e.offset.tolist() == [-1, -1]
    assert h.ghosts == 1 and len(h) == 1  # block 1, the older ghost, is forgotten
    e = h.resolve(raw((FREE, 4.0, [1, 2], 2)), UNKNOWN)
    assert table(e) == [("INSERT", 1, 2, -1.0, -1), ("INSERT", 2, 2, 2.0, 1)]
    assert h.ghosts == 0


def test_within_one_batch_order_decides() -> None:
    h = AccessHistory(ghost_size=8)
    e = h.resolve(
        raw(
            (FREE, 1.0, [5], 0),  # insert
            (EVICT, 2.0, [5], -1),
            (FREE, 3.0, [5], 1),  # back after eviction: an insert again
            (FREE, 3.0, [5], 1),  # now held: dropped
            (HIT, 4.0, [5], 2),
            (EVICT, 5.0, [5], -1),
        ),
        UNKNOWN,
    )
    assert table(e) == [
        ("INSERT", 5, 0, -1.0, -1),
        ("EVICT", 5, 0, 1.0, 0),
        ("INSERT", 5, 1, 1.0, 0),
        ("HIT", 5, 2, 3.0, 1),
        ("EVICT", 5, 2, 4.0, 2),
    ]
    assert h.ghosts == 1


def test_a_ghost_evicted_again_is_forgotten_in_its_new_place() -> None:
    h = AccessHistory(ghost_size=1, initial_slots=4)
    h.resolve(raw((FREE, 1.0, [1, 2], 0), (EVICT, 2.0, [1], -1)), UNKNOWN)
    # 1 comes back and is evicted again, then 2: the ghost keeps only 2.
    h.resolve(raw((FREE, 3.0, [1], 0), (EVICT, 4.0, [1], -1), (EVICT, 4.0, [2], -1)), UNKNOWN)
    assert h.ghosts == 1
    # 3 takes the slot 1 had; evicting it must forget 2 (older), not 3.
    h.resolve(raw((FREE, 5.0, [3], 1), (EVICT, 6.0, [3], -1)), UNKNOWN)
    e = h.resolve(raw((FREE, 7.0, [2, 3, 1], 2)), UNKNOWN)
    assert table(e) == [("INSERT", 2, 2, -1.0, -1), ("INSERT", 3, 2, 5.0, 1),
                        ("INSERT", 1, 2, -1.0, -1)]  # fmt: skip


def test_unknown_blocks_evicted_get_the_unknown_category() -> None:
    h = AccessHistory(ghost_size=8)
    e = h.resolve(raw((EVICT, 1.0, [7, 8], -1)), UNKNOWN)
    assert table(e) == [("EVICT", 7, UNKNOWN, -1.0, -1), ("EVICT", 8, UNKNOWN, -1.0, -1)]
    assert len(h) == 0  # nothing worth remembering


def test_table_starts_over_when_it_outgrows_its_bound() -> None:
    h = AccessHistory(ghost_size=2, max_blocks=5)
    h.resolve(raw((FREE, 1.0, [1, 2, 3, 4, 5], 0)), UNKNOWN)
    assert len(h) == 5 and h.resets == 0
    h.resolve(raw((FREE, 2.0, [6], 0)), UNKNOWN)  # six cached: evictions were lost
    assert len(h) == 0 and h.resets == 1
    e = h.resolve(raw((FREE, 3.0, [1], 0)), UNKNOWN)
    assert table(e) == [("INSERT", 1, 0, -1.0, -1)]


class ReferenceHistory:
    """The contract, one operation at a time, in plain dicts. The ghost is trimmed to
    ``ghost_size`` at the end of each resolved batch (``end_batch``)."""

    def __init__(self, ghost_size: int) -> None:
        self.ghost_size = ghost_size
        self.last: dict[int, tuple[float, int]] = {}
        self.cached: set[int] = set()
        self.ghost: dict[int, None] = {}  # insertion order = eviction order

    def prev(self, b: int) -> tuple[float, int]:
        return self.last.get(b, (math.nan, -1))

    def op(self, kind: int, now: float, blocks: list[int], cat: int) -> list[tuple]:
        out = []
        for i, b in enumerate(blocks):
            p = self.prev(b)
            if kind == EVICT:
                out.append((EVICT, b, p[1] if p[1] >= 0 else UNKNOWN, -1, *p))
                self.cached.discard(b)
                if b in self.last:
                    self.ghost.pop(b, None)
                    self.ghost[b] = None
                continue
            if kind == FREE and b in self.cached:
                continue  # held: not an event
            out.append((kind, b, cat, i, *p))
            self.ghost.pop(b, None)
            self.cached.add(b)
            self.last[b] = (now, cat)
        return out

    def end_batch(self) -> None:
        while len(self.ghost) > self.ghost_size:
            old = next(iter(self.ghost))
            del self.ghost[old]
            del self.last[old]


def rows(e: Events) -> list[tuple]:
    return list(
        zip(
            e.kind.tolist(), e.block.tolist(), e.category.tolist(), e.offset.tolist(),
            e.prev_ts.tolist(), e.prev_category.tolist(), strict=True,
        )
    )  # fmt: skip


def same(a: list[tuple], b: list[tuple]) -> bool:
    def norm(r: tuple) -> tuple:
        return (*r[:4], "nan" if math.isnan(r[4]) else r[4], r[5])

    return [norm(r) for r in a] == [norm(r) for r in b]


@settings(max_examples=200, deadline=None)
@given(
    st.integers(0, 4),
    st.lists(
        st.tuples(st.sampled_from([HIT, FREE, FREE, EVICT]), st.integers(0, 2**16), st.booleans()),
        max_size=60,
    ),
)
def test_resolver_matches_a_plain_dict_model(
    ghost_size: int, ops: list[tuple[int, int, bool]]
) -> None:
    # Tiny: exercises slot growth, ring compaction and stale ring entries.
    h = AccessHistory(ghost_size, initial_slots=2, ring_slack=1)
    ref = ReferenceHistory(ghost_size)
    batch: list[tuple[int, float, list[int], int]] = []
    want: list[tuple] = []
    got: list[tuple] = []
    for step, (kind, seed, cut) in enumerate(ops):
        rng = np.random.default_rng(seed)
        cat = int(rng.integers(0, 3))
        if kind == EVICT:
            pool = sorted(ref.cached)
            blocks = [int(b) for b in rng.permutation(pool)[: int(rng.integers(0, 4))]]
        else:  # a HIT may name blocks the table never saw: it must cope
            blocks = [int(b) for b in rng.permutation(8)[: int(rng.integers(1, 5))]]
        if not blocks:
            continue
        batch.append((kind, float(step), blocks, cat if kind != EVICT else -1))
        want += ref.op(kind, float(step), blocks, cat)
        if cut or step == len(ops) - 1:
            got += rows(h.resolve(raw(*batch), UNKNOWN))
            ref.end_batch()
            batch = []
            assert same(got, want)
            assert h.ghosts == len(ref.ghost)
            assert len(h) == len(ref.last)
    if batch:
        got += rows(h.resolve(raw(*batch), UNKNOWN))
        assert same(got, want)


def test_a_large_ghost_is_grown_into_not_allocated_up_front() -> None:
    """A worker with a huge cache (a billion blocks) starts with a small ghost ring, which
    grows as ghosts come and then remembers exactly the newest ``ghost_size`` of them."""
    huge = AccessHistory(ghost_size=10**9)
    assert huge._ring_slot.nbytes < 2**20  # not 16 GB
    h = AccessHistory(ghost_size=3000, ring_slack=1)
    blocks = list(range(10_000))
    h.resolve(raw((FREE, 1.0, blocks, 0)), UNKNOWN)
    for lo in range(0, 10_000, 500):  # evicted in batches: the ring grows, then compacts
        h.resolve(raw((EVICT, 2.0 + lo, blocks[lo : lo + 500], -1)), UNKNOWN)
    assert h.ghosts == 3000 and len(h) == 3000
    e = h.resolve(raw((FREE, 9e4, [6999, 7000, 9999], 1)), UNKNOWN)
    # 6999 was forgotten; 7000 and 9999 are remembered ghosts (their last access known).
    assert table(e) == [
        ("INSERT", 6999, 1, -1.0, -1),
        ("INSERT", 7000, 1, 1.0, 0),
        ("INSERT", 9999, 1, 1.0, 0),
    ]

"""Dense block ids: the sliced remap, the replay-order gather and the sliced chaining
check give what the whole-array numpy forms give, on random and edge inputs, with slices
small enough that every input spans several."""

from __future__ import annotations

import numpy as np
import pytest

import controlplane.traces.chaining as chaining
import controlplane.traces.dense_ids as dense_ids_module
import controlplane.traces.model as model
from controlplane.traces.arrays import I64
from controlplane.traces.dense_ids import dense_ids
from controlplane.traces.model import Trace

INT64 = np.iinfo(np.int64)
SLICES = (1, 3, 1 << 20)
"""Slice lengths: one access a pass, a few, and the product's (one pass for these)."""


def unique_reference(hash_ids: I64) -> tuple[I64, I64]:
    """The straightforward form: ``np.unique`` with its first index and inverse,
    renumbered by first index."""
    uniq, first_pos, inverse = np.unique(hash_ids, return_index=True, return_inverse=True)
    rank = np.empty(len(uniq), dtype=np.int64)
    rank[np.argsort(first_pos, kind="stable")] = np.arange(len(uniq), dtype=np.int64)
    hashes = np.empty(len(uniq), dtype=np.int64)
    hashes[rank] = uniq
    return rank[inverse.reshape(-1)], hashes


def random_ids(seed: int) -> I64:
    """Ids drawn from a few to many distinct values, some negative, some at the ends of
    int64, so that runs of equal ids cross slice edges."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 400))
    pool = np.concatenate(
        [rng.integers(-50, 50, size=int(rng.integers(1, 60))), [INT64.min, INT64.max, 0]]
    )
    return rng.choice(pool, size=n).astype(np.int64)


EDGES: dict[str, I64] = {
    "empty": np.zeros(0, dtype=np.int64),
    "one id": np.array([42], dtype=np.int64),
    "all equal": np.full(17, 7, dtype=np.int64),
    "int64 ends": np.array([INT64.max, INT64.min, INT64.max, -1, INT64.min], dtype=np.int64),
    "negative": np.array([-3, -1, -3, -2, -1], dtype=np.int64),
    "descending": np.arange(25, 0, -1, dtype=np.int64),
    "already dense": np.arange(9, dtype=np.int64),
}


def assert_same(got: tuple[I64, I64], want: tuple[I64, I64]) -> None:
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype == np.int64
        assert g.tobytes() == w.tobytes()


@pytest.fixture(params=SLICES)
def slice_length(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    length: int = request.param
    for module in (dense_ids_module, model, chaining):
        monkeypatch.setattr(module, "SLICE", length)
    return length


@pytest.mark.parametrize("name", EDGES)
def test_edge_inputs_match_np_unique(name: str, slice_length: int) -> None:
    ids = EDGES[name]
    assert_same(dense_ids(ids), unique_reference(ids))


@pytest.mark.parametrize("seed", range(40))
def test_random_inputs_match_np_unique(seed: int, slice_length: int) -> None:
    ids = random_ids(seed)
    before = ids.copy()
    assert_same(dense_ids(ids), unique_reference(ids))
    assert ids.tobytes() == before.tobytes()  # the input is left as it was


@pytest.mark.parametrize("seed", range(5))
def test_int64_positions_give_the_same_ids(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # Past 2**31 accesses the sort's positions stay int64: the same path, wider.
    monkeypatch.setattr(dense_ids_module, "_INT32_POSITIONS", 0)
    monkeypatch.setattr(dense_ids_module, "SLICE", 3)
    ids = random_ids(seed)
    assert_same(dense_ids(ids), unique_reference(ids))


def random_requests(seed: int) -> tuple[list[list[int]], list[float]]:
    """Requests out of time order (ties too), some empty, ids from a small pool so that
    some follow several blocks and some requests repeat one."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 40))
    requests = [rng.integers(0, 12, size=int(rng.integers(0, 9))).tolist() for _ in range(n)]
    return requests, rng.integers(0, 10, size=n).astype(float).tolist()


def reference_trace(requests: list[list[int]], timestamps: list[float]) -> tuple[I64, I64]:
    """Blocks and hashes built the plain way: requests sorted by time in Python, then
    ``unique_reference``."""
    order = sorted(range(len(requests)), key=lambda r: timestamps[r])
    flat = np.array([h for r in order for h in requests[r]], dtype=np.int64)
    return unique_reference(flat)


@pytest.mark.parametrize("seed", range(30))
def test_traces_out_of_time_order_match_the_plain_build(seed: int, slice_length: int) -> None:
    requests, timestamps = random_requests(seed)
    trace = Trace.from_requests(requests, timestamps)
    assert_same((trace.blocks, trace.hashes), reference_trace(requests, timestamps))


def several_reference(trace: Trace) -> np.ndarray:
    """Ids after more than one block, from every access's predecessor at once."""
    predecessors = np.full(trace.n_accesses, -1, dtype=np.int64)
    predecessors[1:] = trace.blocks[:-1]
    predecessors[trace.offsets[:-1][trace.lengths > 0]] = -1
    seen: dict[int, set[int]] = {}
    for block, before in zip(trace.blocks.tolist(), predecessors.tolist(), strict=True):
        seen.setdefault(block, set()).add(before)
    return np.array([len(seen.get(b, ())) > 1 for b in range(trace.n_unique)], dtype=np.bool_)


@pytest.mark.parametrize("seed", range(30))
def test_the_sliced_chaining_check_flags_what_the_whole_one_does(
    seed: int, slice_length: int
) -> None:
    trace = Trace.from_requests(*random_requests(seed))
    want = several_reference(trace)
    got = chaining._ids_after_several_blocks(trace.blocks, trace.offsets, trace.n_unique)
    assert got.tolist() == want.tolist()
    checked = chaining.prefix_chained(trace)
    assert (checked is trace) == (not want.any())
    if want.any():
        assert checked.rechained is not None
        assert checked.rechained.ids_after_several_blocks == int(want.sum())

"""Hash ids -> dense ids ``0..U-1`` numbered by first appearance, in bounded memory.

A trace's hash column is its largest array (8 bytes an access). ``np.unique`` with an
index and an inverse holds a sorted copy, a permutation, a cumulative sum and the inverse
at once: about six times the column beside it. Here one stable argsort (its permutation
kept as int32 while the positions fit) is the only full-size temporary besides one flag
per access; every other pass walks the accesses a slice at a time.

Owns ``dense_ids``. It must never reorder requests, read files or know what a block id
means (``controlplane.traces.model`` calls it).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from controlplane.traces.arrays import I64, SLICE

_INT32_POSITIONS = np.iinfo(np.int32).max


def dense_ids(hash_ids: I64) -> tuple[I64, I64]:
    """``(blocks, hashes)``: each access's dense id, numbered by first appearance, and the
    hash id of each dense id; what ``np.unique`` with its first index and inverse gives,
    renumbered by first index. ``hash_ids`` is left as it is."""
    order = _stable_order(hash_ids)
    starts = _run_starts(hash_ids, order)
    blocks = _scattered_runs(order, starts)
    first_seen = order[starts]  # each run's first position: the sort is stable
    del order, starts
    hashes = _renumbered_by_appearance(blocks, first_seen, hash_ids)
    return blocks, hashes


def _stable_order(hash_ids: I64) -> NDArray[np.int64] | NDArray[np.int32]:
    """The positions that sort ``hash_ids``, equal ids in position order; int32 (half the
    memory) when every position fits."""
    order = np.argsort(hash_ids, kind="stable")
    if len(order) <= _INT32_POSITIONS:
        return order.astype(np.int32)
    return order


def _run_starts(hash_ids: I64, order: NDArray[np.int64] | NDArray[np.int32]) -> NDArray[np.bool_]:
    """For each sorted position, whether its hash differs from the one before (the first
    of a run of equal hashes), a slice at a time."""
    starts = np.empty(len(order), dtype=np.bool_)
    previous = None
    for at in range(0, len(order), SLICE):
        values = hash_ids[order[at : at + SLICE]]
        starts[at] = previous is None or values[0] != previous
        np.not_equal(values[1:], values[:-1], out=starts[at + 1 : at + len(values)])
        previous = values[-1]
    return starts


def _scattered_runs(order: NDArray[np.int64] | NDArray[np.int32], starts: NDArray[np.bool_]) -> I64:
    """Each access's run of equal hashes (runs numbered in hash order), scattered back
    from sorted positions to the accesses' own, a slice at a time."""
    runs = np.empty(len(order), dtype=np.int64)
    runs_before = 0
    for at in range(0, len(order), SLICE):
        run = np.cumsum(starts[at : at + SLICE], dtype=np.int64)
        run += runs_before - 1
        runs[order[at : at + SLICE]] = run
        runs_before = int(run[-1]) + 1
    return runs


def _renumbered_by_appearance(
    runs: I64, first_seen: NDArray[np.int64] | NDArray[np.int32], hash_ids: I64
) -> I64:
    """Renumbers ``runs`` in place by first appearance, one pass in position order (a
    run is numbered where ``first_seen`` says it starts, which is no later than any of its
    accesses); returns the hash id of each new number."""
    rank = np.empty(len(first_seen), dtype=first_seen.dtype)
    hashes = np.empty(len(first_seen), dtype=np.int64)
    numbered = 0
    for at in range(0, len(runs), SLICE):
        part = runs[at : at + SLICE]
        first = first_seen[part] == np.arange(at, at + len(part))
        new = part[first]
        rank[new] = np.arange(numbered, numbered + len(new))
        hashes[numbered : numbered + len(new)] = hash_ids[at : at + len(part)][first]
        numbered += len(new)
        part[:] = rank[part]
    return hashes

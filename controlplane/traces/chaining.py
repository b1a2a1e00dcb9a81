"""Prefix-chained block ids: checking a trace's ids and re-chaining those that are not.

Replay keys a block by its whole prefix, as an engine's prefix cache does (vLLM and SGLang
hash a block together with every block before it): block ``i`` of a request is found
only if the same blocks ``0..i`` were cached before. A trace whose ids are prefix-chained
(id ``i`` stands for blocks ``0..i``) already says that: every id follows one and the same
id wherever it appears (the first block of a request follows none), and so no id repeats
inside a request. A trace whose ids hash each block's own tokens does not: the same id
after different prefixes, or twice in one request. ``prefix_chained`` checks the first
property (two passes over the block array, a slice at a time) and, where it fails,
re-chains the ids: a block's new id is a dense id of (its parent's new id, its old id),
depth by depth, which is what a prefix cache keys. On an already chained trace
re-chaining would give the same blocks (``rechain_by_prefix``; the tests hold it to
that), so it is skipped.

Owns ``prefix_chained`` and ``rechain_by_prefix``. It must never read files, refuse a trace or
know about policies.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from numpy.typing import NDArray

from controlplane.traces.arrays import I64, SLICE
from controlplane.traces.model import RechainResult, Trace

_NO_PARENT = -1
"""The predecessor of a request's first block."""


def prefix_chained(trace: Trace) -> Trace:
    """``trace`` itself when its ids are prefix-chained; else a copy with every block
    re-chained by prefix and ``Trace.rechained`` saying why."""
    several = _ids_after_several_blocks(trace.blocks, trace.offsets, trace.n_unique)
    if not several.any():
        return trace
    found = RechainResult(
        ids_after_several_blocks=int(several.sum()),
        requests_repeating_an_id=_requests_repeating_an_id(trace, several),
    )
    return replace(rechain_by_prefix(trace), rechained=found)


def rechain_by_prefix(trace: Trace) -> Trace:
    """``trace`` with each block keyed by its whole prefix (its parent's new id and its own
    id), numbered by first appearance. ``hashes`` become these dense ids: a re-chained
    block has no id of its own in the file."""
    keys, n_keys = _prefix_keys(trace.blocks, trace.offsets)
    blocks = _by_first_appearance(keys, n_keys)
    return replace(trace, blocks=blocks, hashes=np.arange(n_keys, dtype=np.int64))


def _ids_after_several_blocks(blocks: I64, offsets: I64, n_ids: int) -> NDArray[np.bool_]:
    """Whether each id follows more than one block (``_NO_PARENT`` counts as one), a slice
    of accesses at a time: one pass records one of each id's predecessors, any one, and a
    second flags every id with an access whose predecessor is another."""
    starts = offsets[:-1][np.diff(offsets) > 0]
    one_each = np.full(n_ids, _NO_PARENT - 1, dtype=np.int64)
    for at in range(0, len(blocks), SLICE):
        one_each[blocks[at : at + SLICE]] = _predecessors(blocks, starts, at)
    several = np.zeros(n_ids, dtype=np.bool_)
    for at in range(0, len(blocks), SLICE):
        part = blocks[at : at + SLICE]
        several[part[one_each[part] != _predecessors(blocks, starts, at)]] = True
    return several


def _predecessors(blocks: I64, starts: I64, at: int) -> I64:
    """The block before each access of ``blocks[at:at + SLICE]`` in its request;
    ``_NO_PARENT`` for a request's first block (``starts``: where each request that has a
    block starts)."""
    end = min(at + SLICE, len(blocks))
    predecessors = np.empty(end - at, dtype=np.int64)
    predecessors[1:] = blocks[at : end - 1]
    predecessors[0] = blocks[at - 1] if at else _NO_PARENT
    firsts = starts[np.searchsorted(starts, at) : np.searchsorted(starts, end)]
    predecessors[firsts - at] = _NO_PARENT
    return predecessors


def _prefix_keys(blocks: I64, offsets: I64) -> tuple[I64, int]:
    """A dense id per distinct prefix path, one per access, and how many there are.

    Depth by depth (requests are at most a few thousand blocks deep), one ``np.unique``
    over the (parent, block) pairs of every request that long: parents are numbered within
    their depth, so a pair packs into one int64 (requests x ids, each factor below the
    number of accesses, which a trace that fits in memory keeps far under 2**31.5)."""
    lengths = np.diff(offsets)
    longest_first = np.argsort(-lengths, kind="stable")
    starts = offsets[:-1][longest_first]
    depth_reached = -lengths[longest_first]  # ascending, for searchsorted
    n_ids = int(blocks.max()) + 1 if len(blocks) else 0
    keys = np.empty_like(blocks)
    parents = np.zeros(len(starts), dtype=np.int64)
    numbered = 0
    for depth in range(int(lengths.max()) if len(lengths) else 0):
        alive = int(np.searchsorted(depth_reached, -depth, side="left"))
        at = starts[:alive] + depth
        pairs, parents = np.unique(parents[:alive] * n_ids + blocks[at], return_inverse=True)
        parents = parents.reshape(-1)
        keys[at] = numbered + parents
        numbered += len(pairs)
    return keys, numbered


def _by_first_appearance(keys: I64, n_keys: int) -> I64:
    """``keys`` (dense, ``0..n_keys-1``) renumbered in order of first appearance, as
    ``Trace.from_arrays`` numbers ids; in linear time, where a sort of every access would
    take most of a re-chaining."""
    positions = np.arange(len(keys), dtype=np.int64)
    first = np.empty(n_keys, dtype=np.int64)
    # Repeated indices in an assignment leave the last value: backwards, the first position.
    first[keys[::-1]] = positions[::-1]
    rank = np.empty(n_keys, dtype=np.int64)
    rank[keys[first[keys] == positions]] = np.arange(n_keys, dtype=np.int64)
    return rank[keys]


def _requests_repeating_an_id(trace: Trace, several: NDArray[np.bool_]) -> int:
    """How many requests hold some id more than once, looking only at the ids that follow
    ``several`` blocks: a request that repeats an id repeats one of those (the blocks
    before two occurrences differ, or the blocks before those do, back to a first block,
    which follows none)."""
    kept = several[trace.blocks]
    request_of = np.repeat(np.arange(trace.n_requests, dtype=np.int64), trace.lengths)[kept]
    keys = np.sort(request_of * trace.n_unique + trace.blocks[kept])
    repeats = keys[1:][keys[1:] == keys[:-1]]
    return len(np.unique(repeats // trace.n_unique))

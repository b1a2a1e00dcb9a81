"""Prompt forests for synthetic traces: which 16-token blocks two prompts share.

Owns the one rule that makes synthetic hash ids prefix-consistent: every prompt (a node)
names a parent prompt and how many of its leading tokens it shares with it; the node
inherits the parent's ids for every *full* block inside the shared tokens and gets fresh
ids for the rest (a partial block, or anything after the shared tokens, is new content).
A node may instead be a verbatim copy of its parent (a regenerated answer re-sends the
same prompt), which inherits every block, the partial last one included.

Templates (platform system prompts, a user's persona, an app's system prompt, a
document fanned out to several calls) are nodes too, but not requests: only request
nodes become trace lines (``controlplane.traces.synth_build``).

Block ids are assigned level by level (a node's level is its parent's plus one), each
level in one vectorised pass, so a forest of millions of blocks takes well under a
second. It must never draw random numbers (the profiles do) or build a ``Trace``.
"""

from __future__ import annotations

import itertools

import numpy as np
from numpy.typing import NDArray

from controlplane.traces.arrays import I64

BLOCK_TOKENS = 16
"""Tokens per block, as in the public Bailian traces (``*_blksz_16``)."""


def n_blocks(tokens: I64) -> I64:
    """Blocks of a prompt of ``tokens`` tokens: the last one may be partial."""
    return (np.asarray(tokens, dtype=np.int64) + BLOCK_TOKENS - 1) // BLOCK_TOKENS


class PromptForest:
    """Nodes added in batches, parents always before children."""

    def __init__(self) -> None:
        self._parent: list[I64] = []
        self._shared: list[I64] = []
        self._length: list[I64] = []
        self._copy: list[NDArray[np.bool_]] = []
        self._level: list[I64] = []
        self._size = 0
        self._levels_flat = np.zeros(0, dtype=np.int64)
        self._lengths_flat = np.zeros(0, dtype=np.int64)

    def __len__(self) -> int:
        return self._size

    def add(
        self,
        *,
        parent: I64,
        shared: I64,
        length: I64,
        copy: NDArray[np.bool_] | None = None,
    ) -> I64:
        """Add nodes; return their indices.

        ``parent``: index of an existing node, or -1 for none. ``shared``: leading tokens
        shared with the parent (only its full blocks are inherited). ``length``: prompt
        tokens (>= 1). ``copy``: the node re-sends its parent verbatim (same length).
        """
        parent = np.asarray(parent, dtype=np.int64)
        n = len(parent)
        length = np.asarray(length, dtype=np.int64)
        shared = np.asarray(shared, dtype=np.int64)
        copy_arr = np.zeros(n, dtype=bool) if copy is None else np.asarray(copy, dtype=bool)
        if not (len(length) == len(shared) == len(copy_arr) == n):
            raise ValueError("parent, shared, length and copy differ in length")
        if n and int(length.min()) < 1:
            raise ValueError("every prompt has at least one token")
        if n and int(parent.max()) >= self._size:
            raise ValueError("a parent must be added before its children")
        levels = self._levels_flat
        lengths = self._lengths_flat
        has_parent = parent >= 0
        level = np.zeros(n, dtype=np.int64)
        level[has_parent] = levels[parent[has_parent]] + 1
        if np.any(copy_arr & ~has_parent) or np.any(
            copy_arr[has_parent] & (length[has_parent] != lengths[parent[has_parent]])
        ):
            raise ValueError("a copy needs a parent of the same length")
        self._parent.append(parent)
        self._shared.append(np.where(has_parent, np.minimum(shared, length), 0))
        self._length.append(length)
        self._copy.append(copy_arr)
        self._level.append(level)
        self._levels_flat = np.concatenate([levels, level])
        self._lengths_flat = np.concatenate([lengths, length])
        first = self._size
        self._size += n
        return np.arange(first, self._size, dtype=np.int64)

    @property
    def lengths(self) -> I64:
        """Prompt tokens of every node."""
        return self._lengths_flat

    def block_ids(self) -> tuple[I64, I64]:
        """``(offsets, ids)``: node ``i`` holds ``ids[offsets[i]:offsets[i + 1]]``.

        Fresh ids count up from 0 in (level, node, block) order, so they depend only on
        the forest's shape.
        """
        parent = _cat(self._parent)
        shared = _cat(self._shared)
        copy = np.concatenate(self._copy) if self._copy else np.zeros(0, dtype=bool)
        level = self._levels_flat
        nb = n_blocks(self._lengths_flat)
        offsets = np.zeros(len(nb) + 1, dtype=np.int64)
        np.cumsum(nb, out=offsets[1:])
        ids = np.empty(int(offsets[-1]), dtype=np.int64)

        safe_parent = np.maximum(parent, 0)
        inherit = np.where(copy, nb, np.minimum(shared // BLOCK_TOKENS, nb[safe_parent]))
        inherit = np.where(parent >= 0, np.minimum(inherit, nb), 0)

        next_id = 0
        by_level = np.argsort(level, kind="stable")
        bounds = np.searchsorted(level[by_level], np.arange(int(level.max(initial=0)) + 2))
        for lo, hi in itertools.pairwise(bounds):
            nodes = by_level[lo:hi]
            if len(nodes) == 0:
                continue
            counts = nb[nodes]
            within = _ranks(counts)
            pos = np.repeat(offsets[nodes], counts) + within
            copied = within < np.repeat(inherit[nodes], counts)
            src = np.repeat(offsets[safe_parent[nodes]], counts) + within
            ids[pos[copied]] = ids[src[copied]]
            fresh = pos[~copied]
            ids[fresh] = np.arange(next_id, next_id + len(fresh), dtype=np.int64)
            next_id += len(fresh)
        return offsets, ids


def _ranks(counts: I64) -> I64:
    """``0..c-1`` for each count ``c``, concatenated."""
    total = int(counts.sum())
    starts = np.repeat(np.cumsum(counts) - counts, counts)
    return np.arange(total, dtype=np.int64) - starts


def _cat(parts: list[I64]) -> I64:
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

"""The access events a replay feeds its fitter, computed once per trace with numpy.

Owns ``AccessColumns``: per block access of a trace (trace order), the columns an agent
sends for it (``agent.wire``): its time, its category, and the time and category of the
same block's previous access (NaN / -1 for a first access). The previous access is the
block's previous access in the trace, whether or not the block stayed cached in between:
the agent remembers it past eviction (docs/fitting.md, "What the sender must know").
Also ``request_categories``: each request's category code and the name table, from the
trace's labels or inferred from its blocks (``agent.category_inference``), as a cache
would see them; ``with_reuse_class``, which splits each category by whether the block
was accessed before (trace knowledge); and ``HitClasses``, which splits it the way the
agent does, by whether the request found the block cached (known only as the replay runs).

It must never replay, fit or hold state between calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from agent.category_inference import CategoryInferrer, InferSettings
from agent.category_table import REUSED_SUFFIX
from agent.reuse_classes import ReturnTracker
from controlplane.replay.options import Attribution, CategorySource
from controlplane.traces.arrays import F64, I32, I64
from controlplane.traces.model import Trace


@dataclass(frozen=True, eq=False)
class AccessColumns:
    """Access events of a whole trace; access ``i`` belongs to the request ``r`` with
    ``offsets[r] <= i < offsets[r + 1]``. ``category`` is the block's category under the
    attribution rule (the accessing request's, or the block creator's)."""

    ts: F64
    category: I32
    prev_ts: F64
    prev_category: I32
    offsets: I64

    def __len__(self) -> int:
        return len(self.ts)


def previous_access(blocks: I64) -> I64:
    """For every access position, the position of the same block's previous access
    (-1 for the first)."""
    order = np.argsort(blocks, kind="stable")
    prev = np.full(len(blocks), -1, dtype=np.int64)
    same = blocks[order[1:]] == blocks[order[:-1]]
    prev[order[1:][same]] = order[:-1][same]
    return prev


def access_columns(trace: Trace, codes: I32, attribution: Attribution) -> AccessColumns:
    """The access events of ``trace`` whose requests have category ``codes``."""
    lengths = trace.lengths
    ts = np.repeat(trace.timestamps, lengths)
    cat = np.repeat(np.asarray(codes, dtype=np.int32), lengths)
    if attribution == "creator" and len(cat):
        # A block keeps the category of the request that first accessed it.
        first = np.full(trace.n_unique, len(cat), dtype=np.int64)
        np.minimum.at(first, trace.blocks, np.arange(len(cat), dtype=np.int64))
        cat = cat[first[trace.blocks]]
    prev = previous_access(trace.blocks)
    known = prev >= 0
    prev_ts = np.full(len(ts), np.nan)
    prev_ts[known] = ts[prev[known]]
    prev_cat = np.full(len(ts), -1, dtype=np.int32)
    prev_cat[known] = cat[prev[known]]
    return AccessColumns(ts, cat, prev_ts, prev_cat, trace.offsets)


BLOCK_TOKENS = {"bailian": 16, "mooncake": 512}
"""Tokens per hash id of each trace format (docs/traces.md)."""


def block_tokens_of(trace: Trace) -> int | None:
    """Tokens per hash id of ``trace``: what it says (a recorded trace), else its format's;
    None for a format that does not say."""
    return trace.block_tokens or BLOCK_TOKENS.get(trace.source_format)


def with_reuse_class(
    trace: Trace, cols: AccessColumns, names: Sequence[str]
) -> tuple[AccessColumns, tuple[str, ...], I32]:
    """Split every category ``w`` into ``w`` (a block's first access) and ``w/re`` (a
    block accessed before, cached or not). Returns the columns with the new codes, the
    ``2 K`` names, and per access the code offset (0 or ``K``) to add to its request's
    code. A reuse gap belongs to the class of the access it closes."""
    k = len(names)
    prev = previous_access(trace.blocks)
    shift = np.where(prev >= 0, k, 0).astype(np.int32)
    cat = (cols.category + shift).astype(np.int32)
    prev_cat = np.where(prev >= 0, cat[np.maximum(prev, 0)], -1).astype(np.int32)
    out = AccessColumns(cols.ts, cat, cols.prev_ts, prev_cat, cols.offsets)
    return out, (*names, *(n + REUSED_SUFFIX for n in names)), shift


def request_categories(
    trace: Trace, source: CategorySource, infer: InferSettings | None = None
) -> tuple[I32, tuple[str, ...]]:
    """Each request's category code and the code -> name table: the trace's labels, or
    categories inferred request by request, in replay order, from blocks and prompt
    length alone (``agent.category_inference``; the trace's labels are not looked at)."""
    if source == "labels":
        return trace.categories, trace.category_names
    if infer is None:
        infer = InferSettings(block_tokens=block_tokens_of(trace) or 16)
    inferrer = CategoryInferrer(infer)
    names = inferrer.settings.names()
    code_of = {name: i for i, name in enumerate(names)}
    hashes = trace.hashes
    offsets = trace.offsets.tolist()
    tokens = trace.input_lengths.tolist()
    codes = np.empty(trace.n_requests, dtype=np.int32)
    for r in range(trace.n_requests):
        blocks = hashes[trace.blocks[offsets[r] : offsets[r + 1]]].tolist()
        n_tokens = tokens[r] if tokens[r] >= 0 else None
        codes[r] = code_of[inferrer.infer(blocks, n_tokens)]
    return codes, names


class HitClasses:
    """Reuse classes as the agent makes them (``KVWISE_REUSE_CLASSES``): an access is in
    its category's ``w/re`` class when the request found the block cached (a hit) or the
    block is among the ``ghost`` most recently evicted ones (the agent's
    ``KVWISE_REUSE_GHOST_BLOCKS``), in ``w`` otherwise: the agent's own ``ReturnTracker``
    decides. The class depends on the cache, so it is recorded as the replay runs (the
    tracker told of hits and evictions, ``classify`` per release, ``finished`` per
    request), and the fitter takes a request's accesses once it has released
    (``released_columns``): a simulated server finishes requests after later ones have
    arrived, as the agent reports a request's classes only at its release. Codes of
    ``w/re`` are ``w``'s plus ``K``, the number of categories. ``previous`` is
    ``previous_access`` of the trace's blocks, read only: it does not depend on the cache,
    so the caches of a fleet share one."""

    def __init__(
        self,
        trace: Trace,
        cols: AccessColumns,
        names: Sequence[str],
        ghost: int,
        *,
        previous: I64,
    ) -> None:
        self.k = len(names)
        self.names = (*names, *(n + REUSED_SUFFIX for n in names))
        self.tracker = ReturnTracker(ghost)
        self.previous = previous
        self._shift = np.zeros(len(cols), dtype=np.int32)
        self._cat = cols.category.copy()
        self._prev_cat = np.full(len(cols), -1, dtype=np.int32)
        self._cols = AccessColumns(cols.ts, self._cat, cols.prev_ts, self._prev_cat, cols.offsets)
        self._base = cols.category
        self._request_starts = trace.offsets
        self._released: set[int] = set()

    def classify(self, first: int, blocks: Sequence[int], offsets: Sequence[int]) -> list[int]:
        """The class offset (0 or ``K``) of each released block (access ``first + offset``
        of the trace), recorded for the fitter."""
        k = self.k
        shift = [k if again else 0 for again in self.tracker.returns(blocks)]
        self._shift[np.asarray(offsets, dtype=np.int64) + first] = shift
        return shift

    def finished(self, request: int) -> None:
        """``request`` released what it holds: its accesses' classes are final."""
        self._released.add(request)

    def released_columns(self) -> tuple[AccessColumns, I64]:
        """The fitter's columns and the positions in them of the accesses of the requests
        released since the last call (in request order), their classes now final. A
        previous access whose request has not released yet counts in its ``w`` class."""
        starts = self._request_starts
        ranges = [np.arange(starts[r], starts[r + 1]) for r in sorted(self._released)]
        self._released.clear()
        at = np.concatenate(ranges) if ranges else np.empty(0, dtype=np.int64)
        self._cat[at] = self._base[at] + self._shift[at]
        prev = self.previous[at]
        self._prev_cat[at] = np.where(prev >= 0, self._cat[np.maximum(prev, 0)], -1)
        return self._cols, at

"""Prefix depth in ``wa``, replay only: depth classes and hits valued by the prefill saved.

Owns ``with_depth_class``, which splits every category ``w`` by the depth of the block in
its prompt (``w@d0``, ``w@d1``, ``w@d2``: token positions below 2,048, below 8,192, the
rest), so each depth gets its own fitted reuse curve, and ``CostWeightedWA``, ``wa``'s
evictor whose per-category constant ``lc`` also carries the log of what a hit on a block
of that depth saves: recomputing a block at token position ``x`` costs ``2 P`` FLOPs per
token for the weights plus ``4 layers d x`` for attention over its prefix, so relative
to a block at the start it costs ``1 + x / X`` with ``X = 2 P / (4 layers d)`` (30,518
tokens for Llama-3.1-8B: 8.03e9 parameters, 32 layers, 4,096-wide attention). The key
form of ``agent.policies.wa_core`` is unchanged (a constant per category code); blocks
rank by expected saved prefill per cached block instead of hit probability. Both are
measured in docs/policy.md ("A better wa") and are not in the agent. It must never fit,
replay or do I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from agent.policies.wa import WAPolicy
from agent.policies.wa_core import Const
from controlplane.replay.accesses import AccessColumns, previous_access
from controlplane.traces.arrays import I32
from controlplane.traces.model import Trace

DEPTH_EDGES_TOKENS = (2048, 8192)
"""Token positions where the depth classes change."""
ATTENTION_EVEN_TOKENS = 2 * 8.03e9 / (4 * 32 * 4096)
"""Context length at which a token's attention FLOPs equal its weight FLOPs (Llama-3.1-8B)."""
DEPTH_MARK = "@d"
"""Separates a category's name from its depth class: ``w@d1``."""
_CLASS_MID_TOKENS = (1024.0, 5120.0, 16384.0)
"""The token position each depth class is valued at (its middle; 16K for the open one)."""


def depth_saving(depth_class: int) -> float:
    """Prefill saved by a hit on a block of ``depth_class``, relative to the first block."""
    return 1.0 + _CLASS_MID_TOKENS[depth_class] / ATTENTION_EVEN_TOKENS


def with_depth_class(
    trace: Trace, cols: AccessColumns, names: Sequence[str], block_tokens: int
) -> tuple[AccessColumns, tuple[str, ...], I32]:
    """Split every category by the depth class of each access's block (its position in
    the prompt, ``block_tokens`` tokens a block). Returns the columns with the new codes
    (``w``'s code plus ``K`` times the class), the ``3 K`` names and the per-access code
    offset; the reuse gap belongs to the class of the access it closes."""
    k = len(names)
    lengths = np.diff(trace.offsets)
    starts = np.repeat(trace.offsets[:-1], lengths)
    tokens = (np.arange(len(cols)) - starts) * block_tokens
    depth = np.searchsorted(np.asarray(DEPTH_EDGES_TOKENS), tokens, side="right")
    shift = (depth * k).astype(np.int32)
    cat = (cols.category + shift).astype(np.int32)
    prev = previous_access(trace.blocks)
    prev_cat = np.where(prev >= 0, cat[np.maximum(prev, 0)], -1).astype(np.int32)
    out = AccessColumns(cols.ts, cat, cols.prev_ts, prev_cat, cols.offsets)
    classes = range(len(DEPTH_EDGES_TOKENS) + 1)
    return out, tuple(f"{n}{DEPTH_MARK}{d}" for d in classes for n in names), shift


class CostWeightedWA(WAPolicy):
    """``wa`` ranking by expected saved prefill: each depth class's constant gains the
    log of ``depth_saving`` (categories without a depth mark are valued as depth 0)."""

    __slots__ = ()

    def _const_of(self, name: str | None) -> Const:
        log_constant, rate = super()._const_of(name)
        _, mark, depth = (name or "").rpartition(DEPTH_MARK)
        depth_class = int(depth) if mark and depth.isdigit() else 0
        return log_constant + math.log(depth_saving(depth_class)), rate

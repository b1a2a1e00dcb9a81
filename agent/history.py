"""Last access time and category of each block the agent knows, for ``prev_ts`` and
``prev_category`` of every event.

Owns a bounded side table keyed by block hash: every cached block, plus a ghost of the
most recently evicted ones (oldest forgotten first), so a block that comes back after
eviction still reports its previous access. Called on the engine thread only, with bulk
C-level dict operations (no Python loop per block). It must never do I/O or evict.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Sequence
from itertools import compress, islice, repeat

import numpy as np
from numpy.typing import NDArray

_NAN = math.nan


class AccessHistory:
    """Cached blocks and ``ghost_size`` evicted ones: last access time and category."""

    __slots__ = ("_cat", "_ghost", "_ts", "ghost_size")

    def __init__(self, ghost_size: int) -> None:
        self.ghost_size = max(ghost_size, 0)
        self._ts: dict[int, float] = {}
        self._cat: dict[int, int] = {}
        self._ghost: OrderedDict[int, None] = OrderedDict()

    def access(
        self, blocks: list[int], now: float, category: int
    ) -> tuple[NDArray[np.float64], NDArray[np.int32]]:
        """Record that cached ``blocks`` were accessed at ``now`` by ``category``; return
        their previous access times (NaN if unknown) and categories (-1 if unknown)."""
        n = len(blocks)
        prev_ts = np.fromiter(map(self._ts.get, blocks, repeat(_NAN)), np.float64, n)
        prev_cat = np.fromiter(map(self._cat.get, blocks, repeat(-1)), np.int32, n)
        self._ts.update(zip(blocks, repeat(now)))
        self._cat.update(zip(blocks, repeat(category)))
        return prev_ts, prev_cat

    def insert(
        self, blocks: list[int], now: float, category: int
    ) -> tuple[NDArray[np.bool_], NDArray[np.float64], NDArray[np.int32]]:
        """Blocks released by a request: the ones not cached before (a mask) are inserted
        with access ``now``; return the mask and their previous access (from the ghost)."""
        n = len(blocks)
        prev_ts = np.fromiter(map(self._ts.get, blocks, repeat(_NAN)), np.float64, n)
        in_ghost = np.fromiter(map(self._ghost.__contains__, blocks), np.bool_, n)
        new = np.isnan(prev_ts)
        new |= in_ghost
        if not new.any():
            return new, prev_ts[:0], np.empty(0, np.int32)
        fresh = list(compress(blocks, new.tolist()))
        prev_cat = np.fromiter(map(self._cat.get, fresh, repeat(-1)), np.int32, len(fresh))
        if in_ghost.any():
            deque(map(self._ghost.pop, fresh, repeat(None)), maxlen=0)
        self._ts.update(zip(fresh, repeat(now)))
        self._cat.update(zip(fresh, repeat(category)))
        return new, prev_ts[new], prev_cat

    def evict(self, victims: Sequence[int]) -> tuple[NDArray[np.float64], NDArray[np.int32]]:
        """``victims`` left the cache: return their last access time and category, and move
        them to the ghost (forgetting the oldest ghosts beyond ``ghost_size``)."""
        n = len(victims)
        last_ts = np.fromiter(map(self._ts.get, victims, repeat(_NAN)), np.float64, n)
        last_cat = np.fromiter(map(self._cat.get, victims, repeat(-1)), np.int32, n)
        self._ghost.update(zip(victims, repeat(None)))
        excess = len(self._ghost) - self.ghost_size
        if excess > 0:
            old = list(islice(self._ghost, excess))
            deque(map(self._ghost.__delitem__, old), maxlen=0)
            deque(map(self._ts.pop, old, repeat(None)), maxlen=0)
            deque(map(self._cat.pop, old, repeat(None)), maxlen=0)
        return last_ts, last_cat

    def __len__(self) -> int:
        """Blocks remembered: cached plus ghost."""
        return len(self._ts)

    @property
    def ghosts(self) -> int:
        return len(self._ghost)

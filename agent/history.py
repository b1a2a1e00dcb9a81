"""Last access time and category of each block the agent knows, for ``prev_ts`` and
``prev_category`` of every event.

Owns a bounded side table keyed by block hash: every cached block, plus a ghost of the
most recently evicted ones (oldest forgotten first), so a block that comes back after
eviction still reports its previous access. One dict maps a hash to a slot; everything
else lives in numpy arrays indexed by slot, and the ghost's order is a ring of slots, so a
request costs one C-level dict pass plus vectorised gathers and scatters, never a Python
loop per block. Called on the engine thread only. It must never do I/O or evict.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from itertools import compress, repeat
from typing import Any

import numpy as np
from numpy.typing import NDArray

_NO_TS = np.empty(0, np.float64)
_NO_CAT = np.empty(0, np.int32)


def _constant(n: int, value: float | int | bool, dtype: type) -> NDArray[Any]:
    a: NDArray[Any] = np.full(n, value, dtype)
    a.flags.writeable = False
    return a


# Read-only answers for the plain miss, sliced instead of allocated per request.
_CONST_N = 1 << 16
_ALL_NAN = _constant(_CONST_N, np.nan, np.float64)
_ALL_UNKNOWN = _constant(_CONST_N, -1, np.int32)
_ALL_TRUE = _constant(_CONST_N, True, np.bool_)


class AccessHistory:
    """Cached blocks and up to ``ghost_size`` evicted ones: last access time and category.

    Per slot: ``ts``, ``cat``, the block hash, and ``gseq``, the eviction number that made
    it a ghost (-1: not a ghost). The ring lists (slot, eviction number) in eviction
    order; an entry whose slot has since come back or been reused is stale and skipped.
    """

    __slots__ = (
        "_block",
        "_cat",
        "_evictions",
        "_free",
        "_gseq",
        "_n_free",
        "_ring_head",
        "_ring_seq",
        "_ring_slot",
        "_ring_tail",
        "_slot",
        "_stale",
        "_ts",
        "ghost_size",
        "ghosts",
    )

    def __init__(self, ghost_size: int, initial_slots: int = 1024, ring_slack: int = 1024) -> None:
        self.ghost_size = max(ghost_size, 0)
        self.ghosts = 0
        """Evicted blocks remembered now."""
        self._slot: dict[int, int] = {}
        self._ts = np.empty(0, np.float64)
        self._cat = np.empty(0, np.int32)
        self._block = np.empty(0, np.int64)
        self._gseq = np.empty(0, np.int64)
        self._free = np.empty(0, np.int64)  # stack of unused slots; top at _n_free - 1
        self._n_free = 0
        self._grow(max(initial_slots, 1))
        # Compacted when full, so O(1) amortized per eviction.
        ring = 2 * self.ghost_size + max(ring_slack, 1)
        self._ring_slot = np.empty(ring, np.int64)
        self._ring_seq = np.empty(ring, np.int64)
        self._ring_head = 0  # ring entries live in [head, tail)
        self._ring_tail = 0
        self._evictions = 0
        self._stale = 0  # ring entries of revived ghosts (0: every entry is live)

    def access(
        self, blocks: list[int], now: float, category: int
    ) -> tuple[NDArray[np.float64], NDArray[np.int32]]:
        """Record that cached ``blocks`` were accessed at ``now`` by ``category``; return
        their previous access times (NaN if unknown) and categories (-1 if unknown)."""
        slots = self._slots(blocks)
        if slots.min() < 0:  # cached before the agent saw it: remember it from now on
            unknown = slots < 0
            slots[unknown] = self._adopt(list(compress(blocks, unknown.tolist())))
        ghosts = self._gseq[slots] >= 0
        if ghosts.any():  # an evicted block in use again: no longer a ghost
            self._revive(slots[ghosts])
        prev_ts, prev_cat = self._ts[slots], self._cat[slots]
        self._ts[slots] = now
        self._cat[slots] = category
        return prev_ts, prev_cat

    def insert(
        self, blocks: list[int], now: float, category: int
    ) -> tuple[NDArray[np.bool_], NDArray[np.float64], NDArray[np.int32]]:
        """Blocks released by a request: the ones not cached before (returned as a mask)
        are inserted with access ``now``; also returns their previous access (known only
        for blocks still in the ghost)."""
        n = len(blocks)
        slots = self._slots(blocks)
        if n and slots.max() < 0:  # all unknown: the plain miss
            self._adopt(blocks, now, category)
            if n <= _CONST_N:
                return _ALL_TRUE[:n], _ALL_NAN[:n], _ALL_UNKNOWN[:n]
            return np.ones(n, np.bool_), np.full(n, np.nan), np.full(n, -1, np.int32)
        unknown = slots < 0
        ghosts = self._gseq[slots] >= 0  # slot -1 reads the last slot: masked out next
        ghosts &= ~unknown
        new = unknown | ghosts
        if not new.any():  # all held: the hit path
            return new, _NO_TS, _NO_CAT
        if unknown.any():
            slots[unknown] = self._adopt(list(compress(blocks, unknown.tolist())))
        if ghosts.any():
            self._revive(slots[ghosts])
        fresh = slots[new]
        prev_ts, prev_cat = self._ts[fresh], self._cat[fresh]
        self._ts[fresh] = now
        self._cat[fresh] = category
        return new, prev_ts, prev_cat

    def evict(self, victims: Sequence[int]) -> tuple[NDArray[np.float64], NDArray[np.int32], bool]:
        """``victims`` left the cache: return their last access time and category (NaN,
        -1 if unknown) and whether all were known; make them ghosts, forgetting the oldest
        beyond ``ghost_size``."""
        slots = self._slots(victims)
        complete = not len(slots) or slots.min() >= 0
        if not complete:
            known = slots >= 0
            last_ts = np.full(len(slots), np.nan)
            last_cat = np.full(len(slots), -1, np.int32)
            slots = slots[known]
            last_ts[known], last_cat[known] = self._ts[slots], self._cat[slots]
        else:
            last_ts, last_cat = self._ts[slots], self._cat[slots]
        self._push_ghosts(slots)
        if self.ghosts > self.ghost_size:
            self._forget(self.ghosts - self.ghost_size)
        return last_ts, last_cat, complete

    def __len__(self) -> int:
        """Blocks remembered: cached plus ghost."""
        return len(self._slot)

    # --- slots ---------------------------------------------------------------------------
    def _slots(self, blocks: Sequence[int]) -> NDArray[np.int64]:
        return np.fromiter(map(self._slot.get, blocks, repeat(-1)), np.int64, len(blocks))

    def _adopt(
        self, blocks: list[int], now: float = np.nan, category: int = -1
    ) -> NDArray[np.int64]:
        """Slots for blocks not in the table, stamped ``now`` and ``category`` (default:
        unknown). A block named twice in one call gets two slots, of which the dict keeps
        the last; hashes do not repeat within a request, so this never leaks in practice."""
        k = len(blocks)
        if self._n_free < k:
            self._grow(max(k, len(self._ts)))
        slots = self._free[self._n_free - k : self._n_free][::-1].copy()
        self._n_free -= k
        self._ts[slots] = now
        self._cat[slots] = category
        self._block[slots] = blocks
        self._slot.update(zip(blocks, slots.tolist(), strict=True))
        return slots

    def _revive(self, slots: NDArray[np.int64]) -> None:
        # Their ring entries go stale (gseq no longer matches) and are skipped later.
        self._gseq[slots] = -1
        self.ghosts -= len(slots)
        self._stale += len(slots)

    def _push_ghosts(self, slots: NDArray[np.int64]) -> None:
        k = len(slots)
        if self._ring_tail + k > len(self._ring_slot):
            self._compact_ring(k)
        lo, hi = self._ring_tail, self._ring_tail + k
        seqs = np.arange(self._evictions, self._evictions + k, dtype=np.int64)
        self._evictions += k
        self._ring_slot[lo:hi] = slots
        self._ring_seq[lo:hi] = seqs
        self._gseq[slots] = seqs
        self._ring_tail = hi
        self.ghosts += k

    def _forget(self, k: int) -> None:
        """Forget the ``k`` oldest ghosts: drop their hashes and free their slots."""
        while k > 0 and self._ring_head < self._ring_tail:
            lo = self._ring_head
            hi = min(self._ring_tail, lo + k)
            slots = self._ring_slot[lo:hi]
            live = None if self._stale == 0 else self._gseq[slots] == self._ring_seq[lo:hi]
            if live is None or live.all():
                gone, end = slots, hi
            else:  # skip stale entries: take the first k live ones
                n_live = np.cumsum(live)
                end = hi if n_live[-1] < k else lo + int(np.searchsorted(n_live, k)) + 1
                gone = slots[: end - lo][live[: end - lo]]
                self._stale -= end - lo - len(gone)
            self._ring_head = end
            if len(gone):
                deque(map(self._slot.pop, self._block[gone].tolist()), maxlen=0)
                self._gseq[gone] = -1
                self._free[self._n_free : self._n_free + len(gone)] = gone
                self._n_free += len(gone)
                self.ghosts -= len(gone)
                k -= len(gone)

    def _compact_ring(self, room: int) -> None:
        """Move the live ring entries to the front (growing the ring if ``room`` more
        would not fit): stale entries of revived blocks are dropped here."""
        lo, hi = self._ring_head, self._ring_tail
        slots, seqs = self._ring_slot[lo:hi], self._ring_seq[lo:hi]
        live = self._gseq[slots] == seqs
        slots, seqs = slots[live], seqs[live]
        self._stale = 0
        n = len(slots)
        if n + room > len(self._ring_slot):
            size = 2 * (n + room)
            self._ring_slot = np.empty(size, np.int64)
            self._ring_seq = np.empty(size, np.int64)
        self._ring_slot[:n] = slots
        self._ring_seq[:n] = seqs
        self._ring_head, self._ring_tail = 0, n

    def _grow(self, extra: int) -> None:
        old = len(self._ts)
        new = old + extra
        self._ts = np.concatenate([self._ts, np.full(extra, np.nan)])
        self._cat = np.concatenate([self._cat, np.full(extra, -1, np.int32)])
        self._block = np.concatenate([self._block, np.zeros(extra, np.int64)])
        self._gseq = np.concatenate([self._gseq, np.full(extra, -1, np.int64)])
        free = np.empty(new, np.int64)
        free[: self._n_free] = self._free[: self._n_free]
        free[self._n_free : self._n_free + extra] = np.arange(new - 1, old - 1, -1)
        self._free = free
        self._n_free += extra

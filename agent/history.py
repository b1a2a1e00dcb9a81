"""Turns the engine's raw block operations into wire events, with each block's previous
access: the side table of last accesses, and the batch resolver that reads and updates it.

The engine thread records only what it knows cheaply (HIT for touched blocks, FREE for
every released block, EVICT for victims). This module, on the publisher thread, resolves a
batch of them in order with vectorised numpy: a FREE of a block the cache did not hold
becomes an INSERT, a FREE of a held block is dropped, and every event gets ``prev_ts`` and
``prev_category`` (an EVICT also gets its block's last category). The table holds every
cached block plus a ghost of the ``ghost_size`` most recently evicted ones (oldest
forgotten first), so a block that comes back after eviction still reports its previous
access. One dict maps a hash to a slot; everything else lives in numpy arrays indexed by
slot, and the ghost's order is a ring of slots. It must never do I/O or be called from the
engine thread.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence
from itertools import repeat

import numpy as np
from numpy.typing import NDArray

from agent.wire import EventKind, Events, RawEvents

log = logging.getLogger(__name__)

HIT = int(EventKind.HIT)
FREE = int(EventKind.INSERT)
"""Raw kind of a released block; resolved to INSERT (not held before) or dropped (held)."""
EVICT = int(EventKind.EVICT)
INITIAL_RING = 1 << 16
"""Ghost ring entries allocated up front; it grows from there as ghosts come."""


class AccessHistory:
    """The side table (cached blocks and up to ``ghost_size`` evicted ones) and the
    resolver. More than ``max_blocks`` entries means the table missed evictions (events
    dropped before it saw them): it is cleared and rebuilt from what comes next.

    Per slot: ``ts``, ``cat``, the block hash, and ``gseq``, the eviction number that made
    it a ghost (-1: cached). The ring lists (slot, eviction number) in eviction order; an
    entry whose slot has since come back or been reused is stale and skipped.
    """

    def __init__(
        self,
        ghost_size: int,
        max_blocks: int | None = None,
        *,
        initial_slots: int = 1024,
        ring_slack: int = 1024,
    ) -> None:
        self.ghost_size = max(ghost_size, 0)
        self.max_blocks = max_blocks
        self.resets = 0
        self._initial = (max(initial_slots, 1), max(ring_slack, 1))
        self._clear()

    def _clear(self) -> None:
        initial_slots, ring_slack = self._initial
        self.ghosts = 0
        """Evicted blocks remembered now."""
        self._slot: dict[int, int] = {}
        self._ts = np.empty(0, np.float64)
        self._cat = np.empty(0, np.int32)
        self._block = np.empty(0, np.int64)
        self._gseq = np.empty(0, np.int64)
        self._free = np.empty(0, np.int64)  # stack of unused slots; top at _n_free - 1
        self._n_free = 0
        self._grow(initial_slots)
        # Compacted when full and kept at least twice what it holds after, so O(1)
        # amortized per eviction; it starts small (a large ghost is reached by growing).
        ring = min(2 * self.ghost_size, INITIAL_RING) + ring_slack
        self._ring_slot = np.empty(ring, np.int64)
        self._ring_seq = np.empty(ring, np.int64)
        self._ring_head = 0  # live entries are in [head, tail)
        self._ring_tail = 0
        self._evictions = 0
        self._stale = 0  # ring entries of revived ghosts (0: every entry is live)

    def __len__(self) -> int:
        """Blocks remembered: cached plus ghost."""
        return len(self._slot)

    # --- the resolver --------------------------------------------------------------------
    def resolve(self, raw: RawEvents, unknown_category: int) -> Events:
        """Resolve ``raw`` (in order) against the table and update it. EVICT events of
        blocks never seen accessed get category ``unknown_category``."""
        n = len(raw)
        if n == 0:
            e = np.empty(0, np.int64)
            return Events(raw.ts, raw.block, raw.category, raw.offset, raw.kind,
                          e.astype(np.float64), e.astype(np.int32))  # fmt: skip
        uniq, inv = np.unique(raw.block, return_inverse=True)
        inv = inv.reshape(-1)
        slots = self._slots(uniq.tolist())
        known = slots >= 0
        s = np.where(known, slots, 0)
        t_cached = known & (self._gseq[s] < 0)
        t_ts = np.where(known, self._ts[s], np.nan)
        t_cat = np.where(known, self._cat[s], -1).astype(np.int32)

        # Events grouped by block, in order within each group.
        order = np.argsort(inv, kind="stable")
        g = inv[order]
        k = raw.kind[order]
        pos = np.arange(n)
        first = np.ones(n, np.bool_)
        first[1:] = g[1:] != g[:-1]
        start = np.maximum.accumulate(np.where(first, pos, 0))
        # Cached just before an event: the previous event of its block says (anything but
        # EVICT leaves it cached), or the table for the block's first event.
        cached = np.empty(n, np.bool_)
        cached[1:] = k[:-1] != EVICT
        cached[first] = t_cached[g[first]]
        insert = (k == FREE) & ~cached
        access = (k == HIT) | insert
        # The block's last access strictly before each event (else the table's).
        last = np.maximum.accumulate(np.where(access, pos, -1))
        before = np.empty(n, np.int64)
        before[0] = -1
        before[1:] = last[:-1]
        inside = before >= start
        at = np.maximum(before, 0)
        ts_s, cat_s = raw.ts[order], raw.category[order]
        prev_ts_s = np.where(inside, ts_s[at], t_ts[g])
        prev_cat_s = np.where(inside, cat_s[at], t_cat[g]).astype(np.int32)
        keep_s = (k != FREE) | insert

        self._update(uniq, slots, g, first, k, last, start, ts_s, cat_s, order, t_cached)

        keep = np.empty(n, np.bool_)
        keep[order] = keep_s
        prev_ts = np.empty(n, np.float64)
        prev_ts[order] = prev_ts_s
        prev_cat = np.empty(n, np.int32)
        prev_cat[order] = prev_cat_s
        category = raw.category.copy()
        evict = raw.kind == EVICT
        category[evict] = np.where(prev_cat[evict] >= 0, prev_cat[evict], unknown_category)
        return Events(raw.ts[keep], raw.block[keep], category[keep], raw.offset[keep],
                      raw.kind[keep], prev_ts[keep], prev_cat[keep])  # fmt: skip

    def _update(
        self,
        uniq: NDArray[np.int64],
        slots: NDArray[np.int64],
        g: NDArray[np.intp],
        first: NDArray[np.bool_],
        k: NDArray[np.uint8],
        last: NDArray[np.int64],
        start: NDArray[np.int64],
        ts_s: NDArray[np.float64],
        cat_s: NDArray[np.int32],
        order: NDArray[np.intp],
        t_cached: NDArray[np.bool_],
    ) -> None:
        """Write each block's state after the batch back to the table. Arrays ``*_u``
        have one entry per unique block (``g`` is sorted, so group ends come in order)."""
        end = np.empty(len(k), np.bool_)
        end[:-1] = first[1:]
        end[-1] = True
        last_u = last[end]
        accessed_u = last_u >= start[end]
        evicted_u = k[end] == EVICT
        came_back_u = np.bincount(g, weights=k != EVICT, minlength=len(uniq)) > 0
        ghost_u = (slots >= 0) & ~t_cached
        new_u = (slots < 0) & accessed_u  # first seen, with an access worth remembering
        if new_u.any():
            slots[new_u] = self._adopt(uniq[new_u])
        has_u = slots >= 0
        acc = accessed_u & has_u
        self._ts[slots[acc]] = ts_s[last_u[acc]]
        self._cat[slots[acc]] = cat_s[last_u[acc]]
        # A ghost cached again is revived; one that came back and was evicted again is
        # revived and pushed anew (its old ring entry goes stale).
        revive_u = ghost_u & (~evicted_u | came_back_u)
        if revive_u.any():
            self._revive(slots[revive_u])
        push_u = evicted_u & has_u & (~ghost_u | came_back_u)
        if push_u.any():
            when = order[end][push_u]  # original position of each block's last EVICT
            self._push_ghosts(slots[push_u][np.argsort(when, kind="stable")])
        if self.ghosts > self.ghost_size:
            self._forget(self.ghosts - self.ghost_size)
        if self.max_blocks is not None and len(self._slot) > self.max_blocks:
            self.resets += 1
            log.warning(
                "kvwise history: %d blocks remembered (> %d): events were lost; starting over",
                len(self._slot),
                self.max_blocks,
            )
            self._clear()

    # --- slots ---------------------------------------------------------------------------
    def _slots(self, blocks: Sequence[int]) -> NDArray[np.int64]:
        return np.fromiter(map(self._slot.get, blocks, repeat(-1)), np.int64, len(blocks))

    def _adopt(self, blocks: NDArray[np.int64]) -> NDArray[np.int64]:
        """Slots for blocks not in the table (unknown time and category)."""
        k = len(blocks)
        if self._n_free < k:
            self._grow(max(k, len(self._ts)))
        slots = self._free[self._n_free - k : self._n_free][::-1].copy()
        self._n_free -= k
        self._ts[slots] = np.nan
        self._cat[slots] = -1
        self._block[slots] = blocks
        self._slot.update(zip(blocks.tolist(), slots.tolist(), strict=True))
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
        if 2 * (n + room) > len(self._ring_slot):
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

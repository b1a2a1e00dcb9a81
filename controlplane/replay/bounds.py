"""Offline reference bounds: ``belady`` (evict the farthest next use) and ``inf``.

Owns the two policies that need the whole trace (future knowledge) or no capacity. They
implement the same Protocol as the agent's policies but live here because they can never
run online. ``belady`` reads the trace's next-use table and is driven by the replay loop in
trace order (one ``free`` per request, which it checks) or, out of order, through
``free_request`` (``controlplane.replay.catalog.TraceIndexed``).

The next-use table (``NextUses``, 8 bytes per block access) is built once per trace and
shared, read-only, by every ``belady`` policy replaying that trace: a simulated fleet
runs one policy per instance, and a table per instance grew memory with the fleet. The
table lives as long as its trace does.
"""

from __future__ import annotations

import heapq
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from controlplane.traces.arrays import I64
from controlplane.traces.model import Trace

NEVER = np.iinfo(np.int64).max


def next_use(trace: Trace) -> NDArray[np.int64]:
    """For every access position, the index of the next *later* request that accesses
    the same block (``NEVER`` if none): a block repeated inside one request is next used
    by a later request, not by its own repeat."""
    req_of_pos = np.repeat(np.arange(trace.n_requests, dtype=np.int64), trace.lengths)
    order = np.argsort(trace.blocks, kind="stable")  # by block, then by request
    block, req = trace.blocks[order], req_of_pos[order]
    # Runs of one (block, request); each run's next use is the next run's request, if
    # that run is of the same block.
    starts = np.flatnonzero(np.r_[True, (block[1:] != block[:-1]) | (req[1:] != req[:-1])])
    run_next = np.full(len(starts), NEVER, dtype=np.int64)
    same_block = block[starts[1:]] == block[starts[:-1]]
    run_next[:-1][same_block] = req[starts[1:]][same_block]
    nxt = np.empty(trace.n_accesses, dtype=np.int64)
    nxt[order] = np.repeat(run_next, np.diff(np.r_[starts, len(order)]))
    return nxt


@dataclass(frozen=True, eq=False)
class NextUses:
    """A trace's next-use table (``next_use``) and request offsets; never written after
    it is built, so policies of any number of instances may share it."""

    of_access: I64
    offsets: tuple[int, ...]
    """Request ``r``'s accesses are ``of_access[offsets[r]:offsets[r + 1]]``."""

    @property
    def n_requests(self) -> int:
        return len(self.offsets) - 1


_BUILT: weakref.WeakKeyDictionary[Trace, NextUses] = weakref.WeakKeyDictionary()


def next_uses(trace: Trace) -> NextUses:
    """``trace``'s next-use table: built on the first call, the same object after."""
    table = _BUILT.get(trace)
    if table is None:
        of_access = next_use(trace)
        of_access.flags.writeable = False
        table = NextUses(of_access, tuple(trace.offsets.tolist()))
        _BUILT[trace] = table
    return table


class BeladyPolicy:
    """Evicts the evictable block whose next use is farthest in the future.

    A max-heap of (next use, tie) with lazy deletion: an entry is live only while its block
    is evictable and its key is the block's current one. Ties (e.g. never used again) go
    tail first, then in release order.
    """

    def __init__(self, capacity: int, trace: Trace) -> None:
        self.next_uses = next_uses(trace)
        """Shared with every other policy of the trace (``next_uses``)."""
        self._offsets = self.next_uses.offsets
        self._n_requests = self.next_uses.n_requests
        self._request = 0
        self._heap: list[tuple[int, int, int]] = []
        self._key: dict[int, int] = {}  # evictable block -> heap sequence number
        self._in_use: set[int] = set()
        self._seq = 0

    def touch(self, blocks: Sequence[int], now: float) -> None:
        for b in blocks:
            self._key.pop(b, None)
        self._in_use.update(blocks)

    def free(
        self, blocks: Sequence[int], offsets: Sequence[int], now: float, category: int
    ) -> None:
        r = self._request
        if r >= self._n_requests:
            raise RuntimeError("belady is driven past the end of its trace")
        lo, hi = self._offsets[r], self._offsets[r + 1]
        if hi - lo != len(blocks):
            raise RuntimeError("belady must be driven by the replay loop, one free per request")
        self._request = r + 1
        self.free_request(r, blocks, range(hi - lo - 1, -1, -1), now)

    def arrive(self, request: int) -> None:
        """Nothing to do: next uses are known from the start."""

    def free_request(
        self, request: int, blocks: Sequence[int], offsets: Sequence[int], now: float
    ) -> None:
        """Release ``blocks`` at ``offsets`` of ``request``'s prompt, keyed by next use."""
        lo, hi = self._offsets[request], self._offsets[request + 1]
        self._in_use.difference_update(blocks)
        nxt = self.next_uses.of_access[lo:hi].tolist()
        heap, key = self._heap, self._key
        for b, o in zip(blocks, offsets, strict=True):
            self._seq += 1
            key[b] = self._seq
            heapq.heappush(heap, (-nxt[o], self._seq, b))
        if len(heap) > 4 * (len(key) + 64):
            self._heap = [e for e in heap if key.get(e[2]) == e[1]]
            heapq.heapify(self._heap)

    def evict(self, n: int) -> list[int]:
        heap, key = self._heap, self._key
        victims: list[int] = []
        while len(victims) < n and heap:
            _, seq, b = heapq.heappop(heap)
            if key.get(b) == seq:
                del key[b]
                victims.append(b)
        return victims

    def __len__(self) -> int:
        return len(self._key) + len(self._in_use)

    def __contains__(self, block: object) -> bool:
        return block in self._key or block in self._in_use


class InfinitePolicy:
    """Never evicts: the ideal hit ratio, whatever the capacity."""

    def __init__(self, capacity: int = 0, trace: Trace | None = None) -> None:
        self._cached: set[int] = set()

    def touch(self, blocks: Sequence[int], now: float) -> None:
        pass

    def free(
        self, blocks: Sequence[int], offsets: Sequence[int], now: float, category: int
    ) -> None:
        self._cached.update(blocks)

    def evict(self, n: int) -> list[int]:
        return []

    def __len__(self) -> int:
        # The infinite cache reports no size, so the replay never asks it to evict.
        return 0

    def __contains__(self, block: object) -> bool:
        return block in self._cached

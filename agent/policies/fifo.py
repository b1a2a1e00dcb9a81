"""``fifo``: first in, first out; a hit never moves a block.

Owns the queue of cached blocks in insertion order (head = next victim), their set, the
blocks in use and the blocks the eviction scan parked. A request's misses are inserted in
release order (tail first), so its tail is evicted before its head.

A block in use cannot be evicted. When the scan meets one at the head it parks it (takes
it out of the order) instead of stepping over it on every later scan, so each block is
passed at most once per in-use period; freed, it returns to where it was. Every parked
block is older than every block still in the queue, and the scan parks them in queue
order, so each keeps the number of its first parking and, freed, waits in a heap by that
number, scanned before the queue: the victims are those of a plain FIFO that steps over
the blocks in use. It never reads timestamps or categories.

A touched block that was not cached (the contract forbids it; an engine bug or a race can
do it) is held from then on, in use and in no order yet; freed, it joins the tail as a
miss does.

``discard`` (``Discards``) forgets blocks wherever they are: in the queue, parked or
returned, in use or not; freed again, one joins the tail as a miss does.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from heapq import heapify, heappop, heappush

from agent.policies.handover import Handover, drain, queue_up
from agent.policies.parking import InUse, purge
from agent.policies.registry import register


@register("fifo")
class FIFOPolicy:
    """Evicts the block inserted longest ago, whatever its hits."""

    __slots__ = (
        "_cached",
        "_in_use",
        "_order",
        "_parked_at",
        "_parkings",
        "_returned",
        "_unqueued",
    )

    def __init__(self, capacity: int = 0) -> None:
        # Blocks leave the order only at its head, so a deque (no hashing) holds it and a
        # set answers membership.
        self._order: deque[int] = deque()
        self._cached: set[int] = set()
        self._in_use = InUse()
        # Parked blocks (freed or not) -> their place among the parked, in queue order.
        self._parked_at: dict[int, int] = {}
        self._parkings = 0  # blocks parked from the queue so far: the next place
        self._returned: list[tuple[int, int]] = []  # heap of freed parked blocks (place, id)
        # Blocks touched while not cached: held and in use, in no order until freed.
        self._unqueued: set[int] = set()

    def touch(self, blocks: Sequence[int], now: float) -> None:
        cached = self._cached
        if not cached.issuperset(blocks):
            self._unqueued.update(b for b in blocks if b not in cached)
        self._in_use.blocks.update(blocks)

    def free(
        self, blocks: Sequence[int], offsets: Sequence[int], now: float, category: int
    ) -> None:
        self._in_use.release(blocks, self._return)
        if self._unqueued:  # not in ``_cached``: the loop below queues them as misses
            self._unqueued.difference_update(blocks)
        cached, order = self._cached, self._order
        for b in blocks:  # misses join the tail in release order; hits stay where they are
            if b not in cached:
                cached.add(b)
                order.append(b)

    def _return(self, block: int) -> None:
        """A parked block is freed: it goes back where it was, ahead of the queue."""
        heappush(self._returned, (self._parked_at[block], block))

    def discard(self, blocks: Sequence[int]) -> None:
        """``Discards``: ``blocks`` are held no more, nothing of them kept (O(1) per block,
        plus one pass over the queue, or over the returned parked blocks, if any of them
        sat there: ``purge``)."""
        gone = {b for b in blocks if b in self._cached or b in self._unqueued}
        if not gone:
            return
        in_use, parked, parked_at = self._in_use.blocks, self._in_use.parked, self._parked_at
        queued = returned = False
        for b in gone:
            in_use.discard(b)
            self._unqueued.discard(b)
            if b in self._cached:
                self._cached.discard(b)
                if b in parked_at:  # parked: in the heap unless in use again
                    del parked_at[b]
                    returned = returned or b not in parked
                    parked.discard(b)
                else:
                    queued = True
        if queued:
            purge(self._order, gone)
        if returned:
            self._returned[:] = [entry for entry in self._returned if entry[1] not in gone]
            heapify(self._returned)

    def evict(self, n: int) -> list[int]:
        order = self._order
        if not self._in_use.blocks and not self._returned:
            k = min(max(n, 0), len(order))
            victims = [order.popleft() for _ in range(k)]
        else:
            victims = self._scan(n)
        self._cached.difference_update(victims)
        return victims

    def _scan(self, n: int) -> list[int]:
        """Up to ``n`` victims, the freed parked blocks first, parking the ones in use."""
        order, returned, parked_at = self._order, self._returned, self._parked_at
        in_use, parked = self._in_use.blocks, self._in_use.parked
        victims: list[int] = []
        while len(victims) < n and returned:
            b = heappop(returned)[1]
            if b in in_use:
                parked.add(b)  # parked again, at the place it had
            else:
                del parked_at[b]
                victims.append(b)
        while len(victims) < n and order:
            b = order.popleft()
            if b in in_use:
                parked.add(b)
                parked_at[b] = self._parkings
                self._parkings += 1
            else:
                victims.append(b)
        return victims

    def hand_over(self) -> Handover:
        handover = drain(self, self._in_use.blocks)
        parking = (self._returned, self._parked_at, self._in_use.parked)
        for part in (self._cached, self._unqueued, self._order, *parking):
            part.clear()
        return handover

    def adopt(self, handover: Handover, now: float) -> None:
        """The evictable blocks in victim order, then the ones in use (``queue_up``)."""
        queue_up(handover, self._order, self._in_use.blocks)
        self._cached.update(self._order)

    def __len__(self) -> int:
        return len(self._cached) + len(self._unqueued)

    def __contains__(self, block: object) -> bool:
        return block in self._cached or block in self._unqueued

"""``fifo``: first in, first out; a hit never moves a block.

Owns the queue of cached blocks in insertion order (head = next victim), their set, the
blocks in use and the blocks the eviction scan parked. A request's misses are inserted in
release order (tail first), so its tail is evicted before its head.

A block in use cannot be evicted. When the scan meets one at the head it parks it (takes
it out of the order) instead of stepping over it on every later scan, so each block is
passed at most once per in-use period; freed, it returns to the head, where it was. It
never reads timestamps or categories.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from agent.policies.handover import Handover, drain
from agent.policies.parking import InUse
from agent.policies.registry import register


@register("fifo")
class FIFOPolicy:
    """Evicts the block inserted longest ago, whatever its hits."""

    __slots__ = ("_cached", "_in_use", "_order")

    def __init__(self, capacity: int = 0) -> None:
        # Blocks leave the order only at its head, so a deque (no hashing) holds it and a
        # set answers membership.
        self._order: deque[int] = deque()
        self._cached: set[int] = set()
        self._in_use = InUse()

    def touch(self, blocks: Sequence[int], now: float) -> None:
        self._in_use.blocks.update(blocks)

    def free(
        self, blocks: Sequence[int], offsets: Sequence[int], now: float, category: int
    ) -> None:
        # A parked block returns to the head, where it was.
        self._in_use.release(blocks, self._order.appendleft)
        cached, order = self._cached, self._order
        for b in blocks:  # misses join the tail in release order; hits stay where they are
            if b not in cached:
                cached.add(b)
                order.append(b)

    def evict(self, n: int) -> list[int]:
        order, in_use = self._order, self._in_use.blocks
        victims: list[int] = []
        if not in_use:
            k = min(max(n, 0), len(order))
            victims = [order.popleft() for _ in range(k)]
        else:
            while len(victims) < n and order:
                b = order.popleft()
                if b in in_use:
                    self._in_use.parked.add(b)
                else:
                    victims.append(b)
        self._cached.difference_update(victims)
        return victims

    def hand_over(self) -> Handover:
        handover = drain(self, self._in_use.blocks)
        self._cached.clear()
        self._order.clear()
        self._in_use.parked.clear()
        return handover

    def adopt(self, handover: Handover, now: float) -> None:
        """The evictable blocks in victim order, then the ones in use (a scan parks
        them until they are freed)."""
        self._order.extend(handover.evictable)
        self._order.extend(handover.in_use)
        self._cached.update(self._order)
        self._in_use.blocks.update(handover.in_use)

    def __len__(self) -> int:
        return len(self._cached)

    def __contains__(self, block: object) -> bool:
        return block in self._cached

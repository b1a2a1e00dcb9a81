"""``fifo``: first in, first out; a hit never moves a block.

Owns one ordered map of cached blocks in insertion order (head = next victim), the set of
blocks in use and the blocks the eviction scan parked. A request's misses are inserted in
release order (tail first), so its tail is evicted before its head.

A block in use cannot be evicted. When the scan meets one at the head it parks it (takes
it out of the order) instead of stepping over it on every later scan, so each block is
passed at most once per in-use period; freed, it returns to the head, where it was. It
never reads timestamps or categories.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence
from itertools import islice, repeat

from agent.policies.registry import register


@register("fifo")
class FIFOPolicy:
    """Evicts the block inserted longest ago, whatever its hits."""

    __slots__ = ("_in_use", "_order", "_parked")

    def __init__(self, capacity: int = 0) -> None:
        self._order: OrderedDict[int, None] = OrderedDict()
        self._in_use: set[int] = set()
        self._parked: set[int] = set()

    def touch(self, blocks: Sequence[int], now: float) -> None:
        self._in_use.update(blocks)

    def free(
        self, blocks: Sequence[int], offsets: Sequence[int], now: float, category: int
    ) -> None:
        self._in_use.difference_update(blocks)
        if self._parked:
            self._unpark(blocks)
        # Existing keys keep their place: only misses join the tail, in release order.
        self._order.update(zip(blocks, repeat(None)))

    def _unpark(self, blocks: Sequence[int]) -> None:
        parked, order = self._parked, self._order
        for b in blocks:
            if b in parked:
                parked.discard(b)
                order[b] = None
                order.move_to_end(b, last=False)

    def evict(self, n: int) -> list[int]:
        order = self._order
        if not self._in_use:
            victims = list(islice(order, max(n, 0)))
            deque(map(order.__delitem__, victims), maxlen=0)
            return victims
        in_use, parked = self._in_use, self._parked
        victims = []
        while len(victims) < n and order:
            b = order.popitem(last=False)[0]
            if b in in_use:
                parked.add(b)
            else:
                victims.append(b)
        return victims

    def __len__(self) -> int:
        return len(self._order) + len(self._parked)

    def __contains__(self, block: object) -> bool:
        return block in self._order or block in self._parked

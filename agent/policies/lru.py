"""``lru``: least recently used, in vLLM's exact order.

Owns one ordered map of evictable blocks (head = next victim) and the set of blocks in
use. A touched block leaves the order; a freed block joins the tail in release order, so
a request's tail (freed first) is evicted before its head. This is vLLM v1's
``FreeKVCacheBlockQueue``. It never reads timestamps or categories.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence
from itertools import islice, repeat

from agent.policies.handover import Handover, drain
from agent.policies.registry import register


@register("lru")
class LRUPolicy:
    """Least recently used; the tail of a request goes first among equals."""

    __slots__ = ("_free", "_in_use")

    def __init__(self, capacity: int = 0) -> None:
        self._free: OrderedDict[int, None] = OrderedDict()
        self._in_use: set[int] = set()

    def touch(self, blocks: Sequence[int], now: float) -> None:
        # Bulk C-level operations: this is the hot path of every replay.
        deque(map(self._free.pop, blocks, repeat(None)), maxlen=0)
        self._in_use.update(blocks)

    def free(
        self, blocks: Sequence[int], offsets: Sequence[int], now: float, category: int
    ) -> None:
        self._in_use.difference_update(blocks)
        self._free.update(zip(blocks, repeat(None)))

    def discard(self, blocks: Sequence[int]) -> None:
        """``Discards``: ``blocks`` are held no more, evictable or in use."""
        deque(map(self._free.pop, blocks, repeat(None)), maxlen=0)
        self._in_use.difference_update(blocks)

    def evict(self, n: int) -> list[int]:
        victims = list(islice(self._free, max(n, 0)))
        deque(map(self._free.__delitem__, victims), maxlen=0)
        return victims

    def hand_over(self) -> Handover:
        return drain(self, self._in_use)

    def adopt(self, handover: Handover, now: float) -> None:
        self._free.update(zip(handover.evictable, repeat(None)))
        self._in_use.update(handover.in_use)

    def __len__(self) -> int:
        return len(self._free) + len(self._in_use)

    def __contains__(self, block: object) -> bool:
        return block in self._free or block in self._in_use

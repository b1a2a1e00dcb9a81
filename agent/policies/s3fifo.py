"""``s3fifo``: S3-FIFO (Yang et al., SOSP 2023), with libCacheSim's exact eviction order.

Owns three FIFO queues of block ids (``small``, ``main`` and the ``ghost`` of blocks
recently evicted from ``small``), each cached block's access count, the blocks in use and
the blocks the eviction scan parked. It never reads timestamps or categories.

The decisions are libCacheSim's ``S3FIFO`` (small queue 0.1 of the capacity, ghost 0.9,
move-to-main threshold 2, counts capped at 3 in ``main``), so that object-level traces give
identical hit counts (``tests/integration/test_crosscheck_libcachesim.py``):

- a hit adds 1 to the block's count; it never moves the block;
- a miss found in the ghost goes to ``main``. Any other miss goes to ``small``, except
  before the first eviction, while ``small`` is full: then it goes to ``main``;
- eviction takes from ``main`` when ``main`` holds more than its share (capacity minus the
  small share) or ``small`` is empty, else from ``small``;
- from ``small``: a head seen at least twice moves to ``main`` with its count reset,
  otherwise it is evicted and remembered in the ghost;
- from ``main``: a head seen at least once goes back to the tail with
  ``min(count, 3) - 1``, otherwise it is evicted.

libCacheSim looks a missed block up in the ghost (removing it there) before it evicts, and
each eviction may push the oldest entry out of a full ghost. Here the miss is only known
when it is freed, after the eviction, so the ghost is trimmed to its size lazily, just
after that lookup. Both keep the same entries: the newest ``ghost`` ones, less the block.

A block in use cannot be evicted: the scan parks it (out of its queue, count kept) instead
of passing it on every later scan; freed, it rejoins the tail of its queue.

One deliberate difference at tiny capacities: libCacheSim refuses a capacity under 10
(empty small queue) and admits nothing under 20 (its object-size guard wants a small queue
of two slots or more). Blocks are unit-sized here, so the small queue gets at least one.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from agent.policies.registry import register

SMALL_RATIO = 0.1
GHOST_RATIO = 0.9
MOVE_TO_MAIN = 2
MAX_COUNT = 3


@register("s3fifo")
class S3FIFOPolicy:
    """Small probationary FIFO, main FIFO with a 2-bit clock, ghost of the small's victims."""

    __slots__ = (
        "_count",
        "_ghost",
        "_ghost_size",
        "_has_evicted",
        "_in_use",
        "_main",
        "_main_size",
        "_parked",
        "_small",
        "_small_size",
    )

    def __init__(self, capacity: int = 0) -> None:
        # Same float arithmetic as libCacheSim, so the same queue sizes.
        self._small_size = max(1, int(capacity * SMALL_RATIO))
        self._main_size = capacity - self._small_size
        self._ghost_size = int(capacity * GHOST_RATIO)
        self._small: OrderedDict[int, None] = OrderedDict()
        self._main: OrderedDict[int, None] = OrderedDict()
        self._ghost: OrderedDict[int, None] = OrderedDict()
        self._count: dict[int, int] = {}  # every cached block -> accesses since admission
        self._in_use: set[int] = set()
        self._parked: dict[int, bool] = {}  # parked block -> whether it belongs to main
        self._has_evicted = False

    def touch(self, blocks: Sequence[int], now: float) -> None:
        count, in_use = self._count, self._in_use
        for b in blocks:
            if b not in in_use:
                count[b] += 1
                in_use.add(b)

    def free(
        self, blocks: Sequence[int], offsets: Sequence[int], now: float, category: int
    ) -> None:
        count, in_use, parked = self._count, self._in_use, self._parked
        for b in blocks:
            if b in in_use:
                in_use.discard(b)
                if b in parked:
                    (self._main if parked.pop(b) else self._small)[b] = None
            elif b not in count:
                self._insert(b)

    def _insert(self, b: int) -> None:
        ghost = self._ghost
        self._count[b] = 0
        if b in ghost:
            del ghost[b]
            self._main[b] = None
        elif not self._has_evicted and len(self._small) >= self._small_size:
            self._main[b] = None
        else:
            self._small[b] = None
        self._trim_ghost()

    def _trim_ghost(self) -> None:
        ghost, size = self._ghost, self._ghost_size
        while len(ghost) > size:
            ghost.popitem(last=False)

    def evict(self, n: int) -> list[int]:
        self._has_evicted = True
        # Bounds the ghost when evictions come without inserts; a no-op otherwise, since
        # every insert already trimmed it.
        self._trim_ghost()
        small, main = self._small, self._main
        victims: list[int] = []
        while len(victims) < n and (small or main):
            if main and (len(main) > self._main_size or not small):
                self._evict_main(victims)
            else:
                self._evict_small(victims)
        return victims

    def _evict_small(self, victims: list[int]) -> None:
        """Walk the small queue until one block is evicted or the queue is empty."""
        small, count, in_use = self._small, self._count, self._in_use
        while small:
            b = small.popitem(last=False)[0]
            if b in in_use:
                self._parked[b] = False
            elif count[b] >= MOVE_TO_MAIN:
                count[b] = 0
                self._main[b] = None
            else:
                del count[b]
                self._ghost[b] = None
                victims.append(b)
                return

    def _evict_main(self, victims: list[int]) -> None:
        """Walk the main queue until one block is evicted or the queue is empty."""
        main, count, in_use = self._main, self._count, self._in_use
        while main:
            b = main.popitem(last=False)[0]
            if b in in_use:
                self._parked[b] = True
                continue
            c = count[b]
            if c >= 1:
                count[b] = min(c, MAX_COUNT) - 1
                main[b] = None
            else:
                del count[b]
                victims.append(b)
                return

    def __len__(self) -> int:
        return len(self._count)

    def __contains__(self, block: object) -> bool:
        return block in self._count

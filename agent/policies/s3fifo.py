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
A request's misses are looked up together, then the ghost is trimmed once.

A block in use cannot be evicted: the scan parks it (out of its queue, count kept) instead
of passing it on every later scan; freed, it rejoins the tail of its queue.

``discard`` (``Discards``) takes blocks out of their queue (or the parked ones) with their
counts, and leaves no ghost: the policy did not choose them, so freed again, a block is a
miss that goes to ``small`` (or ``main``, as any miss before the first eviction).

One deliberate difference at tiny capacities: libCacheSim refuses a capacity under 10
(empty small queue) and admits nothing under 20 (its object-size guard wants a small queue
of two slots or more). Blocks are unit-sized here, so the small queue gets at least one.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence
from itertools import islice, repeat

from agent.policies.handover import Handover, drain, queue_up
from agent.policies.parking import purge
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
        self.resize(capacity)
        # Blocks leave small and main only at the head: deques (no hashing); the ghost
        # also loses blocks found in it, so it is an ordered map.
        self._small: deque[int] = deque()
        self._main: deque[int] = deque()
        self._ghost: OrderedDict[int, None] = OrderedDict()
        self._count: dict[int, int] = {}  # every cached block -> accesses since admission
        self._in_use: set[int] = set()
        self._parked: dict[int, bool] = {}  # parked block -> whether it belongs to main
        self._has_evicted = False

    def resize(self, capacity: int) -> None:
        """The small, main and ghost queues' shares of ``capacity`` (``Resizable``)."""
        # Same float arithmetic as libCacheSim, so the same queue sizes.
        self._small_size = max(1, int(capacity * SMALL_RATIO))
        self._main_size = capacity - self._small_size
        self._ghost_size = int(capacity * GHOST_RATIO)

    def touch(self, blocks: Sequence[int], now: float) -> None:
        count, in_use = self._count, self._in_use
        for b in blocks:
            if b not in in_use:  # already in use (or named twice): counted once
                in_use.add(b)
                try:
                    count[b] += 1
                except KeyError:  # not cached (a broken contract): parked for small
                    count[b] = 0
                    self._parked[b] = False

    def free(
        self, blocks: Sequence[int], offsets: Sequence[int], now: float, category: int
    ) -> None:
        count, in_use, parked, ghost = self._count, self._in_use, self._parked, self._ghost
        small, main = self._small, self._main
        inserted = False
        for b in blocks:
            if b in count:
                if b in in_use:
                    in_use.discard(b)
                    if b in parked:
                        (main if parked.pop(b) else small).append(b)
                continue
            # A miss. The request's misses all see the ghost as it stood after the last
            # evictions (untrimmed); it is trimmed once they are in.
            inserted = True
            count[b] = 0
            if b in ghost:
                del ghost[b]
                main.append(b)
            elif not self._has_evicted and len(small) >= self._small_size:
                main.append(b)  # before the first eviction, a full small queue overflows
            else:
                small.append(b)
        if inserted:
            self._trim_ghost()

    def _trim_ghost(self) -> None:
        ghost, size = self._ghost, self._ghost_size
        excess = len(ghost) - size
        if excess > 0:
            deque(map(ghost.__delitem__, list(islice(ghost, excess))), maxlen=0)

    def discard(self, blocks: Sequence[int]) -> None:
        """``Discards``: ``blocks`` are held no more, counts and any ghost entry forgotten
        (O(1) per block, plus one pass over each queue if any of them sat in one:
        ``purge``)."""
        count, in_use, parked, ghost = self._count, self._in_use, self._parked, self._ghost
        gone = {b for b in blocks if b in count}
        queued = False
        for b in gone:
            del count[b]
            in_use.discard(b)
            ghost.pop(b, None)  # a block touched while not cached may still have one
            if parked.pop(b, None) is None:
                queued = True
        if queued:
            purge(self._small, gone)
            purge(self._main, gone)

    def evict(self, n: int) -> list[int]:
        self._has_evicted = True
        # Bounds the ghost when evictions come without inserts; a no-op otherwise, since
        # every insert already trimmed it.
        self._trim_ghost()
        small, main, ghost = self._small, self._main, self._ghost
        count, in_use, parked = self._count, self._in_use, self._parked
        main_size = self._main_size
        victims: list[int] = []
        while len(victims) < n and (small or main):
            if main and (len(main) > main_size or not small):
                # Main: a block seen since its last pass goes round again, one count less.
                while main:
                    b = main.popleft()
                    if b in in_use:
                        parked[b] = True
                        continue
                    c = count[b]
                    if c:
                        count[b] = (c if c < MAX_COUNT else MAX_COUNT) - 1
                        main.append(b)
                    else:
                        del count[b]
                        victims.append(b)
                        break
            else:
                # Small: a block seen twice moves to main, else it goes, leaving a ghost.
                while small:
                    b = small.popleft()
                    if b in in_use:
                        parked[b] = False
                    elif count[b] >= MOVE_TO_MAIN:
                        count[b] = 0
                        main.append(b)
                    else:
                        del count[b]
                        ghost[b] = None
                        victims.append(b)
                        break
        return victims

    def hand_over(self) -> Handover:
        handover = drain(self, self._in_use)
        for part in (self._small, self._main, self._ghost, self._count, self._parked):
            part.clear()
        return handover

    def adopt(self, handover: Handover, now: float) -> None:
        """Every block in ``main`` with a count of 0 (seen nothing since the switch), the
        evictable ones in victim order, then the ones in use (parked by the scan until
        freed); new blocks go through ``small`` as usual."""
        queue_up(handover, self._main, self._in_use)
        self._count.update(zip(self._main, repeat(0)))
        self._has_evicted = True

    def __len__(self) -> int:
        return len(self._count)

    def __contains__(self, block: object) -> bool:
        return block in self._count

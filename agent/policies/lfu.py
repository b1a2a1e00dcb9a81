"""``lfu``: least frequently used, ties broken by least recent release.

Owns each cached block's frequency (1 on insertion, +1 per hit, forgotten on eviction), one
ordered bucket of evictable blocks per frequency (least recently released first, so a
request's tail goes before its head among equals) and the blocks in use. It never reads
timestamps or categories.

Per block every operation is O(1): a hit takes the block out of its bucket (it is in use,
so it cannot be evicted) and raises its frequency; freeing it appends it to the bucket of
its new frequency; eviction takes the head of the lowest non-empty bucket. The lowest
frequency comes from a heap of the frequencies that have a bucket: a bucket is created,
and its frequency pushed, when it gets its first block, and dropped when eviction finds it
empty at the top of the heap, so the heap holds only the few distinct frequencies
(``O(log F)`` per bucket created, none per block). Blocks in use are in no bucket, so
eviction never has to skip them. ``discard`` (``Discards``) forgets a block and its
frequency in O(1): freed again, it is a miss at frequency 1.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict, deque
from collections.abc import Sequence
from itertools import islice, repeat

from agent.policies.handover import Handover, drain
from agent.policies.registry import register


@register("lfu")
class LFUPolicy:
    """Evicts the least frequently used block; on a tie the least recently released."""

    __slots__ = ("_buckets", "_freq", "_heap", "_in_use")

    def __init__(self, capacity: int = 0) -> None:
        self._freq: dict[int, int] = {}  # every cached block -> its frequency
        self._buckets: dict[int, OrderedDict[int, None]] = {}  # frequency -> evictable blocks
        self._heap: list[int] = []  # the keys of _buckets
        self._in_use: set[int] = set()

    def _bucket(self, f: int) -> OrderedDict[int, None]:
        bucket = self._buckets.get(f)
        if bucket is None:
            bucket = self._buckets[f] = OrderedDict()
            heapq.heappush(self._heap, f)
        return bucket

    def touch(self, blocks: Sequence[int], now: float) -> None:
        freq, buckets, in_use = self._freq, self._buckets, self._in_use
        for b in blocks:
            if b in in_use:  # already in use (or named twice): counted once
                continue
            in_use.add(b)
            f = freq.get(b)
            if f is None:  # not cached (a broken contract): cached now, frequency 1
                freq[b] = 1
                continue
            del buckets[f][b]
            freq[b] = f + 1

    def free(
        self, blocks: Sequence[int], offsets: Sequence[int], now: float, category: int
    ) -> None:
        freq, buckets, in_use = self._freq, self._buckets, self._in_use
        ones = buckets.get(1)
        for b in blocks:
            if b in in_use:  # a hit: back into the bucket of its new frequency
                in_use.discard(b)
                f = freq[b]
                bucket = buckets.get(f)
                if bucket is None:
                    bucket = self._bucket(f)
                bucket[b] = None
            elif b not in freq:  # a miss: frequency 1
                freq[b] = 1
                if ones is None:
                    ones = self._bucket(1)
                ones[b] = None

    def discard(self, blocks: Sequence[int]) -> None:
        """``Discards``: ``blocks`` are held no more, their frequencies forgotten."""
        freq, buckets, in_use = self._freq, self._buckets, self._in_use
        for b in blocks:
            f = freq.pop(b, None)
            if f is None:  # not held
                continue
            if b in in_use:  # in no bucket
                in_use.discard(b)
            else:  # an emptied bucket is dropped when eviction finds it, as usual
                del buckets[f][b]

    def evict(self, n: int) -> list[int]:
        heap, buckets, freq = self._heap, self._buckets, self._freq
        victims: list[int] = []
        while len(victims) < n and heap:
            bucket = buckets[heap[0]]
            if not bucket:
                del buckets[heapq.heappop(heap)]
                continue
            taken = list(islice(bucket, n - len(victims)))
            deque(map(bucket.__delitem__, taken), maxlen=0)
            deque(map(freq.__delitem__, taken), maxlen=0)
            victims += taken
        return victims

    def hand_over(self) -> Handover:
        handover = drain(self, self._in_use)
        self._freq.clear()
        self._buckets.clear()
        self._heap.clear()
        return handover

    def adopt(self, handover: Handover, now: float) -> None:
        """Every block at frequency 1 (their counts are not known), the evictable ones in
        victim order at the head of that bucket."""
        ones = self._bucket(1)
        ones.update(zip(handover.evictable, repeat(None)))
        self._freq.update(zip(handover.evictable, repeat(1)))
        self._freq.update(zip(handover.in_use, repeat(1)))
        self._in_use.update(handover.in_use)

    def __len__(self) -> int:
        return len(self._freq)

    def __contains__(self, block: object) -> bool:
        return block in self._freq

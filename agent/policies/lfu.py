"""``lfu``: least frequently used, ties broken by least recent release.

Owns each cached block's frequency (1 on insertion, +1 per hit, forgotten on eviction), one
ordered bucket of evictable blocks per frequency (least recently released first, so a
request's tail goes before its head among equals) and the blocks in use. It never reads
timestamps or categories.

O(1) per operation with the classic frequency list: the frequencies that have blocks form
a doubly linked list in increasing order, so the lowest is always the list's head. A hit
moves a block from frequency ``f`` to ``f + 1``, which is created right after ``f`` when it
is missing. A touched block leaves its bucket (it is in use) but keeps its place in the
list under ``f + 1``, so freeing it needs no search. Eviction takes the least recent block
of the lowest frequency that has an evictable one, skipping frequencies held only by
blocks in use (in replay none are).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from agent.policies.registry import register

_NONE = 0
"""List sentinel: frequencies start at 1."""


@register("lfu")
class LFUPolicy:
    """Evicts the least frequently used block; on a tie the least recently released."""

    __slots__ = ("_buckets", "_freq", "_head", "_in_use", "_members", "_next", "_prev")

    def __init__(self, capacity: int = 0) -> None:
        self._freq: dict[int, int] = {}
        self._buckets: dict[int, OrderedDict[int, None]] = {}
        self._members: dict[int, int] = {}  # frequency -> blocks (evictable or in use)
        self._next: dict[int, int] = {}
        self._prev: dict[int, int] = {}
        self._head = _NONE
        self._in_use: set[int] = set()

    # -- the frequency list -------------------------------------------------------------

    def _join(self, f: int, after: int) -> None:
        """Count one more block under ``f``, creating ``f`` after ``after`` if missing."""
        if f in self._members:
            self._members[f] += 1
            return
        self._members[f] = 1
        self._buckets[f] = OrderedDict()
        nxt = self._next[after] if after != _NONE else self._head
        self._prev[f] = after
        self._next[f] = nxt
        if after != _NONE:
            self._next[after] = f
        else:
            self._head = f
        if nxt != _NONE:
            self._prev[nxt] = f

    def _leave(self, f: int) -> None:
        """Count one block less under ``f``; unlink ``f`` when none is left."""
        left = self._members[f] - 1
        if left:
            self._members[f] = left
            return
        del self._members[f], self._buckets[f]
        prev, nxt = self._prev.pop(f), self._next.pop(f)
        if prev != _NONE:
            self._next[prev] = nxt
        else:
            self._head = nxt
        if nxt != _NONE:
            self._prev[nxt] = prev

    # -- the Protocol -------------------------------------------------------------------

    def touch(self, blocks: Sequence[int], now: float) -> None:
        freq, buckets, in_use = self._freq, self._buckets, self._in_use
        for b in blocks:
            if b in in_use:
                continue
            f = freq[b]
            del buckets[f][b]
            self._join(f + 1, f)
            self._leave(f)
            freq[b] = f + 1
            in_use.add(b)

    def free(
        self, blocks: Sequence[int], offsets: Sequence[int], now: float, category: int
    ) -> None:
        freq, buckets, in_use = self._freq, self._buckets, self._in_use
        for b in blocks:
            if b in in_use:
                in_use.discard(b)
                buckets[freq[b]][b] = None
            elif b not in freq:
                freq[b] = 1
                self._join(1, _NONE)
                buckets[1][b] = None

    def evict(self, n: int) -> list[int]:
        victims: list[int] = []
        f = self._head
        while len(victims) < n and f != _NONE:
            bucket = self._buckets[f]
            if not bucket:  # only blocks in use left at this frequency
                f = self._next[f]
                continue
            b = bucket.popitem(last=False)[0]
            del self._freq[b]
            victims.append(b)
            nxt = self._next[f]
            self._leave(f)
            if f not in self._members:
                f = nxt
        return victims

    def __len__(self) -> int:
        return len(self._freq)

    def __contains__(self, block: object) -> bool:
        return block in self._freq

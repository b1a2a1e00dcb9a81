"""``sieve``: SIEVE (Zhang et al., NSDI 2024), with libCacheSim's exact eviction order.

Owns the queue of cached blocks (newest inserted at one end, never moved on a hit), one
visited bit per block, the hand, and the blocks in use. It never reads timestamps or
categories.

The hand walks from the oldest block towards the newest: a visited block loses its bit and
stays where it is, the first unvisited one is evicted, and the hand stops on the next newer
block. Past the newest it wraps to the oldest. A hit only sets the bit; a miss is inserted
as the newest, unvisited, in release order (a request's tail before its head).

The queue is held as two deques split at the hand: ``ahead`` (from the hand to the
newest, where inserts go) and ``behind`` (from the oldest up to the hand, in queue order).
The hand pops the head of ``ahead``; a visited block moves to the end of ``behind``, which
keeps queue order because everything behind the hand is older than everything ahead of it.
When ``ahead`` runs out the hand wraps: ``behind`` becomes ``ahead``. Every step is O(1)
and each block is passed at most once per turn of the hand.

A block in use cannot be evicted: the hand parks it (out of the queue) instead of passing
it on every turn; freed, it rejoins as the newest. A touched block that was not cached is
parked at once, so it rejoins the same way.

``discard`` (``Discards``) takes blocks out wherever they are, queued or parked, with their
bits; the hand stays where it was, or on the next newer block if it was on one of them, as
after an eviction. Freed again, a block joins as a miss does.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from itertools import repeat

from agent.policies.handover import Handover, drain, queue_up
from agent.policies.parking import InUse, purge
from agent.policies.registry import register


@register("sieve")
class SievePolicy:
    """SIEVE: lazy promotion through a visited bit and a hand that sweeps old to new."""

    __slots__ = ("_ahead", "_behind", "_in_use", "_visited")

    def __init__(self, capacity: int = 0) -> None:
        # Blocks leave either half only at its head: deques, no hashing.
        self._ahead: deque[int] = deque()
        self._behind: deque[int] = deque()
        self._visited: dict[int, bool] = {}  # every cached block -> its visited bit
        self._in_use = InUse()

    def touch(self, blocks: Sequence[int], now: float) -> None:
        visited = self._visited
        if not all(map(visited.__contains__, blocks)):
            # Not cached (a broken contract): cached now and parked, so that its free
            # puts it in the queue, as the newest, instead of holding it forever.
            self._in_use.parked.update(b for b in blocks if b not in visited)
        visited.update(zip(blocks, repeat(True)))
        self._in_use.blocks.update(blocks)

    def free(
        self, blocks: Sequence[int], offsets: Sequence[int], now: float, category: int
    ) -> None:
        # A parked block rejoins as the newest.
        self._in_use.release(blocks, self._ahead.append)
        visited, ahead = self._visited, self._ahead
        for b in blocks:  # misses join as the newest, unvisited, in release order
            if b not in visited:
                visited[b] = False
                ahead.append(b)

    def discard(self, blocks: Sequence[int]) -> None:
        """``Discards``: ``blocks`` are held no more (O(1) per block, plus one pass over
        the queue if any of them sat there: ``purge``)."""
        visited, in_use, parked = self._visited, self._in_use.blocks, self._in_use.parked
        gone = {b for b in blocks if b in visited}
        queued = False
        for b in gone:
            del visited[b]
            in_use.discard(b)
            if b in parked:  # out of the queue
                parked.discard(b)
            else:
                queued = True
        if queued:
            purge(self._ahead, gone)
            purge(self._behind, gone)
            if not self._ahead:  # the hand left the newest block, as in ``evict``
                self._ahead, self._behind = self._behind, self._ahead

    def evict(self, n: int) -> list[int]:
        ahead, behind = self._ahead, self._behind
        visited, in_use, parked = self._visited, self._in_use.blocks, self._in_use.parked
        victims: list[int] = []
        while len(victims) < n:
            if not ahead:
                if not behind:
                    break
                ahead, behind = behind, ahead
            b = ahead.popleft()
            if visited[b]:
                if b in in_use:
                    parked.add(b)
                else:
                    visited[b] = False
                    behind.append(b)
            elif b in in_use:
                parked.add(b)
            else:
                del visited[b]
                victims.append(b)
        if not ahead:
            # The hand left the newest block: the next sweep starts from the oldest.
            ahead, behind = behind, ahead
        self._ahead, self._behind = ahead, behind
        return victims

    def hand_over(self) -> Handover:
        handover = drain(self, self._in_use.blocks)
        for part in (self._visited, self._ahead, self._behind, self._in_use.parked):
            part.clear()
        return handover

    def adopt(self, handover: Handover, now: float) -> None:
        """Unvisited, from the hand on: the evictable blocks in victim order, then the
        ones in use (``queue_up``: the hand parks them until they are freed)."""
        queue_up(handover, self._ahead, self._in_use.blocks)
        self._visited.update(zip(self._ahead, repeat(False)))

    def __len__(self) -> int:
        return len(self._visited)

    def __contains__(self, block: object) -> bool:
        return block in self._visited

"""The eviction-policy Protocol every evictor implements, CPU or device, baseline or fitted.

Owns the contract only: the three verbs vLLM's block pool uses (touch, free, evict) plus
membership and size, and two optional abilities, ``Resizable`` and ``Discards``. It must
never do I/O, read settings or know about traces.

The life of a cached block, in vLLM's words:

- a request arrives and reuses cached blocks of its prefix: ``touch`` (they are now in use
  and must not be evicted);
- the request finishes and releases its blocks, tail first: ``free``. A block the policy
  has never seen is inserted (it was a miss, just computed); a touched one becomes evictable
  again;
- the cache needs room: ``evict(n)`` removes and returns up to ``n`` evictable victims,
  first victim first. It never returns a block that is in use or not cached.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable


@runtime_checkable
class EvictionPolicy(Protocol):
    """One cache's eviction order. Block ids are ints (dense ids in replay, hashes live)."""

    def touch(self, blocks: Sequence[int], now: float) -> None:
        """Cached ``blocks`` are reused by a request arriving at ``now``; they are in use
        until freed. Touching a block that is already in use is a no-op.

        A block that is not cached must not be touched, but an engine bug or a race may
        do it: every policy then neither raises (it runs on the engine thread) nor holds
        the block forever. It is never evicted until freed; freed, it is cached and
        evictable like any other block."""

    def free(
        self, blocks: Sequence[int], offsets: Sequence[int], now: float, category: int
    ) -> None:
        """A request of ``category`` that accessed ``blocks`` at ``now`` releases them, in
        release order (vLLM frees a request's blocks tail first). ``offsets[i]`` is the
        position of ``blocks[i]`` in its prompt (0 = first block)."""

    def evict(self, n: int) -> list[int]:
        """Remove and return up to ``n`` evictable blocks, first victim first."""

    def __len__(self) -> int:
        """Number of cached blocks held: evictable or in use."""

    def __contains__(self, block: object) -> bool:
        """Whether ``block`` is cached (evictable or in use)."""


@runtime_checkable
class Resizable(Protocol):
    """A policy whose own bookkeeping is sized by the capacity (queue shares, ghost
    lengths, an adaptive target), told when the capacity it is evicted down to changes."""

    def resize(self, capacity: int) -> None:
        """From now on, size that bookkeeping for ``capacity`` blocks."""


@runtime_checkable
class Discards(Protocol):
    """A policy that can let blocks go without evicting them: the engine dropped their
    content (a KV connector's ``evict_blocks``), so they must be neither a victim nor
    counted as cached."""

    def discard(self, blocks: Sequence[int]) -> None:
        """``blocks`` leave the policy, evictable or in use, as an eviction would leave
        them (a block freed later is a new insertion); a block not held is ignored.

        Unlike an eviction, nothing of a discarded block is remembered: the content is
        gone, not chosen as a victim, so no policy keeps a ghost entry (ARC's ``b1`` and
        ``b2``, S3-FIFO's ghost), a count or a frequency for it, and its next insertion
        never reads as a return. What it did to the rest stays (ARC's target, the place
        of a queue's hand)."""

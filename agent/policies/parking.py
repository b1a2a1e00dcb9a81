"""The blocks in use, and the ones an eviction scan parked because they were in use.

Owns ``InUse``, shared by the queue policies (``fifo``, ``sieve``) whose scan takes an
in-use block out of the order instead of stepping over it on every later scan, and
``purge``, the step the queue policies' ``discard`` shares (``fifo``, ``sieve``,
``s3fifo``). It must never decide where a returning block goes: the policy passes that in.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Collection, Sequence
from itertools import filterfalse


class InUse:
    """Blocks in use (touched, not yet freed) and, of those, the ones a scan parked."""

    __slots__ = ("blocks", "parked")

    def __init__(self) -> None:
        self.blocks: set[int] = set()
        self.parked: set[int] = set()

    def release(self, blocks: Sequence[int], rejoin: Callable[[int], None]) -> None:
        """``blocks`` are freed: they are no longer in use, and each parked one is handed
        to ``rejoin`` (in release order) to take its place in the order again."""
        in_use = self.blocks
        if not in_use:
            return
        parked = self.parked
        if parked:
            for block in blocks:
                if block in parked and block in in_use:
                    parked.discard(block)
                    rejoin(block)
        in_use.difference_update(blocks)


def purge(queue: deque[int], gone: Collection[int]) -> None:
    """Take the blocks ``gone`` out of ``queue``, the others kept in order: one pass over
    the queue, whatever the number gone.

    A queue of bare ids (no hashing on the hot path) cannot lose a block in the middle in
    O(1); leaving it there to be skipped later would cost a check on every pop of every
    scan, and the block would often come back (a block whose content is dropped is reused
    first) before the scan met the stale entry, which the scan could not tell from the
    new one. ``discard`` is rare (the engine lost content), so it pays here instead."""
    kept = list(filterfalse(gone.__contains__, queue))
    if len(kept) != len(queue):
        queue.clear()
        queue.extend(kept)

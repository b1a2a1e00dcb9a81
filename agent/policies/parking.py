"""The blocks in use, and the ones an eviction scan parked because they were in use.

Owns ``InUse``, shared by the queue policies (``fifo``, ``sieve``) whose scan takes an
in-use block out of the order instead of stepping over it on every later scan. It must
never decide where a returning block goes: the policy passes that in.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


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

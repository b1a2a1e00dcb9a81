"""Reuse classes (``KVWISE_REUSE_CLASSES``): which released blocks are returns.

Owns ``ReturnTracker``, the engine-thread memory that decides a released block's class:
a *return* (category ``w``'s reuse class ``w/re``) when the request found it cached, or
when it is among the ``ghost_size`` most recently evicted blocks (evicted, then inserted
again; ``KVWISE_REUSE_GHOST_BLOCKS``); a *first access* (``w``) otherwise. The agent
(``agent.runtime.agent``) and the replay (``controlplane.replay.accesses.HitClasses``)
both decide with it, so a replay measures what the agent does. It must never do I/O or
know categories.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import islice

REUSE_GHOST_CAPACITIES = 16
"""The default ghost, in cache capacities (``KVWISE_REUSE_GHOST_BLOCKS`` = 0): chosen on
synthetic traces of seed 7 among 0, 1, 4 and 16 (docs/policy.md, "A better wa")."""


class ReturnTracker:
    """Blocks found cached and not yet released, and the ghost of recent evictions
    (oldest first). ``found_limit`` bounds the first set: found blocks an engine never
    releases (a lost request) are forgotten, all at once, past it."""

    __slots__ = ("_found", "_ghost", "found_limit", "ghost_size")

    def __init__(self, ghost_size: int, found_limit: int | None = None) -> None:
        self.ghost_size = max(int(ghost_size), 0)
        self.found_limit = found_limit
        self._found: set[int] = set()
        self._ghost: dict[int, None] = {}

    def touched(self, blocks: Sequence[int]) -> None:
        """A request found ``blocks`` cached: their next release is a return."""
        found = self._found
        if self.found_limit is not None and len(found) > self.found_limit:
            found.clear()
        found.update(blocks)

    def evicted(self, blocks: Sequence[int]) -> None:
        """``blocks`` were evicted: inserted again while in the ghost, they return."""
        ghost = self._ghost
        ghost.update(dict.fromkeys(blocks))
        excess = len(ghost) - self.ghost_size
        if excess > 0:
            for block in list(islice(ghost, excess)):
                del ghost[block]

    def peek(self, blocks: Sequence[int]) -> list[bool]:
        """What ``returns`` would say now, changing nothing."""
        found, ghost = self._found, self._ghost
        return [block in found or block in ghost for block in blocks]

    def returns(self, blocks: Sequence[int]) -> list[bool]:
        """Whether each released block is a return (it leaves the ghost if it was there)."""
        found, ghost = self._found, self._ghost
        flags = [block in found or ghost.pop(block, 0) is None for block in blocks]
        found.difference_update(blocks)
        return flags

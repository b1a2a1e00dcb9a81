"""Which cached branches a newer request has left: the ``tree`` rule, for a free queue and
for a cache model.

The ``tree`` rule of the replay's ``wa-superseded`` (``controlplane.replay.superseded``)
on the engine's own blocks, by block id:

    per block: its latest child, its parent, when it was last accessed (a stamp)
    a request's hits p0..pd-1: link each to the next, stamp them
    its first store leaves pd-1 for a new block; if pd-1 had a child c, and no branch
      parted at pd-1 before, c and its latest-child chain are superseded: the blocks
      the last request through c accessed from c on (the chain stops where their
      stamps drop, i.e. where that request ended, or at a block still marked: it and
      the chain below it were marked together, and keep that place)
    an eviction takes first the oldest superseded blocks still free, cached and not
      accessed since (tail first within a branch), then the evictor's own order

Owns ``SupersededBranches``: those links and marks over an engine's pool, in lists of the
pool's size plus one (the last slot stands for "no parent"), and the superseded blocks in
marking order, keyed by block id: nothing grows past the pool. Block ids are reused, so
a link is believed only where the child names the parent back (``parent``) and a mark
only where the block was not accessed or stored again since (``seen``): a block's links
and marks end with its content, nothing is forgotten on eviction (no work on the
eviction path). A block is walked once per access at most (a walk marks only blocks not
marked since their last access), so the work is O(1) per block hit or stored, amortized;
the replay marks such a branch again, behind the marks made since. What it cannot know:
a fork block evicted and computed again is a new block without children, so a parting
there supersedes nothing (the replay, which never forgets, supersedes the old branch).

And ``CachedBranches``, the same rule over blocks named by their content (the
controller's shadow caches, whose block ids are hashes and never come back): its links
and marks are dicts that hold the cached blocks only, each block's dropped when it is
evicted (``forget``), as an engine loses an evicted block's links when its id is given
to other content.

It must never import vLLM, do I/O or hold a Python object per block of an engine's pool.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Container, Sequence
from itertools import repeat
from typing import Protocol

NO_CHILD = -(1 << 64)
"""A block's child before it has one: below every 64-bit block id or hash."""


class IntOf(Protocol):
    """Per block, an int, read only."""

    def __getitem__(self, block: int, /) -> int: ...


class IntTable(IntOf, Protocol):
    """Per block, an int: a list indexed by block id, or a ``Defaulted`` dict."""

    def __setitem__(self, block: int, value: int, /) -> None: ...

    def __len__(self) -> int: ...


class Defaulted(dict[int, int]):
    """A dict read as a list filled with ``default`` is: a block never set reads it."""

    __slots__ = ("default",)

    def __init__(self, default: int) -> None:
        super().__init__()
        self.default = default

    def __missing__(self, block: int) -> int:
        return self.default


class SupersededBranches:
    """The ``tree`` rule over a pool of ``n`` blocks; ``hashes[i]`` is block ``i``'s hash
    (the free queue's side table, read only)."""

    def __init__(self, n: int, hashes: IntOf) -> None:
        self.root = n
        """The slot that stands for "no parent" (a prompt's first block follows it)."""
        self._hashes = hashes
        self._child: IntTable = [NO_CHILD] * (n + 1)
        self._parent: IntTable = [n] * (n + 1)
        self._seen: IntTable = [0] * (n + 1)
        """Per block, the stamp of its latest access (hit or store)."""
        self._parted: set[int] = set()
        """Blocks where branches have parted (since their content was stored)."""
        self._stamp = 0
        self.superseded: OrderedDict[int, int] = OrderedDict()
        """Block -> the stamp of the store that superseded it, oldest first."""

    def touched(self, ids: Sequence[int]) -> None:
        """A request hits ``ids``, a prompt's leading blocks in order."""
        self._stamp = stamp = self._stamp + 1
        self._link(self.root, ids, stamp)

    def stored(self, parent: int, ids: Sequence[int], parting: bool) -> None:
        """A request stores ``ids`` in prompt order after block ``parent`` (``root``: from
        its prompt's start). ``parting``: its first store, leaving its last hit, where the
        ``tree`` rule looks for a branch it supersedes."""
        self._stamp = stamp = self._stamp + 1
        if parting and parent != self.root:
            self._part(parent, ids[0], stamp)
        if self._parted:
            self._parted.difference_update(ids)  # new content: no parting there yet
        self._link(parent, ids, stamp)
        self._child[ids[-1]] = NO_CHILD

    def _link(self, parent: int, ids: Sequence[int], stamp: int) -> None:
        """Each of ``ids`` becomes the latest child of the one before it (the first, of
        ``parent``), accessed at ``stamp``."""
        child, parents, seen = self._child, self._parent, self._seen
        before = parent
        for block in ids:
            child[before] = block
            parents[block] = before
            seen[block] = stamp
            before = block

    def _part(self, fork: int, new: int, stamp: int) -> None:
        """A request leaves ``fork`` for ``new``: at the first parting there, the branch
        through ``fork``'s latest child is superseded, unless ``new`` holds that child's
        content (a copy computed again, as vLLM does for a prompt's last block)."""
        old = self._child[fork]
        if old == NO_CHILD or self._parent[old] != fork or fork in self._parted:
            return
        if self._hashes[old] == self._hashes[new]:
            self._seen[old] = stamp  # its content is accessed again, in a copy
            return
        self._parted.add(fork)
        superseded = self.superseded
        for block in reversed(self._branch(old)):
            superseded.pop(block, None)
            superseded[block] = stamp

    def _branch(self, first: int) -> list[int]:
        """``first`` and the latest-child chain after it, as far as the blocks' latest
        accesses go on (one request's blocks from ``first`` on), up to the first block
        still marked: untouched since, it and the chain below it were marked together."""
        child, parents, seen, marked = self._child, self._parent, self._seen, self.superseded
        branch: list[int] = []
        block, none = first, NO_CHILD
        for _ in range(len(seen)):  # a bound: valid links never cycle
            by = marked.get(block)
            if by is not None and seen[block] < by:
                break
            branch.append(block)
            nxt = child[block]
            if nxt == none or parents[nxt] != block or seen[nxt] < seen[block]:
                break
            block = nxt
        return branch

    def victims(self, n: int, free: Container[int]) -> list[int]:
        """Up to ``n`` superseded blocks, oldest first, that are ``free`` (cached and held
        by the evictor) and were not accessed since; each one looked at is forgotten."""
        victims: list[int] = []
        superseded, seen = self.superseded, self._seen
        while superseded and len(victims) < n:
            block, by = superseded.popitem(last=False)
            if block in free and seen[block] < by:
                victims.append(block)
        return victims

    def pending(self) -> list[int]:
        """The blocks marked superseded and not accessed since, oldest first (whether
        still cached is the queue's to say)."""
        seen = self._seen
        return [block for block, by in self.superseded.items() if seen[block] < by]


class _OwnHash:
    """Block ids that are their content's hash: each block's hash is its id."""

    def __getitem__(self, block: int) -> int:
        return block


CACHED_ROOT = NO_CHILD - 1
"""``CachedBranches``' "no parent": below every block hash and ``NO_CHILD``."""


class CachedBranches(SupersededBranches):
    """The ``tree`` rule over a cache whose block ids are content hashes: it holds the
    cached blocks' links and marks only (``forget`` each evicted block)."""

    def __init__(self) -> None:
        super().__init__(0, _OwnHash())
        self.root = CACHED_ROOT
        self._children = Defaulted(NO_CHILD)
        self._parents = Defaulted(CACHED_ROOT)
        self._stamps = Defaulted(0)
        self._child, self._parent, self._seen = self._children, self._parents, self._stamps

    def __len__(self) -> int:
        """Blocks whose links it holds."""
        return len(self._stamps)

    def forget(self, ids: Sequence[int]) -> None:
        """``ids`` left the cache: their links, stamps and marks go with them."""
        for table in (self._children, self._parents, self._stamps, self.superseded):
            deque(map(table.pop, ids, repeat(None)), maxlen=0)  # a loop in C, not Python
        self._parted.difference_update(ids)

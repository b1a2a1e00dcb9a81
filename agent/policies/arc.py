"""``arc``: ARC (Megiddo and Modha, FAST 2003), with libCacheSim's exact eviction order.

Owns ARC's four LRU lists (``t1`` seen once, ``t2`` seen again, their ghosts ``b1`` and
``b2``), the target ``p`` for ``t1``, which list each cached block belongs to, and the blocks
in use. It never reads timestamps or categories.

The decisions are libCacheSim's ``ARC`` (so object-level traces give identical hit counts,
``tests/integration/test_crosscheck_libcachesim.py``):

- a hit moves a block to the most recent end of ``t2``; here it leaves the order while in
  use and rejoins that end when freed, in release order;
- a miss found in ``b1`` raises ``p`` by ``max(|b2| / |b1|, 1)`` (capped at the capacity), one
  found in ``b2`` lowers it by ``max(|b1| / |b2|, 1)`` (floored at 0); either goes to ``t2``.
  Any other miss goes to ``t1``;
- an eviction made room for such a ghost hit runs REPLACE: the LRU of ``t1`` goes to ``b1``
  if ``t1`` is non-empty and larger than ``p`` (or equal to ``p`` when the hit was in
  ``b2``), or if ``t2`` is empty; otherwise the LRU of ``t2`` goes to ``b2``;
- any other eviction is ARC's case IV: if ``|t1| + |b1| + 1`` exceeds the capacity, drop the
  LRU of ``b1`` and REPLACE, or evict the LRU of ``t1`` outright when ``b1`` is empty;
  otherwise drop the LRU of ``b2`` once all four lists hold twice the capacity, then
  REPLACE.

Which evictions count as "made room for a ghost hit": libCacheSim looks the missed block up
before it evicts. The replay frees a request's blocks before it evicts, so ``free`` finds
the ghost hits and each of the evictions that follow consumes one (the rest are case IV),
until the next request starts (its first ``touch``, ``free`` or ``allocate``). A caller
that evicts before it frees, as a classic cache or vLLM's allocator does, announces the
missed blocks first with ``allocate``; the ghost lookup then happens there.

In the replay a request's blocks are already in when it evicts, so case IV's ``+ 1``
(libCacheSim's room for the block about to come in) makes that test one block stricter.

A block in use stays counted in its list (``t2``: it was hit) but out of the order, so it is
never a victim; when the chosen list has only blocks in use, the other list gives the
victim.

``discard`` (``Discards``) takes blocks out of ``t1`` or ``t2`` in O(1) and, unlike an
eviction, remembers none in ``b1`` or ``b2``: the content is gone, not evicted too early, so
freed again a block is a plain miss (``t1``) that moves neither ``p`` nor a credit.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence
from itertools import repeat

from agent.policies.handover import Handover, drain
from agent.policies.registry import register

_T1, _T2 = 1, 2


@register("arc")
class ARCPolicy:
    """Adaptive replacement: recency (``t1``) against frequency (``t2``), tuned by ghosts."""

    __slots__ = (
        "_admitted",
        "_b1",
        "_b2",
        "_capacity",
        "_credits",
        "_in_use",
        "_list",
        "_n1",
        "_n2",
        "_p",
        "_t1",
        "_t2",
    )

    def __init__(self, capacity: int = 0) -> None:
        self._capacity = capacity
        self._t1: OrderedDict[int, None] = OrderedDict()  # evictable, least recent first
        self._t2: OrderedDict[int, None] = OrderedDict()
        self._b1: OrderedDict[int, None] = OrderedDict()
        self._b2: OrderedDict[int, None] = OrderedDict()
        self._list: dict[int, int] = {}  # every cached block -> _T1 or _T2
        self._n1 = 0  # blocks in t1, in use or not
        self._n2 = 0
        self._p = 0.0
        self._in_use: set[int] = set()
        self._credits: deque[int] = deque()  # ghost lists of this request's unused hits
        self._admitted: OrderedDict[int, None] = OrderedDict()  # allocated ghost hits

    def resize(self, capacity: int) -> None:
        """Evict down to ``capacity`` from now on (``Resizable``): the target ``p`` stays
        within it, and the ghosts are cut, oldest first, to ARC's bounds for it (``t1``
        and ``b1`` within ``c``, all four lists within ``2c``)."""
        self._capacity = capacity
        self._p = min(self._p, float(capacity))
        b1, b2 = self._b1, self._b2
        while b1 and self._n1 + len(b1) > capacity:
            b1.popitem(last=False)
        while b2 and self._n1 + len(b1) + self._n2 + len(b2) > 2 * capacity:
            b2.popitem(last=False)

    # -- the Protocol -------------------------------------------------------------------

    def allocate(self, blocks: Sequence[int], now: float) -> None:
        """An arriving request will compute ``blocks`` (not cached) and free them later.

        Optional (not part of the Protocol): a caller that evicts before it frees calls it
        before evicting, so ARC adapts on ghost hits as it would on the request's arrival.
        """
        self._credits.clear()
        for b in blocks:
            if b not in self._list and self._ghost_hit(b):
                self._admitted[b] = None
        while len(self._admitted) > max(self._capacity, 1):
            self._admitted.popitem(last=False)

    def touch(self, blocks: Sequence[int], now: float) -> None:
        self._credits.clear()
        in_use, lists, t1, t2 = self._in_use, self._list, self._t1, self._t2
        moved = 0
        for b in blocks:
            if b in in_use:  # already in use (or named twice)
                continue
            in_use.add(b)
            listed = lists.get(b)
            if listed is None:  # not cached (a broken contract): cached now, counted in t2
                lists[b] = _T2
                self._n2 += 1
            elif listed == _T1:  # seen again: t2 from now on
                del t1[b]
                lists[b] = _T2
                moved += 1
            else:
                del t2[b]
        self._n1 -= moved
        self._n2 += moved

    def free(
        self, blocks: Sequence[int], offsets: Sequence[int], now: float, category: int
    ) -> None:
        self._credits.clear()
        lists, in_use, t1, t2 = self._list, self._in_use, self._t1, self._t2
        admitted, b1, b2 = self._admitted, self._b1, self._b2
        new1 = 0
        for b in blocks:
            if b in lists:
                if b in in_use:  # a hit, in t2 since its touch
                    in_use.discard(b)
                    t2[b] = None
            elif (b in b1 or b in b2 or b in admitted) and self._admit_ghost(b):
                lists[b] = _T2
                t2[b] = None
                self._n2 += 1
            else:
                lists[b] = _T1
                t1[b] = None
                new1 += 1
        self._n1 += new1

    def _admit_ghost(self, b: int) -> bool:
        """Whether the miss ``b`` was a ghost hit (announced by ``allocate`` or found now)."""
        if b in self._admitted:
            del self._admitted[b]
            return True
        return self._ghost_hit(b)

    def _ghost_hit(self, b: int) -> bool:
        """If ``b`` is in a ghost list: adapt ``p``, drop the entry, earn an eviction credit."""
        b1, b2 = self._b1, self._b2
        if b in b1:
            self._p = min(self._p + max(len(b2) / len(b1), 1), self._capacity)
            del b1[b]
            self._credits.append(_T1)
            return True
        if b in b2:
            self._p = max(self._p - max(len(b1) / len(b2), 1), 0)
            del b2[b]
            self._credits.append(_T2)
            return True
        return False

    def discard(self, blocks: Sequence[int]) -> None:
        """``Discards``: ``blocks`` are held no more; no ghost entry is left for them."""
        lists, in_use, t1, t2 = self._list, self._in_use, self._t1, self._t2
        for b in blocks:
            listed = lists.pop(b, None)
            if listed is None:  # not held
                continue
            if b in in_use:  # counted in t2, out of the order
                in_use.discard(b)
            else:
                del (t1 if listed == _T1 else t2)[b]
            if listed == _T1:
                self._n1 -= 1
            else:
                self._n2 -= 1
            # A block touched while not cached may still be a ghost, or announced as one.
            for ghosts in (self._b1, self._b2, self._admitted):
                ghosts.pop(b, None)

    def evict(self, n: int) -> list[int]:
        victims: list[int] = []
        credits, lists = self._credits, self._list
        t1, t2, b1, b2 = self._t1, self._t2, self._b1, self._b2
        c, p, n1, n2 = self._capacity, self._p, self._n1, self._n2
        while len(victims) < n and (t1 or t2):
            if credits:  # REPLACE for a ghost hit
                hit_in_b2 = credits.popleft() == _T2
                remember = True
            elif n1 + len(b1) + 1 > c:  # case IV, t1 and b1 full
                remember = bool(b1)
                if remember:
                    b1.popitem(last=False)
                hit_in_b2 = False
            else:  # case IV, room in t1 and b1
                if n1 + len(b1) + n2 + len(b2) >= 2 * c and b2:
                    b2.popitem(last=False)
                remember = True
                hit_in_b2 = False
            # REPLACE (or, case IV without b1, t1's LRU outright). When the chosen list has
            # only blocks in use, the other list gives the victim.
            from_t1 = not remember or (n1 > 0 and (n1 > p or (n1 == p and hit_in_b2))) or n2 == 0
            if (from_t1 and t1) or not t2:
                b = t1.popitem(last=False)[0]
                n1 -= 1
                if remember:
                    b1[b] = None
            else:
                b = t2.popitem(last=False)[0]
                n2 -= 1
                if remember:
                    b2[b] = None
            del lists[b]
            victims.append(b)
        self._n1, self._n2 = n1, n2
        return victims

    def hand_over(self) -> Handover:
        handover = drain(self, self._in_use)
        for part in (self._t1, self._t2, self._b1, self._b2, self._list, self._admitted):
            part.clear()
        self._credits.clear()
        self._n1 = self._n2 = 0
        self._p = 0.0
        return handover

    def adopt(self, handover: Handover, now: float) -> None:
        """The evictable blocks in ``t1`` in victim order (seen once since the switch),
        the ones in use counted in ``t2`` (as a hit's are); ghosts empty, ``p`` 0."""
        self._t1.update(zip(handover.evictable, repeat(None)))
        self._list.update(zip(handover.evictable, repeat(_T1)))
        self._list.update(zip(handover.in_use, repeat(_T2)))
        self._in_use.update(handover.in_use)
        self._n1 += len(handover.evictable)
        self._n2 += len(handover.in_use)

    def __len__(self) -> int:
        return len(self._list)

    def __contains__(self, block: object) -> bool:
        return block in self._list

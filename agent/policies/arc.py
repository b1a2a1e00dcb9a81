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

A block in use stays counted in its list but out of the order, so it is never a victim;
when the chosen list has only blocks in use, the other list gives the victim.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

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
        self._credits: list[int] = []  # ghost hits of this request not yet used: the ghost
        self._admitted: OrderedDict[int, None] = OrderedDict()  # allocated ghost hits

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
        lists, in_use = self._list, self._in_use
        for b in blocks:
            if b in in_use:
                continue
            in_use.add(b)
            if lists[b] == _T1:
                del self._t1[b]
                lists[b] = _T2
                self._n1 -= 1
                self._n2 += 1
            else:
                del self._t2[b]

    def free(
        self, blocks: Sequence[int], offsets: Sequence[int], now: float, category: int
    ) -> None:
        self._credits.clear()
        lists, in_use, admitted = self._list, self._in_use, self._admitted
        for b in blocks:
            if b in in_use:
                in_use.discard(b)
                (self._t1 if lists[b] == _T1 else self._t2)[b] = None
            elif b not in lists:
                if b in admitted:
                    del admitted[b]
                    to_t2 = True
                else:
                    to_t2 = self._ghost_hit(b)
                if to_t2:
                    lists[b] = _T2
                    self._t2[b] = None
                    self._n2 += 1
                else:
                    lists[b] = _T1
                    self._t1[b] = None
                    self._n1 += 1

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

    def evict(self, n: int) -> list[int]:
        victims: list[int] = []
        credits = self._credits
        while len(victims) < n and (self._t1 or self._t2):
            if credits:
                self._replace(credits.pop(0) == _T2, victims)
            else:
                self._case_iv(victims)
        return victims

    # -- eviction -----------------------------------------------------------------------

    def _replace(self, hit_in_b2: bool, victims: list[int]) -> None:
        n1, p = self._n1, self._p
        if (n1 > 0 and (n1 > p or (n1 == p and hit_in_b2))) or self._n2 == 0:
            self._evict_lru(_T1, True, victims)
        else:
            self._evict_lru(_T2, True, victims)

    def _case_iv(self, victims: list[int]) -> None:
        c = self._capacity
        b1, b2 = self._b1, self._b2
        if self._n1 + len(b1) + 1 > c:
            if b1:
                b1.popitem(last=False)
                self._replace(False, victims)
            else:
                self._evict_lru(_T1, False, victims)
            return
        if self._n1 + len(b1) + self._n2 + len(b2) >= 2 * c and b2:
            b2.popitem(last=False)
        self._replace(False, victims)

    def _evict_lru(self, which: int, remember: bool, victims: list[int]) -> None:
        """Evict the LRU block of ``which`` (of the other list if ``which`` has none that is
        evictable), into its ghost list when ``remember``."""
        if which == _T1 and not self._t1:
            which = _T2
        elif which == _T2 and not self._t2:
            which = _T1
        if which == _T1:
            b = self._t1.popitem(last=False)[0]
            self._n1 -= 1
            ghost = self._b1
        else:
            b = self._t2.popitem(last=False)[0]
            self._n2 -= 1
            ghost = self._b2
        del self._list[b]
        if remember:
            ghost[b] = None
        victims.append(b)

    def __len__(self) -> int:
        return len(self._list)

    def __contains__(self, block: object) -> bool:
        return block in self._list

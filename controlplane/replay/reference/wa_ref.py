"""``wa-ref``: the reference code's workload-aware eviction, shortcuts included, to compare.

Owns ``WARefPolicy``, which keeps the victim order of ``agent.policies.wa_core`` but
stamps and files blocks the way the reference code (the paper authors' vLLM pull
request) did, with the shortcuts docs/policy.md lists ("Ablation", first row):

- last access is set only on a hit: a block inserted and never hit keeps last access 0,
  so its score is about 0 (and, all such blocks of a category tying, the one deepest in
  its prompt goes first, however recently it was inserted);
- a block keeps its creator's category until it is evicted;
- a category the document does not list gets priority 0 (``-inf``): evicted first;
- the life window is whatever the document says (the reference fitter puts 5 s there).

A block counts as hit when it is cached (in use or evictable) as its request releases
it; it is then stamped with the clock (which starts at 0). It must never be used as the
production policy; it exists so that replays measure what each shortcut costs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from heapq import heappop, heappush

from agent.policies.wa_core import Const, Freed, WACore, log_weight, runs
from agent.policies.wa_queue import Cutoff, Entry, Evictable, TimeQueue, ZeroQueue

_PRIORITY_ZERO: Const = (-math.inf, 1.0)


class RefLane:
    """One category: never-hit blocks in ``ZeroQueue``s by offset (deepest first), then
    hit blocks in a ``TimeQueue``. Every stamp-0 key is below every later one."""

    __slots__ = ("cur", "heap", "idx", "q", "zero")

    def __init__(self, idx: int) -> None:
        self.q = TimeQueue()
        self.zero: dict[int, ZeroQueue] = {}  # -offset -> its queue
        self.heap: list[int] = []  # the keys of ``zero``, a min-heap
        self.cur: TimeQueue | ZeroQueue = self.q  # where the head is
        self.idx = idx

    def add_zero(
        self, blocks: Sequence[int], offsets: Sequence[int], releases: Sequence[int]
    ) -> None:
        zero = self.zero
        for block, offset, release in zip(blocks, offsets, releases, strict=True):
            queue = zero.get(-offset)
            if queue is None:
                queue = zero[-offset] = ZeroQueue(-offset)
                heappush(self.heap, -offset)
            queue.add(block, release)

    def head(self, ev: Evictable) -> Entry | None:
        heap = self.heap
        while heap:
            queue = self.zero[heap[0]]
            e = queue.head(ev)
            if e is not None:
                self.cur = queue
                return e
            del self.zero[heappop(heap)]
        self.cur = self.q
        return self.q.head(ev)

    def take(self, ev: Evictable, cutoff: Cutoff, limit: int) -> list[int]:
        victims: list[int] = []
        while len(victims) < limit:
            cur = self.cur
            victims += cur.take(ev, cutoff, limit - len(victims))
            # Stop where a queue still holds blocks (they are at or above the cutoff); an
            # emptied one hands over to the next queue of this category.
            if cur.head(ev) is not None or self.head(ev) is None:
                break
        return victims

    def compact(self, ev: Evictable) -> None:
        self.q.compact(ev)
        for queue in self.zero.values():
            queue.compact(ev)


class WARefPolicy(WACore[RefLane]):
    """The reference code's behaviour (see the module docstring); same Protocol as ``wa``."""

    __slots__ = ()

    START_CLOCK = 0.0  # the reference's time origin: a block never hit keeps access 0
    ATTRIBUTIONS = ("creator",)  # the reference files a block under its creator only

    def _const_of(self, name: str | None) -> Const:
        params = None if name is None else self._doc.categories.get(name)
        return _PRIORITY_ZERO if params is None else log_weight(params)

    def _new_lane(self, row: int) -> RefLane:
        return RefLane(row)

    def _file(self, freed: Freed, category: int) -> None:
        t, blocks, offsets, releases = freed
        ev, in_use = self._ev, self._in_use
        # Never-hit blocks keep last access 0 (so do hits at time 0).
        stamped = [t > 0.0 and (b in ev or b in in_use) for b in blocks]
        codes = self._codes_of(blocks, category)
        # One stretch per (creator, stamped 0 or not): key = 2 * code + stamped.
        for key, lo, hi in runs([2 * c + h for c, h in zip(codes, stamped, strict=True)]):
            lane = self._lane(key >> 1)
            if key & 1:
                lane.q.add(freed.part(lo, hi))
                self._note(lane, t)
            else:
                lane.add_zero(blocks[lo:hi], offsets[lo:hi], releases[lo:hi])
                self._note(lane, 0.0)

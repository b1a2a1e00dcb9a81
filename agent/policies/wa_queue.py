"""The per-category queues of the workload-aware evictors, with lazy deletion.

Owns ``TimeQueue`` (a category's blocks in key order) and ``ZeroQueue`` (``wa-ref``'s
blocks stamped 0 at one offset) and the C-level bulk steps they share. Entries are
``(t, -offset, release number, block)`` tuples in a list read from a head index; an entry
is live while the evictable-block map ``ev`` maps its block to that very tuple, so
``touch`` and a second ``free`` only update ``ev`` and leave a stale entry behind, skipped
at the head or compacted later. The victim order itself is defined in
``agent.policies.wa_core``. It must never do I/O.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Callable, Iterable
from itertools import compress, takewhile
from operator import is_, itemgetter, not_

Entry = tuple[float, int, int, int]
"""A queued block: ``(t, -offset, release number, block)``."""
Key = tuple[float, float, int, int, int]
"""``(score, t, -offset, release number, row)``: a category head's key."""
Evictable = dict[int, Entry]
"""Evictable block -> its live entry."""

STAMP = itemgetter(0)
RELEASE = itemgetter(2)
BLOCK = itemgetter(3)
INF = math.inf
_CHUNK = 256  # entries examined at a time when skipping stale ones
_TRIM = 4096  # a queue drops its consumed prefix once it is this long and half the list


def surely_below(lc: float, a: float, now: float, thr: Key | None) -> float:
    """A time ``b`` such that every entry of a category with constants ``(lc, a)``
    stamped ``t < b`` has a key below ``thr`` (conservative: later entries are checked
    exactly).

    The score ``lc - a (now - t)`` falls below ``thr``'s once ``t < now - (lc - s) / a``;
    the margin (a billionth of the magnitudes involved plus a microsecond) covers every
    rounding of the score and of this bound by orders of magnitude.
    """
    if thr is None:
        return INF
    threshold_score = thr[0]
    if lc == -INF:
        # Every score of this category is -inf: below any finite one, else ages decide.
        return INF if threshold_score > -INF else thr[1]
    if threshold_score == -INF or a < 1e-200:
        return -INF
    idle = (lc - threshold_score) / a
    margin = 1e-9 * (abs(now) + abs(idle) + (abs(lc) + abs(threshold_score)) / a) + 1e-6
    bound = now - idle - margin
    return bound if math.isfinite(bound) else -INF


def live_flags(ev: Evictable, entries: Iterable[Entry]) -> Iterable[bool]:
    """Lazily, whether each entry is live (C-level). ``entries`` is iterated twice."""
    return map(is_, map(ev.get, map(BLOCK, entries)), entries)


class EntryList:
    """Entries in key order from index ``h`` of ``ents``; ``ents[:h]`` is consumed."""

    __slots__ = ("ents", "h")

    def __init__(self) -> None:
        self.ents: list[Entry] = []
        self.h = 0

    def first_live(self, ev: Evictable) -> Entry | None:
        """Skip stale entries at the head; the first live one (``None``: empty)."""
        ents, h = self.ents, self.h
        while h < len(ents):
            entry = ents[h]
            if ev.get(entry[3]) is entry:
                self.h = h
                return entry
            chunk = ents[h : h + _CHUNK]
            h += len(list(takewhile(not_, live_flags(ev, chunk))))
        self.h = h
        self.trim()
        return None

    def pop_below(
        self, ev: Evictable, field: Callable[[Entry], float], bound: float, limit: int
    ) -> list[int]:
        """Consume entries from the head while ``field(entry) < bound`` (the field
        ascends along the list) until ``limit`` live blocks are taken; remove those from
        ``ev`` and return them."""
        ents, h = self.ents, self.h
        if bound == INF and h < len(ents) and field(ents[-1]) < INF:
            end = len(ents)  # the field ascends: every entry is below the bound
        else:
            end = bisect_left(ents, bound, h, key=field)
        victims: list[int] = []
        while h < end and len(victims) < limit:
            stop = min(end, h + limit - len(victims))
            chunk = ents[h:stop]
            h = stop
            # The live entries (a block's live entry is unique, so no block twice), then
            # their removal: C-level passes, two dict operations per victim.
            blocks = list(map(BLOCK, chunk))
            got = list(compress(blocks, map(is_, map(ev.get, blocks), chunk)))
            deque(map(ev.__delitem__, got), maxlen=0)
            victims += got
        self.h = h
        return victims

    def trim(self) -> None:
        if self.h > _TRIM and 2 * self.h > len(self.ents):
            del self.ents[: self.h]
            self.h = 0

    def compact(self, ev: Evictable) -> None:
        """Drop every stale entry (order kept)."""
        rest = self.ents[self.h :]
        self.ents = list(compress(rest, live_flags(ev, rest)))
        self.h = 0


class TimeQueue(EntryList):
    """One category's blocks in order of ``(t, -offset, release number)``.

    Blocks join at the tail stamped with the clock, which never goes back, so the queue is
    ordered by ``t``. Blocks stamped with the same ``t`` by different ``free`` calls (or
    freed out of offset order) may be out of order among themselves: such a run is marked
    dirty and sorted once, lazily, when it reaches the head.
    """

    __slots__ = ("dirty",)

    def __init__(self) -> None:
        super().__init__()
        self.dirty: deque[float] = deque()  # times of runs to sort, increasing

    def add(self, entries: list[Entry], t: float, ordered: bool) -> None:
        """Append ``entries`` (all stamped ``t``); ``ordered``: they are in key order."""
        ents = self.ents
        if ordered and len(ents) > self.h:
            ordered = ents[-1] < entries[0]
        ents.extend(entries)
        if not ordered and (not self.dirty or self.dirty[-1] != t):
            self.dirty.append(t)

    def head(self, ev: Evictable) -> Entry | None:
        """The first live entry, its run sorted first if it was dirty."""
        dirty = self.dirty
        while True:
            entry = self.first_live(ev)
            if entry is None:
                dirty.clear()
                return None
            stamp = entry[0]
            while dirty and dirty[0] < stamp:
                dirty.popleft()
            if not dirty or dirty[0] != stamp:
                return entry
            dirty.popleft()
            ents, h = self.ents, self.h
            end = bisect_right(ents, stamp, h, key=STAMP)
            run = ents[h:end]
            ents[h:end] = sorted(compress(run, live_flags(ev, run)))

    def take_exactly(
        self,
        ev: Evictable,
        lc: float,
        a: float,
        now: float,
        thr: Key,
        stop: float,
        limit: int,
        victims: list[int],
    ) -> int:
        """Near the boundary: key entries one by one from the head, appending to
        ``victims`` (at most ``limit``) those below ``thr`` and stamped before ``stop``.
        Returns the new head index."""
        ents, h = self.ents, self.h
        taken = 0
        while taken < limit and h < len(ents):
            entry = ents[h]
            stamp, neg_offset, release, block = entry
            if ev.get(block) is entry:
                score = lc - a * (now - stamp)
                if stamp >= stop or (score, stamp, neg_offset, release) >= thr:
                    break
                victims.append(block)
                del ev[block]
                taken += 1
            h += 1
        self.h = h
        return h

    def take(
        self, ev: Evictable, lc: float, a: float, now: float, thr: Key | None, limit: int
    ) -> list[int]:
        """Pop up to ``limit`` blocks, from the head on, whose keys are below ``thr``;
        remove them from ``ev`` and return them. Called right after ``head``."""
        below = surely_below(lc, a, now, thr)
        victims: list[int] = []
        while True:
            stop = self.dirty[0] if self.dirty else INF
            # The bulk: a binary search on the stamps, up to the next dirty run.
            victims += self.pop_below(ev, STAMP, min(below, stop), limit - len(victims))
            ents, h = self.ents, self.h
            if thr is not None:
                h = self.take_exactly(ev, lc, a, now, thr, stop, limit - len(victims), victims)
            if len(victims) >= limit or h >= len(ents) or ents[h][0] < stop:
                self.trim()
                return victims
            # A dirty run reached the head: sort it and carry on.
            if self.head(ev) is None:
                return victims


class ZeroQueue(EntryList):
    """``wa-ref``: a category's blocks stamped 0 at one offset. Their keys differ only in
    the release number, so release order is key order."""

    __slots__ = ("no",)

    def __init__(self, neg_offset: int) -> None:
        super().__init__()
        self.no = neg_offset

    def head(self, ev: Evictable) -> Entry | None:
        return self.first_live(ev)

    def take(
        self, ev: Evictable, lc: float, a: float, now: float, thr: Key | None, limit: int
    ) -> list[int]:
        if thr is not None:
            head = (lc - a * (now - 0.0), 0.0, self.no)
            if head > thr[:3]:
                return []
            if head == thr[:3]:
                return self.pop_below(ev, RELEASE, thr[3], limit)
        return self.pop_below(ev, STAMP, INF, limit)

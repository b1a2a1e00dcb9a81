"""The per-category queues of the workload-aware evictors, with lazy deletion.

Owns ``TimeQueue`` (a category's blocks in key order) and ``ZeroQueue`` (``wa-ref``'s
blocks stamped 0 at one offset) and the C-level bulk steps they share. Entries are
``(t, -offset, release number, block)`` tuples in a list read from a head index; an entry
is live while the evictable-block map ``evictable`` maps its block to that very tuple, so
``touch`` and a second ``free`` only update ``evictable`` and leave a stale entry behind, skipped
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
from typing import NamedTuple

Entry = tuple[float, int, int, int]
"""A queued block: ``(t, -offset, release number, block)``."""
Key = tuple[float, float, int, int, int]
"""``(score, t, -offset, release number, row)``: a category head's key."""
Evictable = dict[int, Entry]
"""Evictable block -> its live entry."""

STAMP = itemgetter(0)
RELEASE = itemgetter(2)
BLOCK = itemgetter(3)
"""An entry's fields."""
KEY_SCORE = itemgetter(0)
KEY_STAMP = itemgetter(1)
KEY_RELEASE = itemgetter(3)
KEY_ROW = itemgetter(4)
"""A head key's fields."""
INF = math.inf
_CHUNK = 256  # entries examined at a time when skipping stale ones
_TRIM = 4096  # a queue drops its consumed prefix once it is this long and half the list


class Cutoff(NamedTuple):
    """Where a category's ``take`` stops: its constants, the time, and the key its
    victims stay below (``None``: no other head to compare, every block qualifies)."""

    log_constant: float
    rate: float
    now: float
    threshold: Key | None


def surely_below(cutoff: Cutoff) -> float:
    """A time ``b`` such that every entry of a category with constants
    ``(log_constant, rate)`` stamped ``t < b`` has a key below ``threshold``
    (conservative: later entries are checked exactly).

    The score ``log_constant - rate (now - t)`` falls below the threshold's score ``s``
    once ``t < now - (log_constant - s) / rate``. Every rounding of the score and of this
    bound is within a few ``2**-53`` of the magnitudes involved (``now``, the idle time,
    ``(|log_constant| + |s|) / rate``, all in seconds); the margin, a trillionth of them
    plus a microsecond, exceeds that a thousandfold. It stays well under a second for
    epoch-second clocks (a billionth would be 1.7 s today, and every block released within
    it would be keyed one by one).
    """
    log_constant, rate, now, threshold = cutoff
    if threshold is None:
        return INF
    threshold_score = KEY_SCORE(threshold)
    if log_constant == -INF:
        # Every score of this category is -inf: below any finite one, else ages decide.
        return INF if threshold_score > -INF else KEY_STAMP(threshold)
    if threshold_score == -INF or rate < 1e-200:
        return -INF
    idle = (log_constant - threshold_score) / rate
    margin = (
        1e-12 * (abs(now) + abs(idle) + (abs(log_constant) + abs(threshold_score)) / rate) + 1e-6
    )
    bound = now - idle - margin
    return bound if math.isfinite(bound) else -INF


def live_flags(evictable: Evictable, entries: Iterable[Entry]) -> Iterable[bool]:
    """Lazily, whether each entry is live (C-level). ``entries`` is iterated twice."""
    return map(is_, map(evictable.get, map(BLOCK, entries)), entries)


class EntryList:
    """Entries in key order from index ``head_at`` of ``ents``; ``ents[:head_at]`` is
    consumed."""

    __slots__ = ("ents", "head_at")

    def __init__(self) -> None:
        self.ents: list[Entry] = []
        self.head_at = 0

    def first_live(self, evictable: Evictable) -> Entry | None:
        """Skip stale entries at the head; the first live one (``None``: empty)."""
        ents, head_at = self.ents, self.head_at
        while head_at < len(ents):
            entry = ents[head_at]
            if evictable.get(BLOCK(entry)) is entry:
                self.head_at = head_at
                return entry
            chunk = ents[head_at : head_at + _CHUNK]
            head_at += len(list(takewhile(not_, live_flags(evictable, chunk))))
        self.head_at = head_at
        self.trim()
        return None

    def pop_below(
        self, evictable: Evictable, field: Callable[[Entry], float], bound: float, limit: int
    ) -> list[int]:
        """Consume entries from the head while ``field(entry) < bound`` (the field
        ascends along the list) until ``limit`` live blocks are taken; remove those from
        ``evictable`` and return them."""
        ents, head_at = self.ents, self.head_at
        if bound == INF and head_at < len(ents) and field(ents[-1]) < INF:
            end = len(ents)  # the field ascends: every entry is below the bound
        else:
            end = bisect_left(ents, bound, head_at, key=field)
        victims: list[int] = []
        while head_at < end and len(victims) < limit:
            stop = min(end, head_at + limit - len(victims))
            chunk = ents[head_at:stop]
            head_at = stop
            # The live entries (a block's live entry is unique, so no block twice), then
            # their removal: C-level passes, two dict operations per victim.
            blocks = list(map(BLOCK, chunk))
            got = list(compress(blocks, map(is_, map(evictable.get, blocks), chunk)))
            deque(map(evictable.__delitem__, got), maxlen=0)
            victims += got
        self.head_at = head_at
        return victims

    def trim(self) -> None:
        if self.head_at > _TRIM and 2 * self.head_at > len(self.ents):
            del self.ents[: self.head_at]
            self.head_at = 0

    def compact(self, evictable: Evictable) -> None:
        """Drop every stale entry (order kept)."""
        rest = self.ents[self.head_at :]
        self.ents = list(compress(rest, live_flags(evictable, rest)))
        self.head_at = 0


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
        if ordered and len(ents) > self.head_at:
            ordered = ents[-1] < entries[0]
        ents.extend(entries)
        if not ordered and (not self.dirty or self.dirty[-1] != t):
            self.dirty.append(t)

    def head(self, evictable: Evictable) -> Entry | None:
        """The first live entry, its run sorted first if it was dirty."""
        dirty = self.dirty
        while True:
            entry = self.first_live(evictable)
            if entry is None:
                dirty.clear()
                return None
            stamp = STAMP(entry)
            while dirty and dirty[0] < stamp:
                dirty.popleft()
            if not dirty or dirty[0] != stamp:
                return entry
            dirty.popleft()
            ents, head_at = self.ents, self.head_at
            end = bisect_right(ents, stamp, head_at, key=STAMP)
            run = ents[head_at:end]
            ents[head_at:end] = sorted(compress(run, live_flags(evictable, run)))

    def peek(self, evictable: Evictable, count: int) -> list[Entry]:
        """The first ``count`` live entries in key order, left in place (dirty runs met
        on the way are sorted, as ``head`` sorts the one at the head)."""
        if self.head(evictable) is None:
            return []
        ents, dirty = self.ents, self.dirty
        found: list[Entry] = []
        position = self.head_at
        while len(found) < count and position < len(ents):
            stamp = STAMP(ents[position])
            while dirty and dirty[0] < stamp:
                dirty.popleft()  # a dirty run whose entries have all gone
            if dirty and dirty[0] == stamp:
                self.sort_run(evictable, position, stamp)
                dirty.popleft()
                continue
            end = min(position + count - len(found), len(ents))
            if dirty:  # stop before the next dirty run
                end = bisect_left(ents, dirty[0], position, end, key=STAMP)
            chunk = ents[position:end]
            found += compress(chunk, live_flags(evictable, chunk))
            position = end
        return found

    def sort_run(self, evictable: Evictable, start: int, stamp: float) -> None:
        """Sort the live entries stamped ``stamp`` from index ``start`` on (a dirty run),
        dropping its stale ones."""
        ents = self.ents
        end = bisect_right(ents, stamp, start, key=STAMP)
        run = ents[start:end]
        ents[start:end] = sorted(compress(run, live_flags(evictable, run)))

    def take_exactly(
        self,
        evictable: Evictable,
        cutoff: Cutoff,
        threshold: Key,
        stop: float,
        limit: int,
        victims: list[int],
    ) -> int:
        """Near the boundary: key entries one by one from the head, appending to
        ``victims`` (at most ``limit``) those below ``threshold`` (``cutoff``'s) and
        stamped before ``stop``. Returns the new head index."""
        log_constant, rate, now, _ = cutoff
        ents, head_at = self.ents, self.head_at
        taken = 0
        while taken < limit and head_at < len(ents):
            entry = ents[head_at]
            stamp, neg_offset, release, block = entry
            if evictable.get(block) is entry:
                score = log_constant - rate * (now - stamp)
                if stamp >= stop or (score, stamp, neg_offset, release) >= threshold:
                    break
                victims.append(block)
                del evictable[block]
                taken += 1
            head_at += 1
        self.head_at = head_at
        return head_at

    def take(self, evictable: Evictable, cutoff: Cutoff, limit: int) -> list[int]:
        """Pop up to ``limit`` blocks, from the head on, whose keys are below ``threshold``;
        remove them from ``evictable`` and return them. Called right after ``head``."""
        below = surely_below(cutoff)
        threshold = cutoff.threshold
        victims: list[int] = []
        while True:
            stop = self.dirty[0] if self.dirty else INF
            # The bulk: a binary search on the stamps, up to the next dirty run.
            victims += self.pop_below(evictable, STAMP, min(below, stop), limit - len(victims))
            ents, head_at = self.ents, self.head_at
            if threshold is not None:
                head_at = self.take_exactly(
                    evictable, cutoff, threshold, stop, limit - len(victims), victims
                )
            if len(victims) >= limit or head_at >= len(ents) or STAMP(ents[head_at]) < stop:
                self.trim()
                return victims
            # A dirty run reached the head: sort it and carry on.
            if self.head(evictable) is None:
                return victims


class ZeroQueue(EntryList):
    """``wa-ref``: a category's blocks stamped 0 at one offset. Their keys differ only in
    the release number, so release order is key order."""

    __slots__ = ("no",)

    def __init__(self, neg_offset: int) -> None:
        super().__init__()
        self.no = neg_offset

    def head(self, evictable: Evictable) -> Entry | None:
        return self.first_live(evictable)

    def take(self, evictable: Evictable, cutoff: Cutoff, limit: int) -> list[int]:
        log_constant, rate, now, threshold = cutoff
        if threshold is not None:
            head = (log_constant - rate * (now - 0.0), 0.0, self.no)
            if head > threshold[:3]:
                return []
            if head == threshold[:3]:
                return self.pop_below(evictable, RELEASE, KEY_RELEASE(threshold), limit)
        return self.pop_below(evictable, STAMP, INF, limit)

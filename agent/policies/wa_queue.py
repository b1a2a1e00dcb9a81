"""The per-category queues of the workload-aware evictors, with lazy deletion.

Owns ``Run`` (the blocks one ``free`` filed in one category, in key order),
``TimeQueue`` (a category's runs in key order) and ``ZeroQueue`` (``wa-ref``'s blocks
stamped 0 at one offset). No per-block object is made: a run keeps its blocks, their
offsets and their release numbers in flat sequences and the stamp once. A block is live
while the evictable-block map ``evictable`` maps it to that very release number, so
``touch`` and a second ``free`` only update ``evictable`` and leave a stale position
behind, skipped at the head (and counted there, so that the owner knows how many stale
positions are still held) or compacted later. The stale positions a hit leaves at the
tail of a run (a hit is a prompt prefix; a run holds its prompt tail first) are dropped
at once instead (``retire_tails``; runs are found through ``Tails``). Every block of a
run has the same stamp, so the same score: a ``take`` compares one key per run, and only
a run whose score and stamp equal the threshold's is split, by a binary search on
offsets and release numbers.
The victim order itself is defined in ``agent.policies.wa_core``. It must never do I/O.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from itertools import compress, islice, repeat, takewhile
from operator import eq, ge, is_, is_not, neg, not_
from typing import cast

Entry = tuple[float, int, int, int]
"""A queued block's key and id: ``(t, -offset, release number, block)``."""
Key = tuple[float, float, int, int, int]
"""``(score, t, -offset, release number, row)``: a category head's key."""
Const = tuple[float, float]
"""``(lc_w, a_w)`` of one category: a block stamped ``t`` scores ``lc_w - a_w (now - t)``."""
Cutoff = tuple[Const, float, "Key | None", "float | None"]
"""Where a category's ``take`` stops: ``(constants, now, threshold, floor)``, its
``constants``, the time, the key its victims stay below (``None``: no other head to
compare, every block qualifies) and a score they stay strictly below (a lower bound of
the heads not keyed; ``None``: none). A plain tuple: built on every take."""
Evictable = dict[int, int]
"""Evictable block -> the release number of its live position."""
Tails = dict[int, "Run"]
"""The release number of each queued run's last position -> the run (a hit on that
block retires the run's tail: ``retire_tails``)."""

_CHUNK = 256  # positions examined at a time when skipping stale ones
_TRIM = 4096  # a zero queue drops its consumed prefix once it is this long and half the list


def in_key_order(offsets: Sequence[int]) -> bool:
    """Whether blocks released with these prompt offsets are in key order (offsets never
    increase: a request freed tail first)."""
    if isinstance(offsets, range):
        return offsets.step < 0 or len(offsets) <= 1
    return all(map(ge, offsets, islice(offsets, 1, None)))


def skip_stale(evictable: Evictable, blocks: list[int], releases: Sequence[int], at: int) -> int:
    """The first live position of ``blocks`` from ``at`` on (``len(blocks)``: none),
    scanned ``_CHUNK`` positions at a time (C-level)."""
    end = len(blocks)
    while at < end:
        if evictable.get(blocks[at]) == releases[at]:
            return at
        stop = min(at + _CHUNK, end)
        flags = map(eq, map(evictable.get, blocks[at:stop]), releases[at:stop])
        at += len(list(takewhile(not_, flags)))
    return end


def pop_live(evictable: Evictable, blocks: list[int], releases: list[int]) -> list[int]:
    """Remove from ``evictable`` the ``blocks`` whose positions (numbered ``releases``)
    are live, and return them in order.

    Every block is popped first and what was popped compared with ``releases`` (C-level,
    by identity first: the map holds the very int objects the runs do); when all are
    live that is all. Otherwise the positions from the first that differs are put back
    and decided one by one, as a block may appear there twice (named twice in a
    ``free``), once stale and once live."""
    popped = list(map(evictable.pop, blocks, repeat(None)))
    if popped == releases:
        return blocks
    first = list(map(is_, popped, releases)).index(False)
    rest, rest_popped, rest_releases = blocks[first:], popped[first:], releases[first:]
    present = compress(zip(rest, rest_popped, strict=True), map(is_not, rest_popped, repeat(None)))
    evictable.update(cast("Iterator[tuple[int, int]]", present))
    live = list(compress(rest, map(eq, map(evictable.get, rest), rest_releases)))
    for block in live:  # a plain loop: cheaper than map over __delitem__
        del evictable[block]
    return blocks[:first] + live


class Run:
    """Blocks one ``free`` filed in one category, all stamped ``t``, in key order
    (``-offset`` ascending, then release number) from position ``at`` on."""

    __slots__ = ("at", "blocks", "offsets", "releases", "t")

    def __init__(
        self, t: float, blocks: list[int], offsets: Sequence[int], releases: list[int]
    ) -> None:
        self.t = t
        self.blocks = blocks
        self.offsets = offsets
        self.releases = releases
        self.at = 0

    @classmethod
    def numbered(
        cls, t: float, blocks: Sequence[int], offsets: Sequence[int], releases: list[int]
    ) -> Run:
        """The run of freed ``blocks`` numbered ``releases`` (best the very int objects
        the evictable map holds: ``take`` compares them by identity first), sorted into
        key order when the offsets were not (not a request freed tail first)."""
        if in_key_order(offsets):
            kept = offsets if isinstance(offsets, range) else list(offsets)
            return cls(t, list(blocks), kept, releases)
        return cls.sorted_from(t, zip(map(neg, offsets), releases, blocks, strict=True))

    @classmethod
    def sorted_from(cls, t: float, keyed: Iterable[tuple[int, int, int]]) -> Run:
        """The run of ``(-offset, release number, block)`` triples, sorted."""
        ordered = sorted(keyed)
        if not ordered:
            return cls(t, [], [], [])
        neg_offsets, releases, blocks = zip(*ordered, strict=True)
        return cls(t, list(blocks), list(map(neg, neg_offsets)), list(releases))

    def first_live(self, evictable: Evictable) -> int | None:
        """Skip stale positions; the first live one (``None``: none left)."""
        at = self.at = skip_stale(evictable, self.blocks, self.releases, self.at)
        return at if at < len(self.blocks) else None

    def entry(self, position: int) -> Entry:
        return (self.t, -self.offsets[position], self.releases[position], self.blocks[position])

    def live_triples(self, evictable: Evictable) -> list[tuple[int, int, int]]:
        """``(-offset, release number, block)`` of the live positions."""
        at = self.at
        blocks, releases = self.blocks[at:], self.releases[at:]
        flags = map(eq, map(evictable.get, blocks), releases)
        triples = zip(map(neg, self.offsets[at:]), releases, blocks, strict=True)
        return list(compress(triples, flags))

    def compacted(self, evictable: Evictable) -> Run | None:
        """The run of the live positions (itself when all are; ``None`` when none is)."""
        at = self.at
        blocks, releases = self.blocks[at:], self.releases[at:]
        flags = list(map(eq, map(evictable.get, blocks), releases))
        if all(flags):
            return self if blocks else None
        if not any(flags):
            return None
        return Run(
            self.t,
            list(compress(blocks, flags)),
            list(compress(self.offsets[at:], flags)),
            list(compress(releases, flags)),
        )

    def retire_tail(self, released: list[int | None], at: int) -> int:
        """Drop the positions at the end of this run that ``released[at:]`` names, in
        reverse, by their very release numbers (a hit just made them stale); returns how
        many. Compared C-level, as far as they agree."""
        length = len(self.releases)
        count = min(len(released) - at, length - self.at)
        before = length - count - 1  # the position before the tail compared (-1: none)
        tail = self.releases[: before if before >= 0 else None : -1]
        agreed = released[at : at + count]
        if agreed != tail:  # the first that differs (identity: the very int objects)
            count = next(compress(range(count), map(is_not, agreed, tail)))
        keep = length - count
        del self.blocks[keep:]
        del self.releases[keep:]
        self.offsets = self.offsets[:keep]
        return count

    def split_at(self, threshold: Key) -> int:
        """The first position from ``at`` whose key is not below ``threshold``, whose
        score and stamp equal those every position of this run has: the order of
        ``(-offset, release number)`` decides."""
        offsets, releases = self.offsets, self.releases
        return bisect_left(
            range(len(self.blocks)),
            (threshold[2], threshold[3]),
            self.at,
            key=lambda i: (-offsets[i], releases[i]),
        )


def retire_tails(tails: Tails, released: list[int | None]) -> int:
    """Drop the positions that a hit just made stale at the tails of the runs holding
    them; returns how many. ``released`` are the release numbers the hit blocks were
    evictable under (``None``: not evictable), in prompt order.

    A hit is a prompt prefix, and a run holds its blocks tail first (key order), so the
    prefix's blocks sit at the end of the run that released them last, in reverse: the
    run is found by its last position's number, and its tail compared with the prefix
    (C-level) as far as they agree. What follows may be the tail of another run (the
    prefix was released in parts). Stale positions elsewhere are skipped by ``take``."""
    end = len(released)
    at = 0
    if end and released[0] is None:  # leading blocks in use: the first that was evictable
        at = next(compress(range(end), map(is_not, released, repeat(None))), end)
    dropped = 0
    while at < end:
        release = released[at]
        run = None if release is None else tails.pop(release, None)
        if run is None:
            break
        count = run.retire_tail(released, at)
        if len(run.releases) > run.at:
            tails[run.releases[-1]] = run
        if not count:
            break
        dropped += count
        at += count
    return dropped


class TimeQueue:
    """One category's blocks in order of ``(t, -offset, release number)``: runs in
    stamp order, each in key order.

    Runs join at the tail stamped with the clock, which never goes back. Two runs with
    the same stamp may interleave: such a stamp is marked dirty and its runs are merged
    once, lazily, when they reach the head. With ``tails`` every queued run is entered
    there under its last position's release number (``retire_tails``).
    """

    __slots__ = ("dirty", "front", "runs", "stale_dropped", "tails")

    def __init__(self, tails: Tails | None = None) -> None:
        self.tails = tails
        self.runs: deque[Run] = deque()
        self.dirty: deque[float] = deque()  # stamps whose runs need merging, increasing
        # The head entry last found; it is still the head while its block is live at its
        # release number (only a take, or a run merged before it, moves the head back).
        self.front: Entry | None = None
        # Stale positions passed over at the head since the last ``compact``: the owner
        # subtracts them from its count of stale positions held.
        self.stale_dropped = 0

    def is_empty(self) -> bool:
        """No run left, live or stale."""
        return not self.runs

    def add(self, run: Run) -> None:
        """Append ``run`` (stamped at least as late as every run held)."""
        runs, t = self.runs, run.t
        if runs and runs[-1].t == t and run.blocks and self._interleaves(runs[-1], run):
            # Interleaves with the runs of the same stamp: merged at the head.
            if not self.dirty or self.dirty[-1] != t:
                self.dirty.append(t)
            self.front = None
        runs.append(run)
        if self.tails is not None and run.releases:
            self.tails[run.releases[-1]] = run

    @staticmethod
    def _interleaves(last: Run, run: Run) -> bool:
        """Whether ``run`` (not empty) may hold keys below those of ``last``, the run
        before it with the same stamp (an emptied ``last``: those before it may)."""
        return not last.blocks or run.offsets[0] > last.offsets[-1]

    def _forget(self, run: Run) -> None:
        """``run`` leaves the queue: its entry in ``tails`` goes."""
        if self.tails is not None and run.releases:
            self.tails.pop(run.releases[-1], None)

    def _merge_head(self) -> None:
        """Merge the runs at the head that share its dirty stamp."""
        runs, t = self.runs, self.dirty.popleft()
        keyed: list[tuple[int, int, int]] = []
        # Stale positions merge along and are skipped later, like any other.
        while runs and runs[0].t == t:
            run = runs.popleft()
            self._forget(run)
            keyed += zip(
                map(neg, run.offsets[run.at :]),
                run.releases[run.at :],
                run.blocks[run.at :],
                strict=True,
            )
        merged = Run.sorted_from(t, keyed)
        runs.appendleft(merged)
        if self.tails is not None and merged.releases:
            self.tails[merged.releases[-1]] = merged

    def head_run(self, evictable: Evictable) -> Run | None:
        """The run holding the first live block, positioned on it (``None``: empty)."""
        runs, dirty = self.runs, self.dirty
        while runs:
            run = runs[0]
            while dirty and dirty[0] < run.t:
                dirty.popleft()
            if dirty and dirty[0] == run.t:
                self._merge_head()
                run = runs[0]
            at = run.at
            live = run.first_live(evictable)
            self.stale_dropped += run.at - at
            if live is not None:
                return run
            self._forget(runs.popleft())
        dirty.clear()
        return None

    def head(self, evictable: Evictable) -> Entry | None:
        """The first live entry (``None`` when empty)."""
        front = self.front
        if front is not None and evictable.get(front[3]) == front[2]:
            return front
        runs = self.runs
        if runs and not self.dirty:  # the common case: the head run's next position
            first = runs[0]
            at = first.at
            if at < len(first.blocks) and evictable.get(first.blocks[at]) == first.releases[at]:
                front = (first.t, -first.offsets[at], first.releases[at], first.blocks[at])
                self.front = front
                return front
        run = self.head_run(evictable)
        self.front = front = None if run is None else run.entry(run.at)
        return front

    def take(self, evictable: Evictable, cutoff: Cutoff, limit: int) -> list[int]:
        """Pop up to ``limit`` blocks, from the head on, whose keys are below the
        threshold and whose scores are below the floor; remove them from ``evictable``
        and return them. Called right after ``head``. One key per run: its blocks share
        their stamp, so their score."""
        (log_constant, rate), now, threshold, floor = cutoff
        self.front = None
        run: Run | None = self.runs[0] if self.runs else None  # positioned by ``head``
        victims: list[int] = []
        examined = 0
        while run is not None:
            blocks, at, t = run.blocks, run.at, run.t
            stop = len(blocks)
            score = log_constant - rate * (now - t)
            if floor is not None and not score < floor:
                stop = at
            elif threshold is not None and (score, t) >= threshold[:2]:
                stop = at if (score, t) > threshold[:2] else run.split_at(threshold)
            while at < stop and len(victims) < limit:
                end = min(stop, at + limit - len(victims))
                victims += pop_live(evictable, blocks[at:end], run.releases[at:end])
                examined += end - at
                at = end
            run.at = at
            if at < len(blocks) or len(victims) >= limit:
                break  # the limit, or the threshold, was reached
            run = self._next_run(evictable)
        self.stale_dropped += examined - len(victims)
        return victims

    def _next_run(self, evictable: Evictable) -> Run | None:
        """``head_run`` once the head run is used up: usually the next run, positioned
        past its stale positions."""
        runs = self.runs
        self._forget(runs.popleft())
        while runs and not self.dirty:
            run = runs[0]
            at = run.at
            live = run.at = skip_stale(evictable, run.blocks, run.releases, at)
            self.stale_dropped += live - at
            if live < len(run.blocks):
                return run
            self._forget(runs.popleft())
        return self.head_run(evictable)

    def peek(self, evictable: Evictable, wanted: int) -> list[Entry]:
        """The first ``wanted`` live entries in key order, left in place."""
        if self.head_run(evictable) is None:
            return []
        found: list[Entry] = []
        dirty = set(self.dirty)
        position = 0
        runs = self.runs
        while len(found) < wanted and position < len(runs):
            t = runs[position].t
            group = [runs[position]]
            position += 1
            if t in dirty:
                while position < len(runs) and runs[position].t == t:
                    group.append(runs[position])
                    position += 1
                triples = sorted(x for run in group for x in run.live_triples(evictable))
            else:
                triples = group[0].live_triples(evictable)
            found += (
                (t, neg_offset, release, block)
                for neg_offset, release, block in islice(triples, wanted - len(found))
            )
        return found

    def compact(self, evictable: Evictable) -> None:
        """Drop every stale position (order kept)."""
        kept: deque[Run] = deque()
        for run in self.runs:
            self._forget(run)
            live = run.compacted(evictable)
            if live is not None:
                kept.append(live)
                if self.tails is not None:
                    self.tails[live.releases[-1]] = live
        self.runs = kept
        self.stale_dropped = 0


class ZeroQueue:
    """``wa-ref``: a category's blocks stamped 0 at one offset. Their keys differ only in
    the release number, so release order is key order. Flat lists read from ``at``."""

    __slots__ = ("at", "blocks", "neg_offset", "releases")

    def __init__(self, neg_offset: int) -> None:
        self.neg_offset = neg_offset
        self.blocks: list[int] = []
        self.releases: list[int] = []
        self.at = 0

    def add(self, block: int, release: int) -> None:
        self.blocks.append(block)
        self.releases.append(release)

    def head(self, evictable: Evictable) -> Entry | None:
        self.at = skip_stale(evictable, self.blocks, self.releases, self.at)
        self.trim()
        at = self.at
        if at >= len(self.blocks):
            return None
        return (0.0, self.neg_offset, self.releases[at], self.blocks[at])

    def take(self, evictable: Evictable, cutoff: Cutoff, limit: int) -> list[int]:
        (log_constant, rate), now, threshold, floor = cutoff
        if floor is not None and not log_constant - rate * (now - 0.0) < floor:
            return []
        stop = len(self.blocks)
        if threshold is not None:
            head = (log_constant - rate * (now - 0.0), 0.0, self.neg_offset)
            if head > tuple(threshold[:3]):
                return []
            if head == tuple(threshold[:3]):
                stop = bisect_left(self.releases, threshold[3], self.at)
        blocks, releases = self.blocks, self.releases
        victims: list[int] = []
        at = self.at
        while at < stop and len(victims) < limit:
            end = min(stop, at + limit - len(victims))
            chunk = blocks[at:end]
            victims += compress(chunk, map(eq, map(evictable.get, chunk), releases[at:end]))
            at = end
        self.at = at
        deque(map(evictable.__delitem__, victims), maxlen=0)
        return victims

    def trim(self) -> None:
        if self.at > _TRIM and 2 * self.at > len(self.blocks):
            del self.blocks[: self.at]
            del self.releases[: self.at]
            self.at = 0

    def compact(self, evictable: Evictable) -> None:
        """Drop every stale entry (order kept)."""
        blocks, releases = self.blocks[self.at :], self.releases[self.at :]
        flags = list(map(eq, map(evictable.get, blocks), releases))
        self.blocks = list(compress(blocks, flags))
        self.releases = list(compress(releases, flags))
        self.at = 0

"""Machinery shared by the workload-aware evictors ``wa`` and ``wa-ref``.

Owns the victim order both follow (defined below), the category name table, the
per-category constants cache, the block bookkeeping and the eviction loop that compares
only queue heads (the queues live in ``agent.policies.wa_queue``). It must never do I/O,
read settings or register a policy: ``wa.py`` and ``wa_ref.py`` decide how blocks are
stamped and which queue they join.

Victim order (a device evictor must reproduce it exactly)
---------------------------------------------------------
Every evictable block carries its category code ``w``, its last access time ``t`` (on
the policy's clock, below), its prompt offset ``o`` and its release number ``q`` (one
counter over every block ever freed, in release order; a block freed again gets a new
number, and a block named twice in one ``free`` keeps its last occurrence). A category's
parameters give the constant, computed once on the CPU by ``log_weight`` and used as is
by any device evictor::

    lc_w = log(p_w) + log(-expm1(-a_w * L_w))        (-inf when p_w = 0)

so that ``lc_w - a_w * d`` is ``log ReuseProb`` of POLICY.md for a block idle ``d``.
The policy's clock ``now`` is the largest ``now`` any ``touch`` or ``free`` has passed
(``evict`` takes no time: it uses the clock). The eviction key is the tuple::

    (lc_w - a_w * (now - t),  t,  -o,  q)

compared lexicographically in IEEE double precision, the first element computed exactly
in that order of operations; the smallest is evicted first. In words: least likely to be
reused within the life window first; on an exact tie the longer-idle block; then the block
further into its prompt (POLICY.md's tail-first rule); then the block released first.

Why ``t`` comes before ``-o``: within one category the first element never decreases as
``t`` grows, so ordering a category's queue by ``(t, -o, q)`` makes its head that
category's minimum, even when scores tie exactly (``p_w = 0`` gives ``-inf`` for every
block; very different ages can round to the same double). With POLICY.md's bare
``(ReuseProb, -offset)`` such ties would need every block of the category compared. The
two orders differ only on exact score ties between different access times.

Time: ``now`` is the caller's float seconds; accesses reported with an older ``now`` than
the clock (a late ``free``) are stamped with the clock, so a queue's stamps never go back.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from heapq import heappop, heappush
from itertools import count, groupby, islice, repeat
from operator import ge, neg
from typing import Generic, Literal, Protocol, TypeVar

import numpy as np

from agent.policies.wa_queue import Entry, Evictable, Key
from agent.policy_document import CategoryParams, PolicyDocument

Const = tuple[float, float]
"""``(lc_w, a_w)`` of one category code."""
Attribution = Literal["creator", "last"]

COMPACT_SLACK = 1 << 16
"""Compact the queues once stale entries exceed the evictable blocks by this many."""


def log_weight(p: CategoryParams) -> Const:
    """``(lc, a)`` of a category: ``lc = log(p_w) + log(1 - exp(-a_w * L_w))``."""
    window = -math.expm1(-p.rate * p.life_s)
    if p.p_reuse <= 0.0 or window <= 0.0:
        return (-math.inf, p.rate)
    return (math.log(p.p_reuse) + math.log(window), p.rate)


def entries_of(
    blocks: Sequence[int], offsets: Sequence[int], t: float, seq0: int
) -> tuple[list[Entry], bool]:
    """The entries of ``blocks`` stamped ``t``, numbered from ``seq0``, and whether they
    are in key order (offsets never increase: a request freed tail first)."""
    if len(offsets) != len(blocks):
        raise ValueError(f"{len(blocks)} blocks but {len(offsets)} offsets")
    negs: Iterable[int]
    if isinstance(offsets, range):
        negs = range(-offsets.start, -offsets.stop, -offsets.step)
        ordered = offsets.step < 0 or len(offsets) <= 1
    else:
        negs = map(neg, offsets)
        ordered = all(map(ge, offsets, islice(offsets, 1, None)))
    return list(zip(repeat(t), negs, count(seq0), blocks)), ordered


def runs(keys: list[int]) -> Iterator[tuple[int, int, int]]:
    """``(key, lo, hi)`` of each stretch of equal consecutive ``keys``."""
    if keys.count(keys[0]) == len(keys):
        yield keys[0], 0, len(keys)
        return
    lo = 0
    for key, group in groupby(keys):
        hi = lo + sum(1 for _ in group)
        yield key, lo, hi
        lo = hi


class Lane(Protocol):
    """One category's blocks, as the eviction loop sees them."""

    idx: int
    """The category's row in the evictor's arrays."""

    def head(self, ev: Evictable) -> Entry | None:
        """The category's minimum live entry (``None`` when empty)."""

    def take(
        self, ev: Evictable, lc: float, a: float, now: float, thr: Key | None, limit: int
    ) -> list[int]:
        """Pop up to ``limit`` blocks, from the head on, with keys below ``thr`` (all of
        them, up to ``limit``), removing them from ``ev``. Called right after ``head``."""

    def compact(self, ev: Evictable) -> None:
        """Drop stale entries."""


LaneT = TypeVar("LaneT", bound=Lane)


class WACore(Generic[LaneT]):
    """The parts of a workload-aware evictor that do not depend on how blocks are
    stamped: category table, parameters, clock, block bookkeeping, ``touch``, ``evict``.

    Subclasses implement ``free``, ``_new_lane`` and ``_const_of``.

    Eviction: each category (lane) has a row holding ``lc``, ``a`` and ``t0``, a lower
    bound of its head's stamp (NaN when found empty). One vectorised pass gives every
    category a lower bound of its head's score, ``lc - a (now - t0)``, exact when ``t0``
    is the head's stamp (the same IEEE operations as the key). Categories are pulled in
    order of bound, each head checked and keyed exactly, until the next bound exceeds the
    two best exact keys; the best category then loses blocks until its head passes the
    second best, and the loop goes on. A call thus keys a few heads, not W.
    """

    __slots__ = (
        "_a",
        "_buf",
        "_by_creator",
        "_clock",
        "_codes",
        "_consts_stale",
        "_creator",
        "_doc",
        "_ev",
        "_in_use",
        "_kc",
        "_lanes",
        "_lc",
        "_names",
        "_rows",
        "_seq",
        "_stale",
        "_t0",
    )

    def __init__(
        self,
        *,
        category_names: Sequence[str],
        doc: PolicyDocument,
        attribution: Attribution,
        clock: float,
    ) -> None:
        if attribution not in ("creator", "last"):
            raise ValueError(f"attribution must be 'creator' or 'last', got {attribution!r}")
        self._by_creator = attribution == "creator"
        self._names: list[str] = []
        self._codes: dict[str, int] = {}
        self._kc: list[Const] = []  # row -> (lc, a)
        self._doc = doc
        self._clock = clock
        self._ev: Evictable = {}
        self._in_use: set[int] = set()
        self._creator: dict[int, int] = {}  # cached block -> its creator's code
        self._lanes: dict[int, LaneT] = {}  # code -> lane
        self._rows: list[tuple[int, LaneT]] = []  # row -> (code, lane)
        # One row per lane, sized exactly (lanes are added rarely).
        self._lc = np.zeros(0)
        self._a = np.zeros(0)
        self._t0 = np.zeros(0)
        self._buf = np.zeros(0)
        self._consts_stale = False
        self._seq = 0
        self._stale = 0  # stale entries made since the last compaction (an upper bound)
        for name in category_names:
            self.add_category(name)

    # --- parameters and categories -------------------------------------------------------
    @property
    def policy(self) -> PolicyDocument:
        """The parameter document in force."""
        return self._doc

    @property
    def attribution(self) -> Attribution:
        return "creator" if self._by_creator else "last"

    @property
    def category_names(self) -> tuple[str, ...]:
        """Code -> name: ``category_names[code]``."""
        return tuple(self._names)

    def set_policy(self, doc: PolicyDocument) -> None:
        """Use ``doc`` from the next eviction on. Queues are per category and ordered by
        time, so no block is re-keyed: only the W heads are compared anew."""
        if not isinstance(doc, PolicyDocument):
            raise TypeError(f"expected a PolicyDocument, got {type(doc).__name__}")
        self._doc = doc
        self._consts_stale = True

    def add_category(self, name: str) -> int:
        """The code of category ``name``, given the next free code on first sight. Codes
        passed to ``free`` that name no category get the unknown-category treatment."""
        code = self._codes.get(name)
        if code is None:
            code = self._codes[name] = len(self._names)
            self._names.append(name)
            self._consts_stale = self._consts_stale or code in self._lanes
        return code

    def _const_of_code(self, code: int) -> Const:
        name = self._names[code] if 0 <= code < len(self._names) else None
        return self._const_of(name)

    def _const_of(self, name: str | None) -> Const:
        """``(lc, a)`` of category ``name`` (``None``: a code with no name)."""
        raise NotImplementedError

    def _refresh_consts(self) -> None:
        for row, (code, _) in enumerate(self._rows):
            c = self._kc[row] = self._const_of_code(code)
            self._lc[row], self._a[row] = c
        self._consts_stale = False

    def _new_lane(self, row: int) -> LaneT:
        raise NotImplementedError

    def _lane(self, code: int) -> LaneT:
        lane = self._lanes.get(code)
        if lane is None:
            row = len(self._rows)
            lane = self._lanes[code] = self._new_lane(row)
            self._rows.append((code, lane))
            lc, a = c = self._const_of_code(code)
            self._kc.append(c)
            self._lc = np.append(self._lc, lc)
            self._a = np.append(self._a, a)
            self._t0 = np.append(self._t0, math.nan)
            self._buf = np.zeros(row + 1)
        return lane

    # --- bookkeeping shared by free ---------------------------------------------------------
    def _tick(self, now: float) -> float:
        if now > self._clock:
            self._clock = float(now)
        return self._clock

    def _release(self, blocks: Sequence[int], entries: list[Entry]) -> None:
        """``blocks`` become evictable with ``entries``; an earlier entry of any of them
        (evictable before, or named twice) goes stale."""
        ev = self._ev
        self._in_use.difference_update(blocks)
        n0 = len(ev)
        ev.update(zip(blocks, entries, strict=True))
        self._seq += len(blocks)
        self._stale += len(blocks) - (len(ev) - n0)
        if self._stale > len(ev) + COMPACT_SLACK:
            self._compact()

    def _compact(self) -> None:
        for lane in self._lanes.values():
            lane.compact(self._ev)
        self._stale = 0

    def _codes_of(self, blocks: Sequence[int], category: int) -> list[int]:
        """Each block's creator's code (setting it for new blocks)."""
        return list(map(self._creator.setdefault, blocks, repeat(category)))

    def _note(self, lane: LaneT, t: float) -> None:
        """``lane`` received blocks stamped ``t``: keep ``t0`` a lower bound of its head
        (NaN: the lane was found empty)."""
        if not self._t0[lane.idx] <= t:
            self._t0[lane.idx] = t

    # --- the Protocol ----------------------------------------------------------------------
    def touch(self, blocks: Sequence[int], now: float) -> None:
        self._tick(now)
        ev = self._ev
        n0 = len(ev)
        deque(map(ev.pop, blocks, repeat(None)), maxlen=0)
        self._stale += n0 - len(ev)
        self._in_use.update(blocks)

    def evict(self, n: int) -> list[int]:
        """Remove and return up to ``n`` victims in key order, at the clock's time."""
        victims: list[int] = []
        ev = self._ev
        if n <= 0 or not ev:
            return victims
        if self._consts_stale:
            self._refresh_consts()
        now = self._clock
        k = len(self._rows)
        t0, buf = self._t0, self._buf
        # lc - a (now - t0), in place; NaN rows (empty categories) stay quiet, sort last.
        np.subtract(now, t0, out=buf)
        np.multiply(self._a, buf, out=buf)
        np.subtract(self._lc, buf, out=buf)
        order = buf.argsort().tolist()
        bound = buf.tolist()
        rows, kc = self._rows, self._kc
        active: list[Key] = []
        pos = 0
        remaining = n
        while remaining:
            # Key heads exactly, best bound first, until the next bound is above the two
            # best keys (a NaN bound belongs to an empty category: stop there too).
            while pos < k:
                row = order[pos]
                if len(active) >= 2:
                    second = active[1][0] if len(active) == 2 else min(active[1][0], active[2][0])
                    if not bound[row] <= second:
                        break
                pos += 1
                e = rows[row][1].head(ev)
                if e is None:
                    t0[row] = math.nan
                    continue
                lc, a = kc[row]
                heappush(active, (lc - a * (now - e[0]), e[0], e[1], e[2], row))
            if not active:
                break
            row = heappop(active)[4]
            lane = rows[row][1]
            lc, a = kc[row]
            # This category holds the smallest key: evict until its head passes thr.
            got = lane.take(ev, lc, a, now, active[0] if active else None, remaining)
            victims += got
            remaining -= len(got)
            e = lane.head(ev)
            if e is None:
                t0[row] = math.nan
            else:
                heappush(active, (lc - a * (now - e[0]), e[0], e[1], e[2], row))
        for key in active:
            t0[key[4]] = key[1]
        if self._by_creator:
            deque(map(self._creator.__delitem__, victims), maxlen=0)
        return victims

    def __len__(self) -> int:
        return len(self._ev) + len(self._in_use)

    def __contains__(self, block: object) -> bool:
        return block in self._ev or block in self._in_use

"""Machinery shared by the workload-aware evictors ``wa`` and ``wa-ref``.

Owns the victim order both follow (defined below), the category name table, the
per-category constants cache, the block bookkeeping and the eviction loop that compares
only queue heads (the queues live in ``agent.policies.wa_queue``). It must never do I/O,
read settings or register a policy: ``wa.py`` (and the replay-only reference,
``controlplane.replay.reference.wa_ref``) decide how blocks are stamped and which queue
they join.

Victim order (a device evictor must reproduce it exactly)
---------------------------------------------------------
Every evictable block carries its category code ``w``, its last access time ``t`` (on
the policy's clock, below), its prompt offset ``o`` and its release number ``q`` (one
counter over every block ever freed, in release order; a block freed again gets a new
number, and a block named twice in one ``free`` keeps its last occurrence). A category's
parameters give the constant, computed once on the CPU by ``log_weight`` and used as is
by any device evictor::

    lc_w = log(p_w) + log(-expm1(-a_w * L_w))        (-inf when p_w = 0)

so that ``lc_w - a_w * d`` is the log of ``ReuseProb = p (1 - e^{-a L}) e^{-a d}``, the
chance that a block idle ``d`` seconds is reused within its category's life window
(docs/architecture.md, "A worked timeline"). A document any of whose constants is not
worked out in the float range, or does not order blocks (``a_w`` positive and finite,
``lc_w`` below infinity), is refused when it is given, never at an eviction
(``checked_const``).
The policy's clock ``now`` is the largest ``now`` any ``touch`` or ``free`` has passed
(``evict`` takes no time: it uses the clock). The eviction key is the tuple::

    (lc_w - a_w * (now - t),  t,  -o,  q)

compared lexicographically in IEEE double precision, the first element computed exactly
in that order of operations; the smallest is evicted first. In words: least likely to be
reused within the life window first; on an exact tie the longer-idle block; then the block
further into its prompt (ties go to the tail: docs/architecture.md, "A worked timeline");
then the block released first.

Why ``t`` comes before ``-o``: within one category the first element never decreases as
``t`` grows, so ordering a category's queue by ``(t, -o, q)`` makes its head that
category's minimum, even when scores tie exactly (``p_w = 0`` gives ``-inf`` for every
block; very different ages can round to the same double). With a bare
``(ReuseProb, -offset)`` key such ties would need every block of the category compared. The
two orders differ only on exact score ties between different access times.

Time: ``now`` is the caller's float seconds; accesses reported with an older ``now`` than
the clock (a late ``free``) are stamped with the clock, so a queue's stamps never go back.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from heapq import heappop, heappush
from itertools import groupby, repeat
from typing import ClassVar, Generic, Literal, NamedTuple, Protocol, TypeVar

import numpy as np

from agent.policies.handover import Handover, drain
from agent.policies.wa_queue import Const as Const
from agent.policies.wa_queue import Cutoff, Entry, Evictable, Key, Run, Tails, retire_tails
from agent.policy_document import BUILTIN_POLICY, CategoryParams, PolicyDocument

ADOPTED_CODE = -1
"""The category code of blocks adopted from a baseline at a family switch: it names no
category, so they get the document's default curve."""
Attribution = Literal["creator", "last"]

COMPACT_SLACK = 1 << 16
"""Compact the queues once the stale positions held exceed the evictable blocks by this
many, recounted (less those the lanes passed over at their heads) and still by half as
many."""
REFRESH_AFTER_HEADS = 6
"""Recompute every category's bound once an eviction keyed this many heads (a cost
setting only: the victims are the same whatever it is)."""


def log_weight(p: CategoryParams) -> Const:
    """``(lc, a)`` of a category: ``lc = log(p_w) + log(1 - exp(-a_w * L_w))``."""
    window = -math.expm1(-p.rate * p.life_s)
    if p.p_reuse <= 0.0 or window <= 0.0:
        return (-math.inf, p.rate)
    return (math.log(p.p_reuse) + math.log(window), p.rate)


ArgT = TypeVar("ArgT")


def curve_label(name: str | None) -> str:
    """How a refusal names the curve of category ``name`` (``None``: the default)."""
    return "the default curve" if name is None else f"category {name!r}"


def checked_const(label: str, const_of: Callable[[ArgT], Const], arg: ArgT) -> Const:
    """``const_of(arg)``, refused with a ``ValueError`` naming ``label`` unless it orders
    blocks: worked out in the float range, a rate positive and finite, a log constant
    below infinity (``-inf`` is a category never reused)."""
    try:
        log_constant, rate = const_of(arg)
    except ArithmeticError as exc:  # a curve past the float range (math.expm1)
        raise ValueError(f"{label}: {exc}") from exc
    if not (0.0 < rate < math.inf and log_constant < math.inf):
        raise ValueError(f"{label}: rate {rate} and log constant {log_constant} order no blocks")
    return log_constant, rate


class Freed(NamedTuple):
    """The blocks one ``free`` files: stamped ``t``, numbered ``releases`` (the very int
    objects the evictable map will hold)."""

    t: float
    blocks: Sequence[int]
    offsets: Sequence[int]
    releases: list[int]

    def whole(self) -> Run:
        """All of them, as one queue ``Run``."""
        return Run.numbered(self.t, self.blocks, self.offsets, self.releases)

    def part(self, lo: int, hi: int) -> Run:
        """Blocks ``lo:hi`` of them, as a ``Run``."""
        return Run.numbered(self.t, self.blocks[lo:hi], self.offsets[lo:hi], self.releases[lo:hi])


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

    def head(self, evictable: Evictable) -> Entry | None:
        """The category's minimum live entry (``None`` when empty)."""

    def take(self, evictable: Evictable, cutoff: Cutoff, limit: int) -> list[int]:
        """Pop up to ``limit`` blocks, from the head on, with keys below ``cutoff``'s
        threshold (all of them, up to ``limit``, when it is ``None``) and scores below its
        floor (when it has one), removing them from ``evictable``. Called right after
        ``head``."""

    def compact(self, evictable: Evictable) -> None:
        """Drop stale entries."""


LaneT = TypeVar("LaneT", bound=Lane)


class WACore(Generic[LaneT]):
    """The parts of a workload-aware evictor that do not depend on how blocks are
    stamped: category table, parameters, clock, block bookkeeping, ``touch``, ``evict``.

    Subclasses implement ``_file``, ``_new_lane`` and ``_const_of``.

    Eviction: each category (lane) has a row holding ``lc``, ``a`` and ``t0``, a lower
    bound of its head's stamp (NaN when found empty), so ``lc - a (T - t0)`` is a lower
    bound of its head's score at any ``now <= T``, exact when ``t0`` is the head's stamp
    and ``T`` is ``now`` (the same IEEE operations as the key, each monotone, so no
    rounding margin is needed). Categories are pulled in order of bound, each head checked
    and keyed exactly, only while the best key is not below the next bound (the floor);
    the best category then loses blocks while they stay below the second best key and the
    floor, and the loop goes on. A call thus keys a few heads, not W.

    The bounds of all W rows (one vectorised pass and a sort) are not recomputed on every
    call: a pass is made for a time ``T`` ahead of the clock (``BOUNDS_AHEAD`` times the
    time since the previous pass), and serves every call until the clock passes ``T``. A fresh
    pass is made sooner when a row's bound may have dropped below its cached one (an empty
    category refilled, parameters or rows changed) or when the last call keyed many heads.
    With a single category there is nothing to compare: its queue is drained directly.
    """

    __slots__ = (
        "_a",
        "_bound",
        "_bound_order",
        "_bound_time",
        "_bounded",
        "_bounds_valid",
        "_buf",
        "_by_creator",
        "_clock",
        "_codes",
        "_constants",
        "_consts_stale",
        "_creator",
        "_doc",
        "_ev",
        "_heads_keyed",
        "_in_use",
        "_lanes",
        "_lc",
        "_names",
        "_refreshed_at",
        "_rows",
        "_seq",
        "_stale",
        "_t0",
        "_tails",
    )

    START_CLOCK: ClassVar[float] = -math.inf
    """The clock before the first ``touch`` or ``free``."""
    ATTRIBUTIONS: ClassVar[tuple[Attribution, ...]] = ("last", "creator")
    """The attributions this evictor follows, its default first."""
    BOUNDS_AHEAD: ClassVar[float] = 1.0
    """A pass over the bounds is made for a time this many times the time since the
    previous pass ahead of the clock (a cost setting only: farther ahead, fewer passes,
    looser bounds, more heads keyed per call)."""

    def __init__(
        self,
        capacity: int = 0,
        *,
        category_names: Sequence[str] = (),
        doc: PolicyDocument = BUILTIN_POLICY,
        attribution: Attribution | None = None,
    ) -> None:
        chosen = self.ATTRIBUTIONS[0] if attribution is None else attribution
        if chosen not in self.ATTRIBUTIONS:
            allowed = " or ".join(map(repr, self.ATTRIBUTIONS))
            raise ValueError(f"attribution must be {allowed}, got {attribution!r}")
        self._by_creator = chosen == "creator"
        self._names: list[str] = []
        self._codes: dict[str, int] = {}
        self._constants: list[Const] = []  # row -> (lc, a)
        self._doc = doc
        self._clock = self.START_CLOCK
        self._ev: Evictable = {}
        # Each queued run's last position (lanes that enter them): a hit retires run tails.
        self._tails: Tails = {}
        self._in_use: set[int] = set()
        self._creator: dict[int, int] = {}  # cached block -> its creator's code
        self._lanes: dict[int, LaneT] = {}  # code -> lane
        self._rows: list[tuple[int, LaneT]] = []  # row -> (code, lane)
        # One row per lane, sized exactly (lanes are added rarely).
        self._lc = np.zeros(0)
        self._a = np.zeros(0)
        self._t0 = np.zeros(0)
        self._buf = np.zeros(0)
        # The last pass over every row's bound: the bounds and the rows in order of bound, the
        # time it was made for, whether it is still a lower bound of every row, and the
        # clock when it was made.
        self._bound: list[float] = []
        self._bound_order: list[int] = []
        self._bound_time = -math.inf
        self._bounded = 0  # the rows before the first NaN bound
        self._refreshed_at = -math.inf
        self._bounds_valid = False
        self._heads_keyed = 0  # heads the last eviction keyed
        self._consts_stale = False
        self._seq = 0
        self._stale = 0  # stale positions held (an upper bound), recounted before compacting
        for name in category_names:
            self.add_category(name)
        self._check_policy(doc)

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
        time, so no block is re-keyed: only the W heads are compared anew. A document
        the victim order cannot use is refused here, having changed nothing
        (``_check_policy``), never in a later ``free`` or ``evict``."""
        self._check_policy(doc)
        self._doc = doc
        self._consts_stale = True

    def _check_policy(self, doc: PolicyDocument) -> None:
        """Raise unless ``doc`` gives a constant that orders blocks (a rate positive and
        finite, a log constant below infinity) to a code with no name, to every category
        named so far and to every category it names (so none named later raises either);
        ``ValueError`` names the category. Nothing changes: the rows take their constants
        at the next eviction, as after any change of names."""
        if not isinstance(doc, PolicyDocument):
            raise TypeError(f"expected a PolicyDocument, got {type(doc).__name__}")
        in_force, self._doc = self._doc, doc  # ``_const_of`` reads the document in force
        try:
            for name in dict.fromkeys([None, *self._names, *doc.categories]):
                checked_const(curve_label(name), self._const_of, name)
        finally:
            self._doc = in_force

    def add_category(self, name: str) -> int:
        """The code of category ``name``, given the next free code on first sight. Codes
        passed to ``free`` that name no category get the unknown-category treatment."""
        code = self._codes.get(name)
        if code is None:
            code = self._codes[name] = len(self._names)
            self._names.append(name)
            self._consts_stale = self._consts_stale or code in self._lanes
        return code

    def name_category(self, code: int, name: str) -> None:
        """Code ``code``, the next one or one given before, stands for category ``name``
        from now on: the name it had is forgotten, and the blocks queued under it are
        judged by ``name``'s parameters from the next eviction on (a controller's shadow
        gives the code of a category it forgot to a new one)."""
        if not 0 <= code <= len(self._names):
            raise ValueError(f"code {code}: neither given nor the next ({len(self._names)})")
        if code == len(self._names):
            self._names.append(name)
        else:
            before = self._names[code]
            if self._codes.get(before) == code:
                del self._codes[before]
            self._names[code] = name
        self._codes[name] = code
        self._consts_stale = self._consts_stale or code in self._lanes

    def _const_of_code(self, code: int) -> Const:
        name = self._names[code] if 0 <= code < len(self._names) else None
        return self._const_of(name)

    def _const_of(self, name: str | None) -> Const:
        """``(lc, a)`` of category ``name`` (``None``: a code with no name)."""
        raise NotImplementedError

    def _refresh_consts(self) -> None:
        for row, (code, _) in enumerate(self._rows):
            constants = self._constants[row] = self._const_of_code(code)
            self._lc[row], self._a[row] = constants
        self._consts_stale = False
        self._bounds_valid = False

    def _new_lane(self, row: int) -> LaneT:
        raise NotImplementedError

    def _lane(self, code: int) -> LaneT:
        lane = self._lanes.get(code)
        if lane is None:
            row = len(self._rows)
            lane = self._lanes[code] = self._new_lane(row)
            self._rows.append((code, lane))
            log_constant, rate = constants = self._const_of_code(code)
            self._constants.append(constants)
            self._lc = np.append(self._lc, log_constant)
            self._a = np.append(self._a, rate)
            self._t0 = np.append(self._t0, math.nan)
            self._buf = np.zeros(row + 1)
            self._bounds_valid = False
        return lane

    # --- bookkeeping shared by free ---------------------------------------------------------
    def free(
        self, blocks: Sequence[int], offsets: Sequence[int], now: float, category: int
    ) -> None:
        """Stamp ``blocks`` at the clock, file them in lanes, then make them evictable."""
        t = self._tick(now)
        if not len(blocks):
            return
        if len(offsets) != len(blocks):
            raise ValueError(f"{len(blocks)} blocks but {len(offsets)} offsets")
        # One int object per release number, shared by the queue and the evictable map.
        releases = list(range(self._seq, self._seq + len(blocks)))
        self._file(Freed(t, blocks, offsets, releases), category)
        self._release(blocks, releases)

    def _file(self, freed: Freed, category: int) -> None:
        """Queue the ``freed`` blocks in the lanes they join (called before they are
        released: the blocks held are those before this call)."""
        raise NotImplementedError

    def _tick(self, now: float) -> float:
        if now > self._clock:
            self._clock = float(now)
        return self._clock

    def _release(self, blocks: Sequence[int], releases: list[int]) -> None:
        """``blocks`` become evictable under ``releases``, the next release numbers; an
        earlier position of any of them (evictable before, or named twice) goes stale."""
        evictable = self._ev
        if self._in_use:
            self._in_use.difference_update(blocks)
        count_before = len(evictable)
        evictable.update(zip(blocks, releases, strict=True))
        self._seq += len(blocks)
        self._stale += len(blocks) - (len(evictable) - count_before)
        if self._stale > len(evictable) + COMPACT_SLACK:
            # Most stale positions may have been passed over at the heads already.
            self._stale -= self._stale_dropped()
            if self._stale > len(evictable) + COMPACT_SLACK // 2:
                self._compact()

    def _stale_dropped(self) -> int:
        """Stale positions the lanes passed over since the last call (0: lanes that do
        not count them; the count of stale positions held then stays an upper bound)."""
        return 0

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
            self._lower_t0(lane.idx, t)

    def _restart_bound(self, row: int, t: float) -> None:
        """Row ``row``'s queue was empty and receives blocks stamped ``t``."""
        if self._t0[row] <= t:
            self._t0[row] = t  # a higher bound: the cached ones still hold
        elif self._bounds_valid and t <= self._bound_time:
            self._bound_refilled(row, t)
        else:
            self._lower_t0(row, t)

    def _bound_refilled(self, row: int, t: float) -> None:
        """Row ``row``, found empty, receives blocks stamped ``t`` (not after the cached
        bounds' time): a cached bound of an earlier head still bounds them (stamps never
        go back); a NaN one (empty at the pass) gets the row's bound at the pass's time,
        put in order, instead of a fresh pass."""
        self._t0[row] = t
        order = self._bound_order
        position = order.index(row)
        if position < self._bounded:
            return
        log_constant, rate = self._constants[row]
        bound = log_constant - rate * (self._bound_time - t)
        del order[position], self._bound[position]
        at = bisect_left(self._bound, bound, 0, self._bounded)
        self._bound.insert(at, bound)
        order.insert(at, row)
        self._bounded += 1

    def _lower_t0(self, row: int, t: float) -> None:
        """Row ``row``'s head may now be stamped as early as ``t``: the cached bounds no
        longer bound it."""
        self._t0[row] = t
        self._bounds_valid = False

    # --- the Protocol ----------------------------------------------------------------------
    def touch(self, blocks: Sequence[int], now: float) -> None:
        self._tick(now)
        evictable = self._ev
        count_before = len(evictable)
        released = list(map(evictable.pop, blocks, repeat(None)))
        # The positions a hit makes stale at run tails go at once: held no longer.
        self._stale += count_before - len(evictable) - retire_tails(self._tails, released)
        self._in_use.update(blocks)

    def discard(self, blocks: Sequence[int]) -> None:
        """``Discards``: ``blocks`` are held no more, evictable or in use (a touch at the
        clock's time takes them out of the queues, as a hit does, and records nothing
        else); stored again, a block is filed by its new creator."""
        self.touch(blocks, self._clock)
        self._in_use.difference_update(blocks)
        if self._by_creator:
            creator = self._creator
            for block in blocks:
                creator.pop(block, None)

    def evict(self, n: int) -> list[int]:
        """Remove and return up to ``n`` victims in key order, at the clock's time."""
        if n <= 0 or not self._ev:
            return []
        if self._consts_stale:
            self._refresh_consts()
        single = len(self._rows) == 1
        victims = self._drain_only_lane(n) if single else self._evict_compared(n)
        if self._by_creator:
            self._forget_creators(victims)
        return victims

    def _forget_creators(self, victims: list[int]) -> None:
        """Evicted, ``victims`` are no longer cached: stored again, a block is filed by
        its new creator."""
        creator = self._creator
        for block in victims:
            del creator[block]

    def _drain_only_lane(self, n: int) -> list[int]:
        """One category: its queue order is the victim order, no score to compare."""
        lane = self._rows[0][1]
        if lane.head(self._ev) is None:
            self._t0[0] = math.nan
            return []
        return lane.take(self._ev, (self._constants[0], self._clock, None, None), n)

    def _refresh_bounds(self, now: float) -> None:
        """Every row's bound at a time ahead of ``now`` (``BOUNDS_AHEAD`` times the time
        since the previous pass), in ascending order, and the rows in that order."""
        ahead = self.BOUNDS_AHEAD * (now - self._refreshed_at)
        at = now + ahead if 0.0 <= ahead < math.inf else now
        self._refreshed_at = now
        self._bound, self._bound_order = self._sorted_bounds(at)
        self._bound_time = at
        self._bounds_valid = True
        # NaN rows (categories found empty) come last: the first of them.
        self._bounded = bisect_left(self._bound, True, key=math.isnan)

    def _sorted_bounds(self, now: float) -> tuple[list[float], list[int]]:
        """Every row's bound ``lc - a (now - t0)`` at ``now`` in ascending order (NaN rows,
        empty categories, last) and the rows in that order: one numpy pass."""
        bound = self._buf
        np.subtract(now, self._t0, out=bound)
        np.multiply(self._a, bound, out=bound)
        np.subtract(self._lc, bound, out=bound)
        order = bound.argsort()
        return bound[order].tolist(), order.tolist()

    def _evict_compared(self, n: int) -> list[int]:
        """Victims from several categories in key order: the best keyed head's queue
        drains while its keys stay below the other keyed heads and below the bound of
        every head not keyed yet (the floor); heads are keyed, in order of bound, only as
        needed."""
        now = self._clock
        if not (
            self._bounds_valid
            and self._heads_keyed < REFRESH_AFTER_HEADS
            and now <= self._bound_time
        ):
            self._refresh_bounds(now)
        evictable, rows, constants, t0 = self._ev, self._rows, self._constants, self._t0
        bound, bounded = self._bound, self._bounded
        active: list[Key] = []
        victims: list[int] = []
        position = 0
        floor = bound[0] if bounded else None
        while len(victims) < n:
            if floor is not None and not (active and active[0][0] < floor):
                position = self._key_heads(active, position, now)
                floor = bound[position] if position < bounded else None
            if not active:
                break
            row = heappop(active)[4]
            lane = rows[row][1]
            log_constant, rate = row_constants = constants[row]
            threshold = active[0] if active else None
            cutoff = (row_constants, now, threshold, floor)
            victims += lane.take(evictable, cutoff, n - len(victims))
            head = lane.head(evictable)
            if head is None:
                t0[row] = math.nan
            else:
                stamp, neg_offset, release, _ = head
                score = log_constant - rate * (now - stamp)
                heappush(active, (score, stamp, neg_offset, release, row))
        for key in active:
            t0[key[4]] = key[1]
        self._heads_keyed = position
        return victims

    def _key_heads(self, active: list[Key], position: int, now: float) -> int:
        """Key heads exactly onto the heap ``active``, rows in order of cached bound from
        ``position`` on (at least one), until the best key is below the next row's bound
        (so below every later row's), or no row with a bound is left. Returns the next
        position."""
        order, bound, constants = self._bound_order, self._bound, self._constants
        rows, evictable, t0, bounded = self._rows, self._ev, self._t0, self._bounded
        while position < bounded:
            row = order[position]
            position += 1
            head = rows[row][1].head(evictable)
            if head is None:
                t0[row] = math.nan
            else:
                log_constant, rate = constants[row]
                stamp, neg_offset, release, _ = head
                score = log_constant - rate * (now - stamp)
                heappush(active, (score, stamp, neg_offset, release, row))
            if position < bounded and active and not bound[position] <= active[0][0]:
                break
        return position

    # --- a family switch (agent.policies.handover) ------------------------------------------
    def hand_over(self) -> Handover:
        handover = drain(self, self._in_use)
        self._creator.clear()
        return handover

    def adopt(self, handover: Handover, now: float) -> None:
        """A baseline's blocks carry no access time, category or offset: the evictable
        ones are freed at ``now`` under ``ADOPTED_CODE`` (the document's default curve),
        all at offset 0, so their release numbers keep the victim order they came in."""
        self._in_use.update(handover.in_use)
        blocks = handover.evictable
        if blocks:
            self.free(blocks, [0] * len(blocks), now, ADOPTED_CODE)

    def __len__(self) -> int:
        return len(self._ev) + len(self._in_use)

    def __contains__(self, block: object) -> bool:
        return block in self._ev or block in self._in_use

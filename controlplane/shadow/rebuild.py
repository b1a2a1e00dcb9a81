"""Requests rebuilt from a worker's event stream, and the sample of them the shadow keeps.

Owns ``RequestRebuilder`` (one per worker) and ``CategoryTable`` (category names to the
shadow's own codes, shared by every worker). An agent that reports requests whole (its
heartbeat says so) records a request as a run of events with one time and one category:
HIT events for the cached blocks it touched (prompt offsets ascending), then INSERT events
for the blocks it computed, released tail first (offsets descending); EVICT events carry
no access and are skipped. A new request starts where the time or the category changes,
where a HIT follows an INSERT, or where the offsets stop ascending (HITs) or descending
(INSERTs). A run whose offsets are not exactly ``0 .. n-1`` is split once where its HITs
turn into INSERTs (two requests with the same time and category, the first all hits); if
that does not make it whole it is either a continuation (INSERTs only, none at offset 0:
blocks a request filled while it decoded, which a later prompt will hold) or dropped and
counted as incomplete (events lost on the way, or an engine that reports a request's hits
and its inserts at different times). A worker's access events are gathered over several
batches (``min_events``) and rebuilt together, vectorised; the last run of what is
rebuilt may go on in the next batch: it is held until then, unless it is longer than
``MAX_HELD_EVENTS``: it is then closed as it stands (what follows starts a new run), so a
stream whose run never ends holds no more than that. Only the sampled requests become
Python objects. It must never replay or decode wire data.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from agent.category_table import base_name, reused_name
from agent.wire import BatchLimits, EventBatch, EventKind, RawEvents
from controlplane.shadow.sampler import PrefixSampler

HIT = int(EventKind.HIT)
INSERT = int(EventKind.INSERT)
EVICT = int(EventKind.EVICT)
MAX_HELD_EVENTS = BatchLimits().max_events
"""Events of an unfinished last run held for the next batch, at most (one entry's worth: a
prompt of over a million tokens at 16 a block). A longer run is closed
as it stands: a request if its offsets are ``0 .. n-1`` (the prompt's first blocks); what
follows is a run of its own (HITs past offset 0: incomplete; INSERTs: a continuation)."""


@dataclass(frozen=True)
class Request:
    """A sampled request: its time, its category code and its blocks in prompt order."""

    ts: float
    category: int
    blocks: list[int]
    seen_hits: int = 0
    """Its prefix hits in the worker's own cache (the leading HIT events)."""
    subtree: int = -1
    """Its key block: the requests through it were sampled with it, or not, together."""


@dataclass(frozen=True)
class Seen:
    """Every whole request of one rebuild, sampled or not: time, the worker's own prefix
    hits and accesses."""

    ts: NDArray[np.float64]
    hits: NDArray[np.int64]
    accesses: NDArray[np.int64]
    sampled: NDArray[np.intp]
    """Where the sampled requests stand among these, in order."""


@dataclass(frozen=True)
class Rebuilt:
    """What one rebuild gave: the sampled requests and counts of everything seen."""

    sampled: list[Request]
    requests: int
    """Whole requests rebuilt (sampled or not)."""
    accesses: int
    """Block accesses of those requests."""
    incomplete: int
    """Runs of events that did not make a whole request (dropped)."""
    seen: Seen | None = None
    continued: int = 0
    """Continuation runs: blocks stored after a request's prompt (skipped, not broken)."""


def _nothing_held(before: float) -> set[int]:
    """No code is held elsewhere (a table whose requests no one keeps)."""
    return set()


class CategoryTable:
    """Category name -> code, given on first use; each category comes with its reuse class
    (``w/re``) right after it, for the miniature caches of workers that file by reuse
    class. ``names[code]`` names a code, each name once.

    With ``forget_after_s``, a category no event used for that long (by the newest event
    time coded) is forgotten when a name not known comes, as the live window ages out the
    categories no bucket counts: its two codes are given again, oldest forgotten first, and
    a name that comes back before they are takes them back. A code ``held`` says requests
    kept elsewhere still carry (events gathered, requests kept, with times before the one
    it is given) is not forgotten. Without it the table only grows (a recorded trace)."""

    def __init__(
        self,
        forget_after_s: float | None = None,
        held: Callable[[float], set[int]] = _nothing_held,
    ) -> None:
        self.names: list[str] = []
        self.forget_after_s = forget_after_s
        self.held = held
        self._codes: dict[str, int] = {}
        """The inverse of ``names``: forgotten names too, until their code is given again."""
        self._forgotten: dict[int, None] = {}
        """Codes to give again, oldest forgotten first."""
        self._used: dict[int, float] = {}
        """Each category's code (not its reuse class's) -> the newest time it was used."""
        self._newest = -math.inf
        self._last: tuple[tuple[str, ...], NDArray[np.int32]] = ((), np.empty(0, np.int32))
        """The last table looked up and its codes (-1: not used yet): an agent sends the
        same one batch after batch."""

    def code(self, name: str) -> int:
        """``name``'s code (a new category gets two: its own, its class's)."""
        code = self._codes.get(name)
        if code is not None and code not in self._forgotten:
            return code
        if code is None and self.forget_after_s is not None:
            self._forget(self._newest - self.forget_after_s)
        for new in dict.fromkeys((base_name(name), reused_name(name))):
            self._give(new)
        return self._codes[name]

    def _give(self, name: str) -> None:
        """A code to ``name``: its own back, a forgotten one, or the next."""
        code = self._codes.get(name)
        if code is not None:
            self._forgotten.pop(code, None)
            return
        if self._forgotten:
            code = next(iter(self._forgotten))
            del self._forgotten[code], self._codes[self.names[code]]
            self.names[code] = name
        else:
            code = len(self.names)
            self.names.append(name)
        self._codes[name] = code

    def _forget(self, before: float) -> None:
        """Forget the categories last used before ``before`` that nothing holds."""
        stale = {code for code, used in self._used.items() if used < before}
        if not stale:
            return
        stale -= self.held(before)
        for code in sorted(stale):
            del self._used[code]
            self._forgotten.update(dict.fromkeys((code, self.reuse_class_code(code))))
        cached = self._last[1]
        cached[np.isin(cached, list(self._forgotten))] = -1

    def reuse_class_code(self, code: int) -> int:
        """The code of the reuse class of the category coded ``code``."""
        return self._codes[reused_name(self.names[code])]

    def knows(self, names: tuple[str, ...], used: NDArray[np.intp]) -> bool:
        """Whether every name of ``names`` at ``used`` has its code already."""
        if names == self._last[0]:
            return bool((self._last[1][used] >= 0).all())
        codes = (self._codes.get(base_name(names[i])) for i in used.tolist())
        return all(code is not None and code not in self._forgotten for code in codes)

    def codes(self, names: tuple[str, ...], used: NDArray[np.intp], at: float) -> NDArray[np.int32]:
        """The code of each of ``names`` (a batch's ``categories``) used by its events
        (``used``: their indices), noted as used at ``at``, as an array (-1: a name not
        used). A reuse class (``w/re``, ``KVWISE_REUSE_CLASSES``) has its category's
        code: a request's HITs and INSERTs then share one category and rebuild into one
        request."""
        if names != self._last[0]:
            self._last = (names, np.full(len(names), -1, np.int32))
        cached = self._last[1]
        self._newest = max(self._newest, at)
        for i in used.tolist():
            if cached[i] < 0:
                cached[i] = self.code(base_name(names[i]))
            self._used[int(cached[i])] = max(self._used.get(int(cached[i]), at), at)
        return cached


_EMPTY = RawEvents(
    np.empty(0, np.float64),
    np.empty(0, np.int64),
    np.empty(0, np.int32),
    np.empty(0, np.int32),
    np.empty(0, np.uint8),
)
"""No held events."""


def _nothing() -> Rebuilt:
    """No request (a fresh one: ``sampled`` is a list the caller may keep)."""
    return Rebuilt([], 0, 0, 0)


def _joined(parts: list[RawEvents]) -> RawEvents:
    """``parts`` one after another, in one set of arrays (no copy for one part)."""
    parts = [part for part in parts if len(part)]
    if not parts:
        return _EMPTY
    if len(parts) == 1:
        return parts[0]
    return RawEvents(
        *(np.concatenate([getattr(part, name) for part in parts]) for name in RawEvents.columns)
    )


class RequestRebuilder:
    """One worker's stream -> its sampled whole requests, a few batches at a time."""

    def __init__(
        self,
        sampler: PrefixSampler,
        table: CategoryTable,
        key_depth: int = 0,
        min_events: int = 1,
    ) -> None:
        self.sampler = sampler
        self.table = table
        self.key_depth = key_depth
        """Offset of the block whose hash decides a request (its last, if shorter)."""
        self.min_events = min_events
        """Access events gathered before they are rebuilt: the passes over them cost about
        the same for a batch of a hundred events as for ten thousand."""
        self._held = _EMPTY
        self._pending: list[RawEvents] = []
        self._pending_events = 0

    def feed(self, batch: EventBatch) -> Rebuilt:
        """The requests ``batch`` completes, once ``min_events`` access events are
        gathered (until then nothing); the last run is held for the next batch."""
        access = batch.kind != EVICT
        category = batch.category[access]
        if len(category):
            codes = category
            if batch.categories:
                at = float(batch.ts[access].max())
                codes = self.table.codes(batch.categories, _used(category), at)[category]
            self._pending.append(
                RawEvents(
                    batch.ts[access],
                    batch.block[access],
                    codes,
                    batch.offset[access],
                    batch.kind[access],
                )
            )
            self._pending_events += len(category)
        if self._pending_events < self.min_events:
            return _nothing()
        return self.drain()

    def brings_new(self, batch: EventBatch) -> bool:
        """Whether ``batch``'s access events use a category with no code yet."""
        category = batch.category[batch.kind != EVICT]
        if not len(category) or not batch.categories:
            return False
        return not self.table.knows(batch.categories, _used(category))

    @property
    def held_events(self) -> int:
        """Access events gathered or held back, not rebuilt yet."""
        return len(self._held) + self._pending_events

    def categories_before(self, before: float) -> set[int]:
        """The category codes of the events gathered or held with times before ``before``."""
        found: set[int] = set()
        for part in (self._held, *self._pending):
            found.update(np.unique(part.category[part.ts < before]).tolist())
        return found

    def drain(self) -> Rebuilt:
        """The requests the gathered events complete (the last run still held, unless it
        is longer than ``MAX_HELD_EVENTS``: then it is closed too)."""
        run = _joined([self._held, *self._pending])
        self._pending.clear()
        self._pending_events = 0
        starts = _starts(run)
        if len(starts) == 0:
            self._held = _EMPTY
            return _nothing()
        last = int(starts[-1])
        if len(run) - last > MAX_HELD_EVENTS:
            self._held = _EMPTY
            return self._requests(run, starts)
        self._held = run.rows(last, len(run))
        return self._requests(run.rows(0, last), starts[:-1])

    def flush(self) -> Rebuilt:
        """The requests of every event gathered and held (at the end of a stream)."""
        run = _joined([self._held, *self._pending])
        self._held, self._pending, self._pending_events = _EMPTY, [], 0
        return self._requests(run, _starts(run))

    def _requests(self, run: RawEvents, starts: NDArray[np.intp]) -> Rebuilt:
        if len(starts) == 0:
            return _nothing()
        whole = _whole(run, starts)
        if not whole.all():
            starts, whole = _split_broken(run, starts, whole)
        counts = np.diff(np.append(starts, len(run)))
        continued = ~whole & _continuations(run, starts)
        group = np.repeat(np.arange(len(starts)), counts)
        at = run.offset == np.minimum(counts - 1, self.key_depth)[group]
        keys = np.zeros(len(starts), dtype=np.int64)
        keys[group[at]] = run.block[at]
        keep = whole & self.sampler.keep(keys)
        # The worker's own prefix hits: HITs come first, offsets ascending, so the k-th
        # HIT of a request is a prefix hit exactly when its offset is k.
        rank = np.arange(len(run)) - np.repeat(starts, counts)
        prefix = (run.kind == HIT) & (run.offset == rank)
        hits = np.bincount(group, weights=prefix, minlength=len(starts)).astype(np.int64)
        seen = Seen(
            run.ts[starts[whole]],
            hits[whole],
            counts[whole].astype(np.int64),
            np.flatnonzero(keep[whole]),
        )
        return Rebuilt(
            sampled=_materialise(run, starts, counts, keep, hits, keys),
            requests=int(whole.sum()),
            accesses=int(counts[whole].sum()),
            incomplete=int(len(whole) - whole.sum() - continued.sum()),
            seen=seen,
            continued=int(continued.sum()),
        )


def _used(category: NDArray[np.int32]) -> NDArray[np.intp]:
    """The category indices ``category`` holds, each once, ascending."""
    return np.flatnonzero(np.bincount(category))


def _starts(run: RawEvents) -> NDArray[np.intp]:
    """Where each request of ``run`` starts (the rules in the module's docstring)."""
    n = len(run)
    if n == 0:
        return np.empty(0, np.intp)
    ts, cat, off, kind = run.ts, run.category, run.offset, run.kind
    prev_hit, hit = kind[:-1] == HIT, kind[1:] == HIT
    new = np.empty(n, np.bool_)
    new[0] = True
    new[1:] = (
        (ts[1:] != ts[:-1])
        | (cat[1:] != cat[:-1])
        | (hit & ~prev_hit)
        | (hit & prev_hit & (off[1:] <= off[:-1]))
        | (~hit & ~prev_hit & (off[1:] >= off[:-1]))
    )
    return np.flatnonzero(new)


def _whole(run: RawEvents, starts: NDArray[np.intp]) -> NDArray[np.bool_]:
    """Per request: whether its offsets are exactly ``0 .. n-1``, each once (every event
    falls on a slot of its request's own, and no slot is taken twice)."""
    counts = np.diff(np.append(starts, len(run)))
    request = np.repeat(np.arange(len(starts)), counts)
    off = run.offset.astype(np.intp)
    in_range = (off >= 0) & (off < counts[request])
    slot = np.where(in_range, starts[request] + off, 0)
    taken = np.bincount(slot[in_range], minlength=len(run))
    once: NDArray[np.bool_] = in_range & (taken[slot] == 1)
    whole: NDArray[np.bool_] = np.logical_and.reduceat(once, starts)
    return whole


def _continuations(run: RawEvents, starts: NDArray[np.intp]) -> NDArray[np.bool_]:
    """Per run: INSERTs only, none at offset 0 (blocks stored after a prompt)."""
    inserts_only: NDArray[np.bool_] = np.logical_and.reduceat(run.kind != HIT, starts)
    past_zero: NDArray[np.bool_] = np.minimum.reduceat(run.offset, starts) > 0
    return inserts_only & past_zero


def _split_broken(
    run: RawEvents, starts: NDArray[np.intp], whole: NDArray[np.bool_]
) -> tuple[NDArray[np.intp], NDArray[np.bool_]]:
    """Split each broken request where its HITs turn into INSERTs, if that makes both
    parts whole (rare: Python per broken request)."""
    ends = np.append(starts, len(run))
    new_starts: list[int] = []
    for i in np.flatnonzero(~whole).tolist():
        lo, hi = int(ends[i]), int(ends[i + 1])
        turns = np.flatnonzero(run.kind[lo + 1 : hi] != run.kind[lo : hi - 1])
        if len(turns) == 1:
            new_starts.append(lo + 1 + int(turns[0]))
    if not new_starts:
        return starts, whole
    merged = np.union1d(starts, np.array(new_starts, dtype=np.intp)).astype(np.intp)
    return merged, _whole(run, merged)


def _materialise(
    run: RawEvents,
    starts: NDArray[np.intp],
    counts: NDArray[np.int64],
    keep: NDArray[np.bool_],
    hits: NDArray[np.int64],
    keys: NDArray[np.int64],
) -> list[Request]:
    """The kept requests as ``Request`` objects, blocks put in prompt order."""
    if not keep.any():
        return []
    events = np.repeat(keep, counts)
    kept_counts = counts[keep]
    base = np.repeat(np.cumsum(kept_counts) - kept_counts, kept_counts)
    ordered = np.empty(int(kept_counts.sum()), dtype=np.int64)
    ordered[base + run.offset[events]] = run.block[events]
    blocks = ordered.tolist()
    bounds = np.append(0, np.cumsum(kept_counts)).tolist()
    firsts = starts[keep]
    ts, cat, seen = run.ts[firsts].tolist(), run.category[firsts].tolist(), hits[keep].tolist()
    subtree = keys[keep].tolist()
    return [
        Request(ts[i], cat[i], blocks[bounds[i] : bounds[i + 1]], seen[i], subtree[i])
        for i in range(len(firsts))
    ]

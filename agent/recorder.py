"""The bounded event buffer between the engine thread and the publisher thread.

Owns two halves of raw events (time, block, category, offset, kind; the rest is resolved
later by ``agent.history`` on the publisher thread): the engine thread appends whole
requests to the active half, each ``record`` call one *run* (its blocks and per-event
offsets go on plain lists, its time, category, kind and any common offset once); the
publisher swaps it for the spare and turns the full one into columns (one numpy pass per
batch, not per call) while the engine keeps appending. Together they never hold more than
``capacity`` events: when the active half is full, new events are dropped and counted,
never waited for. It must never do I/O, block on anything but its own short lock, or
build numpy arrays on the engine thread (an array an engine passes is only read, as
Python ints).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from agent.wire import RAW_COLUMNS, RawEvents

PER_EVENT = math.nan
"""A run's offset when its events carry their own (on the half's ``offsets`` list)."""
_DTYPES = {name: dtype.newbyteorder("=") for name, dtype in RAW_COLUMNS}


def _head(column: Any, k: int) -> Any:
    """The first ``k`` values of a column argument (a scalar stands for all of them)."""
    return column if np.isscalar(column) else column[:k]


def _items(column: Any) -> Any:
    """A column argument's values to extend a list with: an array's as Python ints (one
    C pass; its scalars would each be a numpy object), anything else as it is."""
    return column.tolist() if isinstance(column, np.ndarray) else column


RUN_FIELDS = 5
"""Values per run on ``_Half.runs``: events, ts, category, kind, offset or PER_EVENT."""


class _Half:
    """One half's events, as recorded: per event its block (and its offset, for runs
    without a common one); per run ``RUN_FIELDS`` values, flat on one list (numpy reads
    a flat list of numbers twice as fast as one of tuples)."""

    __slots__ = ("blocks", "offsets", "runs")

    def __init__(self) -> None:
        self.blocks: list[int] = []
        self.offsets: list[int] = []
        self.runs: list[float] = []

    def take(self) -> tuple[RawEvents, int]:
        """The events as ``RawEvents`` columns (fresh arrays), and how many were refused
        (a block id that is not a signed 64-bit integer; a run whose time or offsets are
        not numbers). The half is empty afterwards, whatever it held."""
        blocks, offsets, runs = self.blocks, self.offsets, self.runs
        self.blocks, self.offsets, self.runs = [], [], []
        try:
            return _columns(blocks, offsets, runs)
        except (TypeError, ValueError, OverflowError):  # a time or an offset not a number
            blocks, offsets, runs, unread = _readable_runs(blocks, offsets, runs)
            events, refused = _columns(blocks, offsets, runs)
            return events, refused + unread


def _readable_runs(
    blocks: list[int], offsets: list[int], flat_runs: list[float]
) -> tuple[list[int], list[int], list[float], int]:
    """A half's lists less the runs whose time or offsets numpy cannot read as numbers
    (an engine passed something else), and the events of those: one bad call costs its
    own events, never the half."""
    kept: tuple[list[int], list[int], list[float]] = ([], [], [])
    unread = at_block = at_offset = 0
    for lo in range(0, len(flat_runs), RUN_FIELDS):
        run = flat_runs[lo : lo + RUN_FIELDS]
        k = int(run[0])
        own = offsets[at_offset : at_offset + k] if math.isnan(run[4]) else []
        if _numbers([run[1], *own]):
            kept[0].extend(blocks[at_block : at_block + k])
            kept[1].extend(own)
            kept[2].extend(run)
        else:
            unread += k
        at_block, at_offset = at_block + k, at_offset + len(own)
    return *kept, unread


def _numbers(values: list[Any]) -> bool:
    """Whether numpy reads every one of ``values`` as a float64."""
    try:
        np.array(values, dtype=np.float64)
    except (TypeError, ValueError, OverflowError):
        return False
    return True


def _columns(
    blocks: list[int], offsets: list[int], flat_runs: list[float]
) -> tuple[RawEvents, int]:
    """A half's lists as columns, less the events whose block id is refused; and their
    count."""
    runs = np.array(flat_runs, dtype=np.float64).reshape(-1, RUN_FIELDS)
    counts = runs[:, 0].astype(np.intp)
    per_event = np.isnan(runs[:, 4])
    offset = np.repeat(np.where(per_event, 0.0, runs[:, 4]), counts)
    block, refused = _block_column(blocks)
    cols = {
        "ts": np.repeat(runs[:, 1], counts),
        "block": block,
        "category": np.repeat(runs[:, 2], counts),
        "offset": offset,
        "kind": np.repeat(runs[:, 3], counts),
    }
    if offsets:
        offset[np.repeat(per_event, counts)] = offsets
    kept = slice(None) if refused is None else ~refused
    events = RawEvents(
        **{name: cols[name][kept].astype(_DTYPES[name], copy=False) for name in _DTYPES}
    )
    return events, 0 if refused is None else int(refused.sum())


def _block_column(blocks: list[int]) -> tuple[NDArray[np.int64], NDArray[np.bool_] | None]:
    """The block ids as int64, and which of them were not signed 64-bit integers (None:
    all were; the slow check runs only then)."""
    try:
        return np.array(blocks, dtype=_DTYPES["block"]), None
    except (OverflowError, TypeError, ValueError):
        fits = [type(b) is int and INT64.min <= b <= INT64.max for b in blocks]
        column = np.array([b if ok else 0 for b, ok in zip(blocks, fits, strict=True)])
        return column.astype(_DTYPES["block"]), ~np.array(fits, dtype=bool)


INT64 = np.iinfo(np.int64)


class EventRecorder:
    """Double-buffered runs of events holding at most ``capacity`` events in all.

    ``record`` is for one thread (the engine's); ``drain`` for one other (the publisher).
    ``on_batch`` is called (on the engine thread, once per crossing) when the active half
    reaches ``batch_events``, to wake the publisher early.
    """

    def __init__(
        self,
        capacity: int,
        batch_events: int,
        on_batch: Callable[[], None] | None = None,
    ) -> None:
        if capacity < 2:
            raise ValueError("capacity must be >= 2 (two halves)")
        self.half = capacity // 2
        self.batch_events = max(1, min(batch_events, self.half))
        self._active = _Half()
        self._spare = _Half()
        self._n = 0
        self._lock = threading.Lock()
        self._on_batch = on_batch
        self.recorded = 0
        """Events offered to ``record`` (kept or dropped)."""
        self.dropped = 0
        """Events dropped because the active half was full, or refused when drained (a
        block id that is not a signed 64-bit integer; a time or offset not a number)."""

    def record(
        self,
        kind: int,
        ts: float,
        blocks: Sequence[int] | NDArray[np.int64],
        category: int,
        offsets: Sequence[int] | NDArray[np.int32] | int,
    ) -> int:
        """Append ``len(blocks)`` events sharing ``kind``, ``ts`` and ``category``;
        ``offsets`` is a sequence of that length or a scalar. Returns how many were kept."""
        n = len(blocks)
        if n == 0:
            return 0
        with self._lock:
            self.recorded += n
            lo = self._n
            k = min(n, self.half - lo)
            if k < n:
                self.dropped += n - k
                if k == 0:
                    return 0
                blocks, offsets = blocks[:k], _head(offsets, k)
            # A wrong count is refused before anything is appended: the half stays whole.
            half = self._active
            if isinstance(offsets, (int, np.integer)):
                half.runs += (k, ts, category, kind, float(offsets))
            elif len(offsets) == k:
                half.offsets.extend(_items(offsets))
                half.runs += (k, ts, category, kind, PER_EVENT)
            else:
                raise ValueError(f"{len(offsets)} offsets for {k} events")
            # Lists (what the engine passes) as they are; an array as Python ints.
            half.blocks.extend(blocks if type(blocks) is list else _items(blocks))
            hi = lo + k
            self._n = hi
        if lo < self.batch_events <= hi and self._on_batch is not None:
            self._on_batch()
        return k

    def drain(self) -> RawEvents:
        """Take every recorded event (possibly none), as fresh columns; the engine
        records into the other half meanwhile."""
        with self._lock:
            full, self._active = self._active, self._spare
            self._spare = full  # emptied by ``take`` before the next swap
            self._n = 0
        events, refused = full.take()
        if refused:
            with self._lock:
                self.dropped += refused
        return events

    @property
    def pending(self) -> int:
        """Events waiting in the active half."""
        return self._n

"""The bounded event buffer between the engine thread and the publisher thread.

Owns two preallocated sets of raw columns (time, block, category, offset, kind; the rest
is resolved later by ``agent.history`` on the publisher thread): the engine thread appends
whole requests into the active one by slice assignment; the publisher swaps it for the
spare and reads the full one while the engine keeps appending. Together they never hold
more than ``capacity`` events: when the active half is full, new events are dropped and
counted, never waited for. It must never do I/O, block on anything but its own short
lock, or allocate per event.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from agent.wire import RAW_COLUMNS, RawEvents


def _head(column: Any, k: int) -> Any:
    """The first ``k`` values of a column argument (a scalar stands for all of them)."""
    return column if np.isscalar(column) else column[:k]


def _allocate(n: int) -> RawEvents:
    return RawEvents(*(np.empty(n, dtype.newbyteorder("=")) for _, dtype in RAW_COLUMNS))


class EventRecorder:
    """Double-buffered columns holding at most ``capacity`` events in all.

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
        self._active = _allocate(self.half)
        self._spare = _allocate(self.half)
        self._n = 0
        self._lock = threading.Lock()
        self._on_batch = on_batch
        self.recorded = 0
        """Events offered to ``record`` (kept or dropped)."""
        self.dropped = 0
        """Events dropped because the active half was full."""

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
            hi = lo + k
            cols = self._active
            cols.ts[lo:hi] = ts
            cols.block[lo:hi] = blocks
            cols.category[lo:hi] = category
            cols.offset[lo:hi] = offsets
            cols.kind[lo:hi] = kind
            self._n = hi
        if lo < self.batch_events <= hi and self._on_batch is not None:
            self._on_batch()
        return k

    def drain(self) -> RawEvents:
        """Take every recorded event (possibly none). The returned views stay valid until
        the next ``drain``; the engine records into the other half meanwhile."""
        with self._lock:
            n, full = self._n, self._active
            self._active, self._spare = self._spare, full
            self._n = 0
        return full.rows(0, n)

    @property
    def pending(self) -> int:
        """Events waiting in the active half."""
        return self._n

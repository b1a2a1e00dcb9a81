"""What kvwise costs the engine thread: ``EngineTime``, a sampling meter of kvwise's calls.

Owns the count of kvwise's calls on the engine thread and, for a sample of them (about
one in ``SAMPLE_EVERY``, at random gaps so that a periodic pattern of calls is not always
caught at the same phase), their time (``time.perf_counter_ns``) and the blocks they
handled, all in plain ints. An unsampled call costs one increment and one comparison; a
sampled one two clock reads more. ``EngineTimeSnapshot`` turns the counts into seconds per
call, per block, and an estimate of the total. Each call site times the whole of
kvwise's work inside one engine call, and sites never nest, so no time counts twice.
It must never take a lock, allocate per call, or import anything beyond the standard
library.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

SAMPLE_EVERY = 64
"""One call in this many (on average) is timed."""


@dataclass(frozen=True, slots=True)
class EngineTimeSnapshot:
    """The meter's counts at one moment, since the agent started."""

    calls: int = 0
    """kvwise's calls on the engine thread, all of them."""
    sampled_calls: int = 0
    """Those that were timed."""
    sampled_blocks: int = 0
    """Blocks the timed calls handled (allocated, freed, stored or found cached)."""
    sampled_ns: int = 0
    """Time the timed calls took, in nanoseconds."""

    @property
    def seconds_per_call(self) -> float:
        """Mean time of a timed call (0 before the first)."""
        return self.sampled_ns / self.sampled_calls / 1e9 if self.sampled_calls else 0.0

    @property
    def seconds_per_block(self) -> float:
        """Time of the timed calls per block they handled (0 before the first block)."""
        return self.sampled_ns / self.sampled_blocks / 1e9 if self.sampled_blocks else 0.0

    @property
    def seconds(self) -> float:
        """Estimated engine-thread time of all of kvwise's calls: the sampled mean times
        every call."""
        return self.seconds_per_call * self.calls


class EngineTime:
    """Counts kvwise's engine-thread calls and times a random sample of them.

    At a call site::

        started = meter.begin()
        ...  # kvwise's work
        if started:
            meter.end(started, blocks)
    """

    __slots__ = (
        "_due",
        "_random",
        "_span",
        "calls",
        "sampled_blocks",
        "sampled_calls",
        "sampled_ns",
    )

    def __init__(self, every: int = SAMPLE_EVERY, seed: int | None = None) -> None:
        """``every``: the mean gap between timed calls (1: time them all)."""
        self.calls = 0
        self.sampled_calls = 0
        self.sampled_blocks = 0
        self.sampled_ns = 0
        self._span = max(2 * every - 1, 1)
        self._random = random.Random(seed)
        self._due = self._gap()

    def begin(self) -> int:
        """Count a call; the clock (ns, never 0) if this one is to be timed, else 0."""
        self.calls += 1
        if self.calls != self._due:
            return 0
        self._due = self.calls + self._gap()
        return time.perf_counter_ns() or 1

    def _gap(self) -> int:
        """Calls from one timed call to the next: uniform in ``1..2 * every - 1``."""
        return self._random.randint(1, self._span)

    def end(self, started: int, blocks: int) -> None:
        """A timed call that began at ``started`` is over; it handled ``blocks`` blocks."""
        self.sampled_ns += time.perf_counter_ns() - started
        self.sampled_calls += 1
        self.sampled_blocks += blocks

    def snapshot(self) -> EngineTimeSnapshot:
        """The counts now (read from another thread: each int is read whole; they may be
        one call apart)."""
        return EngineTimeSnapshot(
            self.calls, self.sampled_calls, self.sampled_blocks, self.sampled_ns
        )

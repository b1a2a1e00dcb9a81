"""The sample's share of a worker's recent inflow, which sizes its miniature caches.

Owns ``InflowShare``. A full cache of ``C`` blocks holds mostly the last ``C`` blocks the
worker had to compute (its inflow: a request's accesses less its prefix hits), besides
those it hit since. The sample draws whole prefix subtrees, a few hundred blocks each, so
at any moment the sampled subtrees' part of that inflow is seldom the sampling rate. A
miniature of a fixed ``C x rate`` blocks then holds more, or less, of the sample's recent
blocks than the full cache holds of the traffic's, and its hits drift away from the full
cache's for the very requests it replays (docs/shadow.md measures by how much). Sized by
the sample's measured share of the last ``C`` blocks of inflow instead, it holds about
what the full cache holds (SHARDS adjusts its sampled counts for a like reason). Both
inflows come from the worker's own HIT events, which the rebuild already reads. The share
is kept within a band around the rate (``BAND``). It must never replay requests or know
about policies.
"""

from __future__ import annotations

from bisect import bisect_right

import numpy as np
from numpy.typing import NDArray

KEEP_STEPS = 1024
"""Steps kept at least when old ones are dropped (a capacity learned late still finds
this much history)."""
MAX_STEPS = 32_768
"""Steps kept at most. A capacity of ``C`` blocks needs the last ``C x 4`` (the ladder's
top) blocks of inflow, which requests of a block or two make millions of steps (two
floats in a list each, about 64 bytes). Once half of this many are kept, a step is added
to the last one until it holds ``horizon / (MAX_STEPS / 4)`` blocks: the horizon is read
from at most a quarter of this many steps, and a window's start is placed within one of
them (a share off by at most that step's blocks over the window's)."""
MIN_SEEN = 0.25
"""Until this share of a capacity's inflow has been seen, that capacity keeps the nominal
``capacity x rate``."""
BAND = 4.0
"""The measured share is kept within ``rate / BAND`` and ``rate x BAND`` (and 1): a
sample whose subtrees only hit for a while computes nothing, yet its cached blocks are
still held, as a full cache holds the blocks it hits."""


class InflowShare:
    """Cumulative inflow of all whole requests and of the sampled ones, told in steps:
    each sampled request, and the inflow of the requests between two of them (at most
    ``MAX_STEPS`` kept, however large the horizon)."""

    def __init__(self, rate: float, horizon: int = 0) -> None:
        self.rate = rate
        self.horizon = horizon
        """The largest capacity asked about, in blocks: older inflow is dropped."""
        self._every: list[float] = [0.0]
        self._sampled: list[float] = [0.0]

    def add(self, every: float, sampled: float) -> None:
        """One step: blocks computed by all its whole requests, and by the sampled ones."""
        if every <= 0:
            return
        if len(self._every) >= MAX_STEPS // 2 and self._last_step < self._merged_step:
            self._every[-1] += every
            self._sampled[-1] += sampled
        else:
            self._every.append(self._every[-1] + every)
            self._sampled.append(self._sampled[-1] + sampled)
        if (
            len(self._every) > 2 * KEEP_STEPS
            and self._every[-1] - self._every[KEEP_STEPS] >= self.horizon
        ):
            del self._every[:KEEP_STEPS], self._sampled[:KEEP_STEPS]

    @property
    def _last_step(self) -> float:
        return self._every[-1] - self._every[-2]

    @property
    def _merged_step(self) -> float:
        """The inflow a step gathers, once ``MAX_STEPS / 2`` are kept, before the next."""
        return 4 * self.horizon / MAX_STEPS

    def tell(
        self,
        inflows: NDArray[np.int64],
        sampled_at: NDArray[np.intp],
        sampled_inflows: list[int],
        fulls: list[int],
    ) -> list[list[int]]:
        """Requests in order: each one's inflow, where the sampled ones stand among them
        and theirs. Returns, per sampled request, ``capacity(full)`` for each of
        ``fulls`` as it stands once that request is in: how a stream is cut into batches
        then moves no capacity (``kvwise replay --policy auto`` reads them the same way)."""
        through = np.cumsum(inflows).tolist()  # the inflow through each request
        told = 0  # through the last request told
        capacities: list[list[int]] = []
        for at, own in zip(sampled_at.tolist(), sampled_inflows, strict=True):
            self.add(through[at] - own - told, 0.0)
            self.add(own, own)
            told = through[at]
            if fulls:
                capacities.append([self.capacity(full) for full in fulls])
        if through:
            self.add(through[-1] - told, 0.0)
        return capacities

    @property
    def totals(self) -> tuple[float, float]:
        """The inflow of all whole requests and of the sampled ones, since the start."""
        return self._every[-1], self._sampled[-1]

    def capacity(self, full: int) -> int:
        """The miniature's capacity standing for a full cache of ``full`` blocks (>= 1)."""
        every, sampled = self._every, self._sampled
        seen = min(full, every[-1] - every[0])
        if seen < MIN_SEEN * full or seen <= 0:
            return max(1, round(full * self.rate))
        share = (sampled[-1] - self._sampled_at(every[-1] - seen)) / seen
        share = min(max(share, self.rate / BAND), self.rate * BAND, 1.0)
        return max(1, round(full * share))

    def _sampled_at(self, inflow: float) -> float:
        """The sampled inflow when the whole inflow stood at ``inflow``, read between the
        two steps around it as if each step's blocks came evenly: the window then starts
        where its capacity says, not at a step's edge."""
        every, sampled = self._every, self._sampled
        after = min(bisect_right(every, inflow), len(every) - 1)
        before = max(after - 1, 0)
        span = every[after] - every[before]
        if span <= 0:
            return sampled[before]
        part = (inflow - every[before]) / span
        return sampled[before] + part * (sampled[after] - sampled[before])

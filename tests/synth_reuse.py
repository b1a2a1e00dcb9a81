"""Seeded synthetic access streams with a known reuse model, for the stats and fit tests.

Each block starts at a uniform time in ``[0, horizon_s)``; every access of a block of
category ``c`` is followed by a reuse with probability ``p[c]`` after ``Exp(rate[c])``
seconds (a chain), optionally preceded by a near-concurrent duplicate. Reuses after the
horizon are never seen: the stream ends there, so open accesses are right-censored exactly
as a live window censors them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray


@dataclass(frozen=True, eq=False)
class Stream:
    ts: NDArray[np.float64]
    category: NDArray[np.int32]
    prev_ts: NDArray[np.float64]
    prev_category: NDArray[np.int32]
    gaps: tuple[NDArray[np.float64], ...]
    """Observed reuse gaps per category (what a raw-gap fitter sees)."""

    def __len__(self) -> int:
        return len(self.ts)

    def accesses(self, c: int) -> int:
        return int(np.count_nonzero(self.category == c))


def chain_stream(
    blocks: Sequence[int],
    p: Sequence[float],
    rate: Sequence[float],
    horizon_s: float,
    *,
    seed: int = 0,
    near_prob: float = 0.0,
    near_s: float = 0.0,
) -> Stream:
    """``blocks[c]`` chains of category ``c``; see the module docstring.

    With ``near_prob > 0`` each access is, with that probability, re-accessed again
    ``Uniform(0, near_s)`` seconds later (a near-concurrent duplicate) before its chain
    goes on from the duplicate.
    """
    rng = np.random.default_rng(seed)
    cat = np.repeat(np.arange(len(blocks), dtype=np.int32), blocks)
    t = rng.uniform(0.0, horizon_s, len(cat))
    prev = np.full(len(cat), np.nan)
    cols: list[tuple[NDArray[np.float64], NDArray[np.int32], NDArray[np.float64]]] = []
    p_arr, r_arr = np.asarray(p, np.float64), np.asarray(rate, np.float64)
    while len(t):
        cols.append((t, cat, prev))
        if near_prob > 0:
            dup = rng.random(len(t)) < near_prob
            t_dup = t[dup] + rng.uniform(0.0, near_s, int(dup.sum()))
            ok = t_dup < horizon_s
            cols.append((t_dup[ok], cat[dup][ok], t[dup][ok]))
            t = t.copy()
            t[np.flatnonzero(dup)[ok]] = t_dup[ok]
        reused = rng.random(len(t)) < p_arr[cat]
        t_next = t + rng.exponential(1.0 / r_arr[cat])
        alive = reused & (t_next < horizon_s)
        prev, t, cat = t[alive], t_next[alive], cat[alive]
    ts = np.concatenate([c[0] for c in cols])
    cc = np.concatenate([c[1] for c in cols])
    pts = np.concatenate([c[2] for c in cols])
    order = np.argsort(ts, kind="stable")
    ts, cc, pts = ts[order], cc[order], pts[order]
    pcat = np.where(np.isnan(pts), -1, cc).astype(np.int32)
    gaps = tuple((ts - pts)[(cc == c) & ~np.isnan(pts)] for c in range(len(blocks)))
    return Stream(ts=ts, category=cc, prev_ts=pts, prev_category=pcat, gaps=gaps)

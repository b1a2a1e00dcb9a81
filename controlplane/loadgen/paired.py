"""How sure a comparison of two runs of one trace is: a paired bootstrap over requests.

Owns ``per_request`` (the per-request figures a summary keeps for it) and
``change_intervals``: two runs that sent the same trace (A and B) are paired request by
request (by the trace index), the pairs are drawn with replacement ``DRAWS`` times, and
each draw's relative change of B against A gives, for the hit ratio and TTFT's mean, p50
and p90, a 95 % interval. Pairing removes what the requests themselves contribute (long
prompts are slow in both runs); what is left is the runs' difference plus noise. The
draws treat requests as independent, which requests that queue together are not, so
the interval is a floor on the uncertainty, not the whole of it: repeated runs say the
rest.

A draw is kept as how many times it picked each pair, never as the pairs themselves:
sums are one matrix product of the counts, and a quantile is found in the running sum of
the counts in the order of each run's TTFTs (sorted once), so no draw is sorted. The
picks (seeded: ``seed``) and the estimators (numpy's default linear quantile) are a plain
bootstrap's, pick for pick. It must never do I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from controlplane.loadgen.client import RequestResult

F64 = npt.NDArray[np.float64]

DRAWS: Final = 1000
"""Bootstrap draws of the request pairs."""
ROWS_PER_CHUNK: Final = 50
"""Draws computed at once at most (a chunk holds this many rows of counts)."""
MAX_DRAW_BYTES = 64 << 20
"""Bytes a chunk of draws may take, about: with many pairs a chunk has fewer rows (one
at least)."""
BYTES_PER_DRAWN_PAIR: Final = 40
"""What one pair takes in a chunk of draws: its pick, its count, the counts as floats and
in one run's order, their running sum (30 bytes measured at 100,000 pairs; 40 for
room)."""
MIN_PAIRS: Final = 30
"""Fewer requests in both runs than this: no interval."""
LEVEL: Final = 0.95
QUANTILES: Final = {"ttft_s.p50": 0.5, "ttft_s.p90": 0.9}
"""The TTFT quantiles an interval is drawn for, by summary key."""
KEYS: Final = ("hit_ratio", "ttft_s.mean", *QUANTILES)
"""The summary keys (``compare``'s rows) an interval is drawn for."""


def per_request(results: Sequence[RequestResult]) -> dict[str, list[int] | list[float]]:
    """The finished requests' trace index, TTFT (rounded to the microsecond), prompt and
    cached tokens, as lists (a request the server gave no token counts for has both at 0:
    it counts in neither, as in the summary's hit ratio)."""
    done = [r for r in results if r.ok and r.ttft_s is not None]
    tokens = [_tokens(r) for r in done]
    return {
        "index": [r.index for r in done],
        "ttft_s": [round(r.ttft_s or 0.0, 6) for r in done],
        "prompt_tokens": [prompt for prompt, _ in tokens],
        "cached_tokens": [cached for _, cached in tokens],
    }


def _tokens(r: RequestResult) -> tuple[int, int]:
    if r.prompt_tokens is None or r.cached_tokens is None:
        return 0, 0
    return r.prompt_tokens, r.cached_tokens


def change_intervals(
    a: dict[str, Any] | None, b: dict[str, Any] | None, seed: int = 0
) -> dict[str, tuple[float, float]]:
    """By summary key, the 95 % interval of B's relative change against A; empty when
    either run kept no per-request figures or they share fewer than ``MIN_PAIRS``
    requests. ``a`` and ``b`` are ``per_request``'s dicts as a summary holds them."""
    pairs = _pairs(a, b)
    if pairs is None:
        return {}
    both = _draws(pairs, seed)
    tail = (1 - LEVEL) / 2 * 100
    return {
        key: (float(np.percentile(change, tail)), float(np.percentile(change, 100 - tail)))
        for key, change in both.items()
        if change.size
    }


def _pairs(a: dict[str, Any] | None, b: dict[str, Any] | None) -> tuple[F64, F64] | None:
    """Rows (TTFT, prompt, cached) of A and of B, one column a request both finished."""
    if not a or not b:
        return None
    columns = ("ttft_s", "prompt_tokens", "cached_tokens")
    try:
        index_a = {int(i): n for n, i in enumerate(a["index"])}
        shared = [(index_a[int(i)], n) for n, i in enumerate(b["index"]) if int(i) in index_a]
        if len(shared) < MIN_PAIRS:
            return None
        at_a, at_b = (np.array(side, dtype=np.int64) for side in zip(*shared, strict=True))
        rows_a = np.array([np.asarray(a[c], dtype=np.float64)[at_a] for c in columns])
        rows_b = np.array([np.asarray(b[c], dtype=np.float64)[at_b] for c in columns])
    except (KeyError, TypeError, ValueError, IndexError):
        return None  # a summary written by hand or cut: compared without intervals
    return rows_a, rows_b


class _Run:
    """One run's side of the pairs, laid out for draws given as counts: its columns
    (TTFT, prompt, cached tokens) and its TTFTs in ascending order, with that order."""

    def __init__(self, rows: F64) -> None:
        self.columns = np.ascontiguousarray(rows.T)
        self.order = np.argsort(rows[0], kind="stable")
        self.sorted_ttft = rows[0][self.order]

    def statistics(self, counts: npt.NDArray[np.integer[Any]], floats: F64) -> dict[str, F64]:
        """By key, each draw's statistic: a draw is how many times it took each pair."""
        n = counts.shape[1]
        ttft, prompt, cached = (floats @ self.columns).T
        ratio = np.divide(cached, prompt, out=np.zeros_like(prompt), where=prompt > 0)
        out = {"hit_ratio": ratio, "ttft_s.mean": ttft / n}
        in_order = np.take(counts, self.order, axis=1)
        reached = np.cumsum(in_order, axis=1, dtype=np.min_scalar_type(n))
        for key, q in QUANTILES.items():
            out[key] = self._quantile(reached, q)
        return out

    def _quantile(self, reached: npt.NDArray[np.integer[Any]], q: float) -> F64:
        """numpy's default (linear) quantile of each draw's TTFTs: the draw's sorted value
        ``j`` is the first in ascending order whose running count passes ``j``."""
        h = q * (reached.shape[1] - 1)
        j = int(h)
        at = np.array([np.searchsorted(row, [j, j + 1], side="right") for row in reached])
        low = self.sorted_ttft[at[:, 0]]
        high = self.sorted_ttft[np.minimum(at[:, 1], len(self.order) - 1)]
        t = h - j  # numpy's lerp, from the nearer end
        value: F64 = low + (high - low) * t if t < 0.5 else high - (high - low) * (1 - t)
        return value


def _draws(pairs: tuple[F64, F64], seed: int) -> dict[str, F64]:
    """By key, ``DRAWS`` relative changes of the statistic, B against A (draws where A's
    is 0 are left out). Each draw picks the pairs as a plain bootstrap does, then
    counts the picks: sums and quantiles of the drawn pairs come from the counts (one
    matrix product, one running sum in each run's order), never sorting a draw."""
    run_a, run_b = (_Run(rows) for rows in pairs)
    rng = np.random.default_rng(seed)
    n, changes = pairs[0].shape[1], {key: list[F64]() for key in KEYS}
    rows = max(1, min(ROWS_PER_CHUNK, MAX_DRAW_BYTES // (BYTES_PER_DRAWN_PAIR * n)))
    for start in range(0, DRAWS, rows):
        picks = rng.integers(0, n, size=(min(rows, DRAWS - start), n))
        picks += np.arange(len(picks))[:, None] * n
        wide = np.bincount(picks.ravel(), minlength=picks.size).reshape(picks.shape)
        del picks
        floats = wide.astype(np.float64)
        # A pair is rarely drawn more than a dozen times: the narrowest type that holds
        # the counts makes the reorderings and running sums below a fraction of the work.
        counts: npt.NDArray[np.integer[Any]] = wide.astype(np.min_scalar_type(wide.max()))
        del wide
        of_a, of_b = run_a.statistics(counts, floats), run_b.statistics(counts, floats)
        for key, seen in changes.items():
            kept = of_a[key] != 0
            seen.append((of_b[key][kept] - of_a[key][kept]) / of_a[key][kept])
    return {key: np.concatenate(seen) for key, seen in changes.items()}

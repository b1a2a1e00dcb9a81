"""How sure a comparison of two runs of one trace is: a paired bootstrap over requests.

Owns ``per_request`` (the per-request figures a summary keeps for it) and
``change_intervals``: two runs that sent the same trace (A and B) are paired request by
request (by the trace index), the pairs are drawn with replacement ``DRAWS`` times, and
each draw's relative change of B against A gives, for the hit ratio and TTFT's mean, p50
and p90, a 95 % interval. Pairing removes what the requests themselves contribute (long
prompts are slow in both runs); what is left is the runs' difference plus noise. The
draws treat requests as independent, which requests that queue together are not, so
the interval is a floor on the uncertainty, not the whole of it: repeated runs say the
rest. It must never do I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from controlplane.loadgen.client import RequestResult

F64 = npt.NDArray[np.float64]

DRAWS: Final = 1000
"""Bootstrap draws of the request pairs."""
ROWS_PER_CHUNK: Final = 50
"""Draws computed at once at most (a chunk holds this many rows of the pairs)."""
MAX_DRAW_BYTES = 64 << 20
"""Bytes a chunk of draws may take, about: with many pairs a chunk has fewer rows (one
at least)."""
BYTES_PER_DRAWN_PAIR: Final = 48
"""What one drawn pair takes in a chunk: its pick, the drawn columns of both runs and a
quantile's working copy (measured)."""
MIN_PAIRS: Final = 30
"""Fewer requests in both runs than this: no interval."""
LEVEL: Final = 0.95

Statistic = Callable[[F64, F64, F64], F64]
"""Per row of drawn pairs (TTFT, prompt tokens, cached tokens; one row a draw): the
statistic of each draw."""


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


def _hit_ratio(ttft: F64, prompt: F64, cached: F64) -> F64:
    prompts: F64 = prompt.sum(axis=1)
    ratios: F64 = np.divide(
        cached.sum(axis=1), prompts, out=np.zeros_like(prompts), where=prompts > 0
    )
    return ratios


STATISTICS: Final[dict[str, Statistic]] = {
    "hit_ratio": _hit_ratio,
    "ttft_s.mean": lambda ttft, prompt, cached: ttft.mean(axis=1),
    "ttft_s.p50": lambda ttft, prompt, cached: np.quantile(ttft, 0.5, axis=1),
    "ttft_s.p90": lambda ttft, prompt, cached: np.quantile(ttft, 0.9, axis=1),
}
"""The summary keys (``compare``'s rows) an interval is drawn for."""


def change_intervals(
    a: dict[str, Any] | None, b: dict[str, Any] | None, seed: int = 0
) -> dict[str, tuple[float, float]]:
    """By summary key, the 95 % interval of B's relative change against A; empty when
    either run kept no per-request figures or they share fewer than ``MIN_PAIRS``
    requests. ``a`` and ``b`` are ``per_request``'s dicts as a summary holds them."""
    pairs = _pairs(a, b)
    if pairs is None:
        return {}
    both = {key: _draws(pairs, statistic, seed) for key, statistic in STATISTICS.items()}
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


def _draws(pairs: tuple[F64, F64], statistic: Statistic, seed: int) -> F64:
    """``DRAWS`` relative changes of the statistic, B against A (draws where A's is 0
    are left out)."""
    rows_a, rows_b = pairs
    rng = np.random.default_rng(seed)
    n, changes = rows_a.shape[1], []
    rows = max(1, min(ROWS_PER_CHUNK, MAX_DRAW_BYTES // (BYTES_PER_DRAWN_PAIR * n)))
    for start in range(0, DRAWS, rows):
        picks = rng.integers(0, n, size=(min(rows, DRAWS - start), n))
        of_a = statistic(*(row[picks] for row in rows_a))
        of_b = statistic(*(row[picks] for row in rows_b))
        kept = of_a != 0
        changes.append((of_b[kept] - of_a[kept]) / of_a[kept])
    return np.concatenate(changes)

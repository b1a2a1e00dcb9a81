"""The reference code's fitter, kept only as the ``wa-ref`` baseline to compare against.

Owns ``fit_reference``: per category, ``scipy.stats.expon.fit`` (location and scale: a
*shifted* exponential) on the reuse gaps of at least ``REFERENCE_MIN_GAP_S``, with the
location then thrown away (``rate = 1 / scale``, used unshifted); ``p = kept gaps /
accesses``, blind to censoring; the life window fixed at ``REFERENCE_LIFE_S``. These are
the shortcuts docs/fitting.md lists ("The reference fitter"); ``controlplane.fit.per_category``
is the fitter to use. It
must never do I/O or be used to publish a policy.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from numpy.typing import NDArray

from agent.policy_document import CategoryParams

REFERENCE_MIN_GAP_S = 0.3
"""Gaps under this were dropped (near-concurrent system-prompt sharing)."""

REFERENCE_LIFE_S = 5.0
"""The reference code's life window, the same for every category."""


def fit_reference(
    gaps: NDArray[np.float64],
    accesses: int,
    *,
    min_gap_s: float = REFERENCE_MIN_GAP_S,
    life_s: float = REFERENCE_LIFE_S,
) -> CategoryParams | None:
    """The reference fit of one category from its raw reuse gaps and access count; None
    with fewer than two usable gaps (the reference left such categories out, so they fall
    to the document's default)."""
    g = np.asarray(gaps, dtype=np.float64)
    kept = g[np.isfinite(g) & (g >= min_gap_s)]
    if len(kept) < 2 or accesses <= 0:
        return None
    from scipy import stats

    _loc, scale = stats.expon.fit(kept)
    if not scale > 0:
        return None
    return CategoryParams(
        rate=1.0 / float(scale),
        p_reuse=min(len(kept) / accesses, 1.0),
        life_s=life_s,
        samples=int(accesses),
        source="fit",
    )


def fit_reference_all(
    gaps: Mapping[str, NDArray[np.float64]],
    accesses: Mapping[str, int],
    *,
    min_gap_s: float = REFERENCE_MIN_GAP_S,
    life_s: float = REFERENCE_LIFE_S,
) -> dict[str, CategoryParams]:
    """``fit_reference`` of every category in ``accesses`` that it can fit."""
    out: dict[str, CategoryParams] = {}
    for name, n in accesses.items():
        params = fit_reference(gaps.get(name, np.empty(0)), n, min_gap_s=min_gap_s, life_s=life_s)
        if params is not None:
            out[name] = params
    return out

"""Goodness of fit: the censoring-aware empirical reuse-time CDF against a fitted one.

Owns ``empirical_cdf`` (actuarial life-table estimate from binned reuses and censored
exposures), ``ks_distance`` and ``ReuseCurve`` (the points the REST API plots). It must
never do I/O or fit anything.

Why a life table, not a KS test of the observed gaps against the fitted exponential: a
window censors long gaps more than short ones (an access made a minute ago can only show
a gap under a minute), so observed gaps are biased short and a correct model would look
wrong. The life-table (Kaplan-Meier on intervals) estimate removes that bias: in each bin
the hazard is reuses over exposures still at risk, with exposures censored inside the bin
counted as at risk for half of it. The distance is taken at bin edges, over the range where
at least ``min_at_risk`` of the exposures (and 10 of them) are still at risk; past that the
estimate rests on too few exposures to judge a fit by.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from controlplane.traces.arrays import F64

MIN_AT_RISK = 0.01
"""Default share of a category's exposures that must still be at risk at a KS point."""

CURVE_POINTS = 32
"""Most points of a ``ReuseCurve``."""


@dataclass(frozen=True)
class ReuseCurve:
    """Empirical (life-table) and fitted reuse-time CDF of one category at ``t_s``."""

    t_s: tuple[float, ...]
    empirical: tuple[float, ...]
    fitted: tuple[float, ...]


def fitted_cdf(t: F64, p: float | F64, rate: float | F64, shift: float = 0.0) -> F64:
    """``F(t) = p (1 - exp(-rate (t - shift)))``, 0 before ``shift`` (broadcasts)."""
    out: F64 = np.asarray(p) * -np.expm1(
        -np.asarray(rate) * np.maximum(np.asarray(t, np.float64) - shift, 0.0)
    )
    return out


def empirical_cdf(observed: F64, censored: F64) -> tuple[F64, F64]:
    """Life-table CDF at each bin's upper edge, and the exposures at risk in each bin
    (along the last axis: one row or ``[C, B]``)."""
    obs = np.asarray(observed, np.float64)
    cen = np.asarray(censored, np.float64)
    removed = np.cumsum(obs + cen, axis=-1)
    total = removed[..., -1:]
    at_risk = total - (removed - obs - cen) - cen / 2.0
    hazard = np.divide(obs, at_risk, out=np.zeros_like(obs), where=at_risk > 0)
    surv = np.cumprod(1.0 - np.clip(hazard, 0.0, 1.0), axis=-1, dtype=np.float64)
    return 1.0 - surv, at_risk


def judged(at_risk: F64, edges: F64, min_at_risk: float = MIN_AT_RISK) -> NDArray[np.bool_]:
    """Bins whose upper edge is finite and still has enough exposures at risk."""
    first = at_risk.max(axis=-1, keepdims=True)  # all exposures, less half the first bin's
    enough = at_risk >= np.maximum(10.0, min_at_risk * first)
    ok: NDArray[np.bool_] = enough & np.isfinite(edges[1:])
    return ok


def ks_from(emp: F64, at_risk: F64, edges: F64, p: F64, rate: F64, *, shift: float = 0.0) -> F64:
    """KS distance of each row of a life-table CDF (``empirical_cdf``) to its fitted
    ``(p, rate)``; NaN for a row with no judged edge."""
    ok = judged(at_risk, edges)
    t = np.where(np.isfinite(edges[1:]), edges[1:], 0.0)
    fit = fitted_cdf(t[None, :], np.asarray(p)[:, None], np.asarray(rate)[:, None], shift)
    dist = np.where(ok, np.abs(emp - fit), -1.0).max(axis=-1)
    return np.where(dist >= 0, dist, np.nan)


def ks_distance(
    observed: F64,
    censored: F64,
    edges: F64,
    p: float,
    rate: float,
    *,
    shift: float = 0.0,
) -> float | None:
    """Largest gap between the life-table CDF and the fitted one at the judged bin edges;
    None when no edge has enough exposures at risk."""
    emp, at_risk = empirical_cdf(np.atleast_2d(observed), np.atleast_2d(censored))
    d = float(ks_from(emp, at_risk, edges, np.array([p]), np.array([rate]), shift=shift)[0])
    return None if np.isnan(d) else d


def curve_from(
    emp: F64,
    at_risk: F64,
    edges: F64,
    p: float,
    rate: float,
    *,
    shift: float = 0.0,
    points: int = CURVE_POINTS,
) -> ReuseCurve:
    """At most ``points`` judged bin edges (evenly spaced in log time) of one row's
    life-table CDF, with the fitted CDF there."""
    idx = np.flatnonzero(judged(at_risk, edges))
    if len(idx) > points:
        idx = idx[np.unique(np.linspace(0, len(idx) - 1, points).round().astype(np.int64))]
    t = edges[1:][idx]
    return ReuseCurve(
        t_s=tuple(t.tolist()),
        empirical=tuple(emp[idx].tolist()),
        fitted=tuple(fitted_cdf(t, p, rate, shift).tolist()),
    )

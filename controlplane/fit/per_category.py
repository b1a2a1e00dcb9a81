"""Per-category fitted parameters from a stats snapshot: ``fit_all``.

Owns ``fit_all``, ``FitResult`` and ``CategoryFit``, and three rules, each documented in
docs/fitting.md:

- pooling: one fit of all categories together is every category's prior; a category
  with fewer than ``min_samples`` exposures gets it as is (``source="pooled"``), and with
  no pooled fit either (too little data overall) the built-in default (``"default"``);
- shrinkage: an own fit (``"fit"``) is blended with the pooled one on the scale the
  parameter lives on, ``logit p`` and ``log rate``, with weight ``n / (n + k)``: ``n`` =
  exposures for ``p`` (each access informs it), reuses for ``rate`` (only reuses do),
  ``k = shrinkage_samples``. That is the posterior mean under a prior worth ``k`` samples;
- life window: ``life_s_override`` when set; else, for ``life_rule="quantile"``, the
  ``life_quantile`` quantile of the fitted reuse time given a reuse (``-ln(1-q)/rate``),
  clamped to ``[life_min_s, life_max_s]``; for ``"fixed"``, the built-in default's.

It must never do I/O, read the environment, or keep state between calls.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from agent.policy_document import DEFAULT_PARAMS, CategoryParams, ParamSource
from controlplane.fit.gof import ReuseCurve, curve_from, empirical_cdf, ks_from
from controlplane.fit.mle import MixtureFit, fit_cure_rate_many
from controlplane.fit.reuse_window import StatsSnapshot
from controlplane.fit.settings import FitSettings

_P_CLIP = 1e-6
"""p is blended on the logit scale; kept this far from 0 and 1 so logits stay finite."""


@dataclass(frozen=True)
class CategoryFit:
    """Diagnostics of one category's fit, beside the parameters it produced."""

    name: str
    params: CategoryParams
    accesses: int
    exposures: int
    reuses: int
    near_concurrent: int
    naive_p: float
    """reuses / exposures: the censoring-blind estimate, kept for comparison."""
    raw: MixtureFit | None
    """The category's own maximum-likelihood fit before shrinkage (None: not fitted)."""
    weight_p: float
    weight_rate: float
    """Weights of the own fit in the blend (0 = all pooled, 1 = all own)."""
    curve: ReuseCurve | None


@dataclass(frozen=True)
class FitDurations:
    mle_s: float
    diagnostics_s: float
    total_s: float


@dataclass(frozen=True, eq=False)
class FitResult:
    """Everything one refit produced. ``categories`` holds every category with exposures
    in the window; ``pooled`` (None when too little data) is the default for the rest."""

    now: float
    categories: dict[str, CategoryParams]
    pooled: CategoryParams | None
    pooled_fit: MixtureFit | None
    details: dict[str, CategoryFit]
    accesses: int
    """Access episodes (exposures) in the window, all categories."""
    durations: FitDurations

    def cdf_points(self, name: str) -> ReuseCurve | None:
        """Empirical vs fitted reuse-time CDF of ``name`` (None: unknown or no data)."""
        d = self.details.get(name)
        return d.curve if d is not None else None


def life_window(rate: float, settings: FitSettings) -> float:
    """The life window L of a category with reuse rate ``rate`` (module docstring)."""
    if settings.life_s_override is not None:
        return settings.life_s_override
    if settings.life_rule == "fixed":
        return DEFAULT_PARAMS.life_s
    q = -np.log1p(-settings.life_quantile) / rate
    return float(np.clip(q, settings.life_min_s, max(settings.life_max_s, settings.life_min_s)))


def _logit(p: float) -> float:
    p = min(max(p, _P_CLIP), 1.0 - _P_CLIP)
    return float(np.log(p / (1.0 - p)))


def shrink(
    own: MixtureFit, pooled: MixtureFit, exposures: float, k: float
) -> tuple[float, float, float, float]:
    """``(p, rate, weight_p, weight_rate)`` of ``own`` blended toward ``pooled``."""
    wp = exposures / (exposures + k) if exposures + k > 0 else 1.0
    wr = own.reuses / (own.reuses + k) if own.reuses + k > 0 else 1.0
    lp = wp * _logit(own.p) + (1.0 - wp) * _logit(pooled.p)
    lr = wr * np.log(own.rate) + (1.0 - wr) * np.log(pooled.rate)
    return float(1.0 / (1.0 + np.exp(-lp))), float(np.exp(lr)), wp, wr


def _pooled_rate(fit: MixtureFit) -> float:
    # With no reuse at all the rate is not identified; the default's is as good as any.
    return fit.rate if fit.reuses > 0 else DEFAULT_PARAMS.rate


def fit_all(snapshot: StatsSnapshot, settings: FitSettings) -> FitResult:
    """Fit every category of ``snapshot`` (see the module docstring for the rules)."""
    t0 = time.perf_counter()
    snap = snapshot
    exposures = snap.accesses - snap.near_concurrent
    present = np.flatnonzero(exposures > 0)
    total = int(exposures.sum())
    own = present[exposures[present] >= settings.min_samples]
    pooled_obs, pooled_cen = snap.observed.sum(axis=0), snap.censored.sum(axis=0)
    fits = fit_cure_rate_many(
        np.vstack([pooled_obs, snap.observed[own]]),
        np.vstack([pooled_cen, snap.censored[own]]),
        snap.edges,
        shift=snap.near_concurrent_s,
        rate_bounds=(settings.rate_min, max(settings.rate_max, settings.rate_min)),
    )
    pooled_fit = fits[0] if total >= settings.min_samples else None
    own_fit = dict(zip(own.tolist(), fits[1:], strict=True))
    t1 = time.perf_counter()

    # Row 0: all categories together; then each present category.
    emp, at_risk = empirical_cdf(
        np.vstack([pooled_obs, snap.observed[present]]),
        np.vstack([pooled_cen, snap.censored[present]]),
    )
    chosen = [_choose(own_fit.get(c), pooled_fit, int(exposures[c]), settings) for c in present]
    p = np.array([pooled_fit.p if pooled_fit else np.nan] + [x[0] for x in chosen])
    rate = np.array([_pooled_rate(pooled_fit) if pooled_fit else np.nan] + [x[1] for x in chosen])
    ks = ks_from(emp, at_risk, snap.edges, p, rate, shift=snap.near_concurrent_s)

    pooled = None
    if pooled_fit is not None:
        pooled = _params(p[0], rate[0], ks[0], total, "pooled", settings)
    categories: dict[str, CategoryParams] = {}
    details: dict[str, CategoryFit] = {}
    for i, c in enumerate(present.tolist(), start=1):
        name, n = snap.categories[c], int(exposures[c])
        _, _, wp, wr, source = chosen[i - 1]
        params = _params(p[i], rate[i], ks[i], n, source, settings)
        curve = curve_from(
            emp[i], at_risk[i], snap.edges, p[i], rate[i], shift=snap.near_concurrent_s
        )
        categories[name] = params
        details[name] = CategoryFit(
            name=name,
            params=params,
            accesses=int(snap.accesses[c]),
            exposures=n,
            reuses=int(snap.reuses[c]),
            near_concurrent=int(snap.near_concurrent[c]),
            naive_p=float(snap.reuses[c]) / n,
            raw=own_fit.get(c),
            weight_p=wp,
            weight_rate=wr,
            curve=curve if curve.t_s else None,
        )
    t2 = time.perf_counter()
    return FitResult(
        now=snap.now,
        categories=categories,
        pooled=pooled,
        pooled_fit=pooled_fit,
        details=details,
        accesses=total,
        durations=FitDurations(mle_s=t1 - t0, diagnostics_s=t2 - t1, total_s=t2 - t0),
    )


def _choose(
    own: MixtureFit | None,
    pooled: MixtureFit | None,
    exposures: int,
    settings: FitSettings,
) -> tuple[float, float, float, float, ParamSource]:
    """``(p, rate, weight_p, weight_rate, source)`` of one category."""
    if own is not None and pooled is not None:
        p, rate, wp, wr = shrink(own, pooled, exposures, settings.shrinkage_samples)
        return p, rate, wp, wr, "fit"
    if pooled is not None:
        return pooled.p, _pooled_rate(pooled), 0.0, 0.0, "pooled"
    return DEFAULT_PARAMS.p_reuse, DEFAULT_PARAMS.rate, 0.0, 0.0, "default"


def _params(
    p: float, rate: float, ks: float, samples: int, source: ParamSource, s: FitSettings
) -> CategoryParams:
    return CategoryParams(
        rate=float(rate),
        p_reuse=float(min(max(p, 0.0), 1.0)),
        life_s=life_window(float(rate), s),
        samples=samples,
        fit_quality=None if np.isnan(ks) else float(min(ks, 1.0)),
        source=source,
    )

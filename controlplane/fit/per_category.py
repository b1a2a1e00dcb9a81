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
from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np
from numpy.typing import NDArray
from scipy.special import expit

from agent.policy_document import DEFAULT_PARAMS, MODEL_PARAMS, CategoryParams, ParamSource
from controlplane.fit.gof import ReuseCurve, curve_from, empirical_cdf, ks_from
from controlplane.fit.mle import MixtureFit, clipped_logit, fit_cure_rate_many
from controlplane.fit.reuse_window import StatsSnapshot
from controlplane.fit.settings import FitSettings
from controlplane.traces.arrays import F64, I64


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
    """Wall-clock seconds one ``fit_all`` spent, by part."""

    mle_s: float
    """The maximum-likelihood fits: the pooled one and each category's own."""
    diagnostics_s: float
    """The rest: each category's blend with the pooled fit, its parameters and the
    goodness of fit of the curves."""
    total_s: float
    """The whole call."""


@dataclass(frozen=True)
class NotConverged:
    """The maximum-likelihood fits of one refit that did not converge (docs/fitting.md)."""

    pooled: bool
    """The pooled fit (every category's prior) is one of them."""
    categories: tuple[str, ...]
    """The categories whose own fit is one of them."""

    @property
    def count(self) -> int:
        return int(self.pooled) + len(self.categories)

    def words(self, shown: int = 5) -> str:
        """For a refit's note and outcome: how many, and which (the first ``shown``)."""
        names = (["the pooled fit"] if self.pooled else []) + [repr(c) for c in self.categories]
        more = f" and {len(names) - shown} more" if len(names) > shown else ""
        fits = "fit" if self.count == 1 else "fits"
        return f"{self.count} {fits} did not converge ({', '.join(names[:shown])}{more})"


def _unsettled(fit: MixtureFit) -> bool:
    """A fit with reuses (its estimate used) that stopped before converging."""
    return fit.reuses > 0 and not fit.converged


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

    @property
    def fitted(self) -> dict[str, CategoryParams]:
        """The categories given parameters from data (their own fit or the pooled one):
        what a refit publishes. Empty when the window held fewer than ``min_samples``
        exposures (no pooled fit): such a refit fits nothing, and the document in force
        stays."""
        return {name: p for name, p in self.categories.items() if p.source != "default"}

    @property
    def not_converged(self) -> NotConverged:
        """The fits of this refit that stopped before converging, among those whose
        estimate is used (a fit with no reuse never converges by construction: its rate is
        borrowed, its ``p`` sits at its bound). Their parameters are used all the same."""
        return NotConverged(
            pooled=self.pooled_fit is not None and _unsettled(self.pooled_fit),
            categories=tuple(
                name for name, d in self.details.items() if d.raw and _unsettled(d.raw)
            ),
        )

    def cdf_points(self, name: str) -> ReuseCurve | None:
        """Empirical vs fitted reuse-time CDF of ``name`` (None: unknown or no data)."""
        d = self.details.get(name)
        return d.curve if d is not None else None


def max_relative_change(
    old: Mapping[str, CategoryParams], new: Mapping[str, CategoryParams]
) -> float:
    """The largest relative change of a fitted parameter (``MODEL_PARAMS``) from ``old``
    to ``new`` over ``new``'s categories; ``inf`` when ``new`` names one ``old`` lacks. A
    refit changing less than ``change_threshold`` publishes nothing (controller and
    replay alike)."""
    worst = 0.0
    for name, p in new.items():
        q = old.get(name)
        if q is None:
            return float("inf")
        worst = max(worst, relative_change(q, p))
    return worst


def relative_change(old: CategoryParams, new: CategoryParams) -> float:
    """The largest relative change of one category's fitted parameters (``MODEL_PARAMS``)
    from ``old`` to ``new``."""
    changes: list[float] = [
        abs(getattr(old, f) - getattr(new, f)) / max(abs(getattr(old, f)), 1e-12)
        for f in MODEL_PARAMS
    ]
    return max(changes)


def life_window(rate: float, settings: FitSettings) -> float:
    """The life window L of a category with reuse rate ``rate`` (module docstring)."""
    if settings.life_s_override is not None:
        return settings.life_s_override
    if settings.life_rule == "fixed":
        return DEFAULT_PARAMS.life_s
    q = -np.log1p(-settings.life_quantile) / rate
    return float(np.clip(q, settings.life_min_s, settings.life_max_s))


@dataclass(frozen=True)
class Blend:
    """One category's chosen ``(p, rate)``: its own fit shrunk toward the pooled one
    (``"fit"``), the pooled fit as is (``"pooled"``) or the built-in default."""

    p: float
    rate: float
    weight_p: float
    weight_rate: float
    """Weights of the own fit in the blend (0 = all pooled, 1 = all own)."""
    source: ParamSource


def shrink(own: MixtureFit, pooled: MixtureFit, exposures: float, k: float) -> Blend:
    """``own`` blended toward ``pooled`` (module docstring)."""
    wp = exposures / (exposures + k) if exposures + k > 0 else 1.0
    # No reuse of its own: its rate is not identified (the solver's start), the pool's is.
    wr = own.reuses / (own.reuses + k) if own.reuses > 0 else 0.0
    lp = wp * clipped_logit(own.p) + (1.0 - wp) * clipped_logit(pooled.p)
    lr = wr * np.log(own.rate) + (1.0 - wr) * np.log(_pooled_rate(pooled))
    p, rate = float(expit(lp)), float(np.exp(lr))
    return Blend(p=p, rate=rate, weight_p=wp, weight_rate=wr, source="fit")


def _pooled_rate(fit: MixtureFit) -> float:
    # With no reuse at all the rate is not identified; the default's is as good as any.
    return fit.rate if fit.reuses > 0 else DEFAULT_PARAMS.rate


def _choose(
    own: MixtureFit | None, pooled: MixtureFit | None, exposures: int, settings: FitSettings
) -> Blend:
    if own is not None and pooled is not None:
        blend = shrink(own, pooled, exposures, settings.shrinkage_samples)
    elif pooled is not None:
        blend = Blend(pooled.p, _pooled_rate(pooled), 0.0, 0.0, "pooled")
    else:
        return Blend(DEFAULT_PARAMS.p_reuse, DEFAULT_PARAMS.rate, 0.0, 0.0, "default")
    return replace(blend, rate=_within_bounds(blend.rate, settings))


def _within_bounds(rate: float, settings: FitSettings) -> float:
    """``rate`` kept in ``[rate_min, rate_max]``: a rate borrowed where none is identified
    (the default's) may lie outside, and a blend on the log scale may miss a pinned
    bound by an ulp."""
    return min(max(rate, settings.rate_min), settings.rate_max)


@dataclass(frozen=True, eq=False)
class _Fits:
    """The maximum-likelihood fits of one snapshot."""

    pooled: MixtureFit | None
    """All categories together (None: fewer than ``min_samples`` exposures in all)."""
    own: dict[int, MixtureFit]
    """Category code -> its own fit, for categories with ``min_samples`` exposures."""


def _fit_rows(snap: StatsSnapshot, exposures: I64, settings: FitSettings) -> _Fits:
    """One vectorised MLE call: row 0 pools every category, then each category with
    enough exposures for a fit of its own."""
    own = np.flatnonzero(exposures >= settings.min_samples)
    fits = fit_cure_rate_many(
        np.vstack([snap.observed.sum(axis=0), snap.observed[own]]),
        np.vstack([snap.censored.sum(axis=0), snap.censored[own]]),
        snap.edges,
        shift=snap.near_concurrent_s,
        rate_bounds=(settings.rate_min, settings.rate_max),
    )
    pooled = fits[0] if int(exposures.sum()) >= settings.min_samples else None
    return _Fits(pooled=pooled, own=dict(zip(own.tolist(), fits[1:], strict=True)))


@dataclass(frozen=True, eq=False)
class _Diagnostics:
    """Row 0: all categories pooled; row ``i``: the ``i``-th present category."""

    empirical: F64
    at_risk: F64
    p: F64
    rate: F64
    ks: F64


def _diagnose(
    snap: StatsSnapshot, present: NDArray[np.intp], pooled: Blend | None, chosen: list[Blend]
) -> _Diagnostics:
    """Empirical CDFs and the KS distance of each chosen ``(p, rate)`` to them."""
    empirical, at_risk = empirical_cdf(
        np.vstack([snap.observed.sum(axis=0), snap.observed[present]]),
        np.vstack([snap.censored.sum(axis=0), snap.censored[present]]),
    )
    p = np.array([pooled.p if pooled else np.nan] + [b.p for b in chosen])
    rate = np.array([pooled.rate if pooled else np.nan] + [b.rate for b in chosen])
    ks = ks_from(empirical, at_risk, snap.edges, p, rate, shift=snap.near_concurrent_s)
    return _Diagnostics(empirical=empirical, at_risk=at_risk, p=p, rate=rate, ks=ks)


def fit_all(snapshot: StatsSnapshot, settings: FitSettings) -> FitResult:
    """Fit every category of ``snapshot`` (see the module docstring for the rules)."""
    t0 = time.perf_counter()
    snap = snapshot
    exposures = snap.accesses - snap.near_concurrent
    present = np.flatnonzero(exposures > 0)
    fits = _fit_rows(snap, exposures, settings)
    t1 = time.perf_counter()
    codes: list[int] = present.tolist()
    chosen = [_choose(fits.own.get(c), fits.pooled, int(exposures[c]), settings) for c in codes]
    pooled_blend = None if fits.pooled is None else _choose(None, fits.pooled, 0, settings)
    diag = _diagnose(snap, present, pooled_blend, chosen)
    total = int(exposures.sum())
    pooled = None
    if fits.pooled is not None:
        pooled = _params(diag.p[0], diag.rate[0], diag.ks[0], total, "pooled", settings)
    details: dict[str, CategoryFit] = {}
    for row, (c, blend) in enumerate(zip(codes, chosen, strict=True), start=1):
        name = snap.categories[c]
        details[name] = _category_fit(snap, c, row, blend, fits.own.get(c), diag, settings)
    t2 = time.perf_counter()
    return FitResult(
        now=snap.now,
        categories={name: d.params for name, d in details.items()},
        pooled=pooled,
        pooled_fit=fits.pooled,
        details=details,
        accesses=total,
        durations=FitDurations(mle_s=t1 - t0, diagnostics_s=t2 - t1, total_s=t2 - t0),
    )


def _category_fit(
    snap: StatsSnapshot,
    code: int,
    row: int,
    blend: Blend,
    own: MixtureFit | None,
    diag: _Diagnostics,
    settings: FitSettings,
) -> CategoryFit:
    """Category ``code``'s parameters and diagnostics (``row``: its row in ``diag``)."""
    exposures = int(snap.accesses[code] - snap.near_concurrent[code])
    p, rate = diag.p[row], diag.rate[row]
    params = _params(p, rate, diag.ks[row], exposures, blend.source, settings)
    curve = curve_from(
        diag.empirical[row], diag.at_risk[row], snap.edges, p, rate, shift=snap.near_concurrent_s
    )
    return CategoryFit(
        name=snap.categories[code],
        params=params,
        accesses=int(snap.accesses[code]),
        exposures=exposures,
        reuses=int(snap.reuses[code]),
        near_concurrent=int(snap.near_concurrent[code]),
        naive_p=float(snap.reuses[code]) / exposures,
        raw=own,
        weight_p=blend.weight_p,
        weight_rate=blend.weight_rate,
        curve=curve if curve.t_s else None,
    )


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

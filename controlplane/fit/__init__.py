"""Fitting of the per-category reuse model from stats snapshots (pure, SciPy).

Owns the censored cure-rate maximum-likelihood fit (``mle``), goodness of fit and CDF
points (``gof``), pooling, shrinkage and life windows (``categories``) and the reference
code's fitter kept as the ``wa-ref`` baseline (``reference``). It must never do I/O, hold
state between calls or import torch.
"""

from controlplane.fit.categories import (
    CategoryFit,
    FitDurations,
    FitResult,
    fit_all,
    life_window,
    shrink,
)
from controlplane.fit.gof import ReuseCurve, empirical_cdf, fitted_cdf, ks_distance
from controlplane.fit.mle import MixtureFit, fit_cure_rate, fit_cure_rate_many
from controlplane.fit.reference import REFERENCE_LIFE_S, fit_reference, fit_reference_all

__all__ = [
    "REFERENCE_LIFE_S",
    "CategoryFit",
    "FitDurations",
    "FitResult",
    "MixtureFit",
    "ReuseCurve",
    "empirical_cdf",
    "fit_all",
    "fit_cure_rate",
    "fit_cure_rate_many",
    "fit_reference",
    "fit_reference_all",
    "fitted_cdf",
    "ks_distance",
    "life_window",
    "shrink",
]

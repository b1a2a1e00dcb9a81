"""Fitting of the per-category reuse model from stats snapshots (pure, SciPy).

Owns the censored cure-rate maximum-likelihood fit (``mle``), goodness of fit and CDF
points (``gof``), pooling, shrinkage and life windows (``per_category``) and the sliding
window of reuse observations they read (``reuse_window``). It must never do I/O, hold
state between calls (the window aside) or import torch.
"""

from controlplane.fit.gof import ReuseCurve, empirical_cdf, fitted_cdf, ks_distance
from controlplane.fit.mle import MixtureFit, fit_cure_rate, fit_cure_rate_many
from controlplane.fit.per_category import (
    Blend,
    CategoryFit,
    FitDurations,
    FitResult,
    fit_all,
    life_window,
    shrink,
)

__all__ = [
    "Blend",
    "CategoryFit",
    "FitDurations",
    "FitResult",
    "MixtureFit",
    "ReuseCurve",
    "empirical_cdf",
    "fit_all",
    "fit_cure_rate",
    "fit_cure_rate_many",
    "fitted_cdf",
    "ks_distance",
    "life_window",
    "shrink",
]

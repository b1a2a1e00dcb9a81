"""Fitting of the per-category reuse model from stats snapshots (pure, SciPy).

Owns the censored cure-rate maximum-likelihood fit (``mle``), goodness of fit and CDF
points (``gof``), pooling, shrinkage and life windows (``per_category``) and the sliding
window of reuse observations they read (``reuse_window``). It must never do I/O, hold
state between calls (the window aside) or import torch.

The names below load on first use (PEP 562): ``controlplane.fit.settings`` is read by
every command's options, and SciPy takes a second to import.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:
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

_HOMES = {
    **dict.fromkeys(("ReuseCurve", "empirical_cdf", "fitted_cdf", "ks_distance"), "gof"),
    **dict.fromkeys(("MixtureFit", "fit_cure_rate", "fit_cure_rate_many"), "mle"),
}


def __getattr__(name: str) -> object:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = import_module(f"{__name__}.{_HOMES.get(name, 'per_category')}")
    return getattr(module, name)

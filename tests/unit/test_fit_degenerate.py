"""The fitter on degenerate windows: what a hostile or merely odd fleet can put in the
statistics window must give finite, bounded parameters, in bounded time."""

from __future__ import annotations

import numpy as np
import pytest

from controlplane.fit import fit_cure_rate
from controlplane.fit.reuse_window import gap_edges

EDGES = gap_edges(3630.0)
"""The default one-hour window's gap and age bins."""


def _binned(values_s: list[float], counts: list[float]) -> np.ndarray:
    """``counts[i]`` gaps (or ages) of ``values_s[i]`` seconds, binned on ``EDGES``."""
    return np.histogram(values_s, EDGES, weights=counts)[0]


def test_a_fit_peaking_on_the_lowest_rate_converges_in_a_few_steps() -> None:
    """10,000 exposures two minutes old and a single reuse after five: the likelihood rises
    toward ever slower rates, so the fit ends on ``rate_min``. The coupled Newton step kept
    asking the pinned rate to move; clipped, its ``p`` step was wrong, and the row crept
    along the bound for all 200 steps (2048 such categories: a 15-second refit)."""
    fit = fit_cure_rate(_binned([300.0], [1]), _binned([120.0], [10_000]), EDGES)
    assert fit.rate == pytest.approx(1e-6)
    assert fit.converged
    assert fit.iterations <= 60

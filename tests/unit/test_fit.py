"""The fitter: recovers known reuse models from censored synthetic data, and its rules
(pooling, shrinkage, life window, goodness of fit) do what docs/fitting.md says."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from scipy.optimize import minimize
from scipy.special import logit

from agent.policy_document import DEFAULT_PARAMS
from controlplane.fit import (
    fit_all,
    fit_cure_rate,
    fitted_cdf,
    ks_distance,
    life_window,
)
from controlplane.fit.mle import MixtureFit
from controlplane.fit.per_category import shrink
from controlplane.fit.reuse_window import ReuseStats, StatsSnapshot, gap_edges
from controlplane.fit.settings import FitSettings
from controlplane.replay.reference.fit import fit_reference
from tests.synth_reuse import Stream, chain_stream


def _snapshot(s: Stream, horizon: float, names: list[str], near_s: float = 0.0) -> StatsSnapshot:
    # The window outlasts the stream: censoring comes only from the stream's end.
    st = ReuseStats(2 * horizon, near_concurrent_s=near_s, categories=names, origin=0.0)
    st.ingest(s.ts, s.category, s.prev_ts, s.prev_category)
    return st.snapshot(horizon)


# (p, rate /s, horizon s): censoring is strong in both (mean reuse time = horizon / 10
# and horizon / 20), so the reuses/accesses estimate is visibly low.
CASES = [(0.3, 0.1, 100.0), (0.8, 2.0, 10.0)]


@pytest.mark.parametrize(("p", "rate", "horizon"), CASES)
def test_fit_recovers_p_and_rate_under_censoring(p: float, rate: float, horizon: float) -> None:
    s = chain_stream([60_000], [p], [rate], horizon, seed=11)
    row = _snapshot(s, horizon, ["w"]).of("w")
    fit = fit_cure_rate(row.observed, row.censored, _snapshot(s, horizon, ["w"]).edges)
    assert fit.converged
    # Tolerances: about 4 standard errors at these sample sizes (p: ~0.002, rate: ~1 %).
    assert fit.p == pytest.approx(p, abs=0.01)
    assert fit.rate == pytest.approx(rate, rel=0.04)
    # The censoring-blind estimators on the very same data are biased, far beyond that.
    naive_p = row.reuses / row.exposures
    assert naive_p < p - 0.03
    naive_rate = 1.0 / float(np.mean(s.gaps[0]))
    assert naive_rate > rate * 1.05


def test_binned_fit_matches_the_unbinned_likelihood_maximised_by_scipy() -> None:
    # Independent check: i.i.d. accesses over [0, T], continuous censored likelihood on the
    # raw samples, maximised by a generic optimiser.
    rng = np.random.default_rng(5)
    p, rate, horizon, n = 0.6, 0.05, 60.0, 40_000
    t0 = rng.uniform(0, horizon, n)
    gap = np.where(rng.random(n) < p, rng.exponential(1 / rate, n), np.inf)
    seen = t0 + gap <= horizon
    gaps, ages = gap[seen], horizon - t0[~seen]

    def nll(x: np.ndarray) -> float:
        q, a = x[0], math.exp(x[1])
        if not 0 < q < 1:
            return math.inf
        ll = len(gaps) * math.log(q * a) - a * gaps.sum()
        return -(ll + np.log1p(-q * -np.expm1(-a * ages)).sum())

    ref = minimize(nll, [0.5, math.log(0.1)], method="Nelder-Mead", options={"xatol": 1e-8})
    edges = gap_edges(horizon)
    obs = np.histogram(gaps, edges)[0]
    cen = np.histogram(ages, edges)[0].astype(np.float64)
    fit = fit_cure_rate(obs, cen, edges)
    assert fit.p == pytest.approx(ref.x[0], abs=0.003)
    assert fit.rate == pytest.approx(math.exp(ref.x[1]), rel=0.01)


def test_near_concurrent_threshold_models_the_time_beyond_it() -> None:
    horizon, tau, p, rate = 50.0, 0.5, 0.7, 1.0
    s = chain_stream([40_000], [p], [rate], horizon, seed=3, near_prob=0.5, near_s=tau)
    snap = _snapshot(s, horizon, ["w"], near_s=tau)
    row = snap.of("w")
    assert row.near_concurrent > 10_000
    fit = fit_cure_rate(row.observed, row.censored, snap.edges, shift=snap.near_concurrent_s)
    # Accesses closer than tau merge into one episode. From an access, a reuse comes within
    # tau with probability p(1 - e^{-rate tau}) (merged: the episode goes on) and later
    # with p e^{-rate tau}, so an episode ends in a reuse with the geometric-series
    # probability below, after tau + Exp(rate) (memoryless).
    near = p * -math.expm1(-rate * tau)
    assert fit.p == pytest.approx(p * math.exp(-rate * tau) / (1 - near), abs=0.01)
    assert fit.rate == pytest.approx(rate, rel=0.04)


def _three_categories_stats() -> ReuseStats:
    """big (p=.3, rate=.1), fast (p=.8, rate=2): 100k+ exposures each; tiny: 20 exposures,
    two of them reused within 50 ms."""
    horizon = 200.0
    s = chain_stream([80_000, 25_000], [0.3, 0.8], [0.1, 2.0], horizon, seed=21)
    st = ReuseStats(2 * horizon, categories=["big", "fast", "tiny", "cold"], origin=0.0)
    st.ingest(s.ts, s.category, s.prev_ts, s.prev_category)
    t = np.linspace(10.0, 150.0, 20)
    st.ingest(t, np.full(20, 2, np.int32), np.full(20, np.nan), np.full(20, -1, np.int32))
    # The reusing accesses are of another category: tiny keeps exactly 20 exposures.
    reuse_t = t[:2] + 0.05
    st.ingest(reuse_t, np.zeros(2, np.int32), t[:2], np.full(2, 2, np.int32))
    return st


def _three_categories() -> StatsSnapshot:
    return _three_categories_stats().snapshot(200.0)


@pytest.mark.parametrize("k", [0.0, 50.0])
def test_a_category_with_no_reuse_takes_the_pools_rate_not_the_solvers_start(k: float) -> None:
    """Its rate is not identified: it once kept the solver's starting value (at k = 0)
    or moved part way toward it."""
    own = MixtureFit(p=1e-6, rate=0.0316, reuses=0, exposures=500, loglik=0.0, converged=True,
                     iterations=3)  # fmt: skip
    pooled = MixtureFit(p=0.4, rate=1 / 30, reuses=900, exposures=5000, loglik=0.0,
                        converged=True, iterations=5)  # fmt: skip
    blend = shrink(own, pooled, own.exposures, k)
    assert blend.rate == pytest.approx(1 / 30) and blend.weight_rate == 0.0
    cold_pool = dataclasses.replace(pooled, reuses=0)
    assert shrink(own, cold_pool, own.exposures, k).rate == pytest.approx(DEFAULT_PARAMS.rate)


def test_shrinkage_pulls_a_small_category_toward_the_pool_and_leaves_a_big_one() -> None:
    snap = _three_categories()
    settings = FitSettings(min_samples=10, shrinkage_samples=50)
    res = fit_all(snap, settings)
    assert res.pooled is not None and res.pooled_fit is not None
    tiny, big = res.details["tiny"], res.details["big"]
    assert tiny.exposures == 20 and tiny.params.source == "fit" and tiny.raw is not None
    assert tiny.weight_p == pytest.approx(20 / 70)
    # On the logit scale the blend sits weight_p of the way from the pool to the own fit.
    span = logit(tiny.raw.p) - logit(res.pooled_fit.p)
    moved = logit(tiny.params.p_reuse) - logit(res.pooled_fit.p)
    assert abs(span) > 1.0
    assert moved / span == pytest.approx(tiny.weight_p, rel=1e-6)
    assert abs(math.log(tiny.params.rate / res.pooled_fit.rate)) < 0.05 * abs(
        math.log(tiny.raw.rate / res.pooled_fit.rate)
    )
    # The big category moves by less than one standard error of its own fit.
    assert big.exposures > 100_000 and big.raw is not None
    se_logit = 1 / math.sqrt(big.exposures * big.raw.p * (1 - big.raw.p))
    assert abs(logit(big.params.p_reuse) - logit(big.raw.p)) < se_logit
    assert abs(math.log(big.params.rate / big.raw.rate)) < 1 / math.sqrt(big.raw.reuses)
    assert big.params.p_reuse == pytest.approx(0.3, abs=0.01)


def test_below_min_samples_a_category_gets_the_pooled_fit() -> None:
    res = fit_all(_three_categories(), FitSettings(min_samples=200))
    tiny = res.categories["tiny"]
    assert res.pooled is not None and tiny.source == "pooled"
    assert (tiny.p_reuse, tiny.rate) == (res.pooled.p_reuse, res.pooled.rate)
    assert tiny.samples == 20 and res.details["tiny"].raw is None
    assert res.categories["big"].source == "fit"
    assert res.accesses == sum(d.exposures for d in res.details.values())


def test_too_little_data_overall_gives_the_default() -> None:
    st = ReuseStats(100.0, categories=["a"])
    st.ingest(
        np.array([1.0, 2.0]),
        np.zeros(2, np.int32),
        np.array([np.nan, 1.0]),
        np.array([-1, 0], np.int32),
    )
    res = fit_all(st.snapshot(3.0), FitSettings(min_samples=200))
    assert res.pooled is None
    assert res.categories["a"].source == "default" and res.categories["a"].samples == 2


def test_a_category_never_reused_gets_p_near_zero_and_the_pooled_rate() -> None:
    st = _three_categories_stats()
    t = np.linspace(0.0, 199.0, 5000)
    st.ingest(
        t, np.full(len(t), 3, np.int32), np.full(len(t), np.nan), np.full(len(t), -1, np.int32)
    )
    res = fit_all(st.snapshot(200.0), FitSettings(min_samples=100))
    cold = res.details["cold"]
    assert cold.params.p_reuse < 0.01 and cold.weight_rate == 0.0
    assert res.pooled is not None and cold.params.rate == pytest.approx(res.pooled.rate)


def test_life_window_rules() -> None:
    q = FitSettings(life_quantile=0.9, life_min_s=0.5, life_max_s=100.0, life_s_override=None)
    assert life_window(0.1, q) == pytest.approx(math.log(10) / 0.1)
    assert life_window(100.0, q) == 0.5  # clamped up
    assert life_window(1e-4, q) == 100.0  # clamped down
    fixed = FitSettings(life_rule="fixed", life_s_override=None)
    assert life_window(0.1, fixed) == 60.0
    over = FitSettings(life_s_override=7.0)
    assert life_window(0.1, over) == life_window(5.0, over) == 7.0
    res = fit_all(_three_categories(), FitSettings(min_samples=10, life_s_override=7.0))
    assert {p.life_s for p in res.categories.values()} == {7.0}
    quantile = FitSettings(min_samples=10, life_s_override=None)
    res = fit_all(_three_categories(), quantile)
    for p in res.categories.values():
        assert p.life_s == pytest.approx(min(max(math.log(10) / p.rate, 0.1), 3600.0))


def test_ks_is_small_for_the_right_model_and_large_for_a_wrong_one() -> None:
    horizon = 300.0
    s = chain_stream([50_000], [0.5], [0.05], horizon, seed=8)
    snap = _snapshot(s, horizon, ["w"])
    row = snap.of("w")
    fit = fit_cure_rate(row.observed, row.censored, snap.edges)
    good = ks_distance(row.observed, row.censored, snap.edges, fit.p, fit.rate)
    wrong = ks_distance(row.observed, row.censored, snap.edges, fit.p, fit.rate * 3)
    assert good is not None and wrong is not None
    assert good < 0.01 and wrong > 0.1
    # Data the model cannot describe: reuse gaps from two exponentials (1 s and 100 s).
    rng = np.random.default_rng(2)
    n = 60_000
    t0 = rng.uniform(0, horizon, n)
    gap = np.where(rng.random(n) < 0.5, rng.exponential(1.0, n), rng.exponential(100.0, n))
    seen = t0 + gap <= horizon
    obs = np.histogram(gap[seen], snap.edges)[0]
    cen = np.histogram(horizon - t0[~seen], snap.edges)[0].astype(np.float64)
    bad = fit_cure_rate(obs, cen, snap.edges)
    misfit = ks_distance(obs, cen, snap.edges, bad.p, bad.rate)
    assert misfit is not None and misfit > 0.08
    assert fit_all(snap, FitSettings()).categories["w"].fit_quality == pytest.approx(
        good, abs=0.005
    )


def test_cdf_points_follow_the_fit_for_the_right_model() -> None:
    res = fit_all(_three_categories(), FitSettings(min_samples=10))
    curve = res.cdf_points("fast")
    assert curve is not None and 5 <= len(curve.t_s) <= 32
    assert list(curve.t_s) == sorted(curve.t_s)
    assert np.all(np.diff(curve.empirical) >= 0)
    p = res.categories["fast"]
    np.testing.assert_allclose(curve.fitted, fitted_cdf(np.array(curve.t_s), p.p_reuse, p.rate))
    assert max(abs(e - f) for e, f in zip(curve.empirical, curve.fitted, strict=True)) < 0.01
    assert res.cdf_points("nope") is None


def test_reference_fitter_reproduces_the_shortcuts() -> None:
    horizon = 100.0
    s = chain_stream([60_000], [0.8], [2.0], horizon, seed=11)
    ref = fit_reference(s.gaps[0], s.accesses(0))
    assert ref is not None and ref.life_s == 5.0
    kept = s.gaps[0][s.gaps[0] >= 0.3]
    # expon.fit's MLE is loc = min, scale = mean - min; the reference used 1/scale unshifted.
    assert ref.rate == pytest.approx(1.0 / (kept.mean() - kept.min()), rel=1e-6)
    assert ref.p_reuse == pytest.approx(len(kept) / s.accesses(0))
    # Dropping gaps under 0.3 s of a 2/s category throws away ~45 % of its reuses.
    assert ref.p_reuse < 0.5
    assert fit_reference(np.array([0.1, 5.0]), 10) is None


def _never_reused(names: list[str]) -> StatsSnapshot:
    """500 accesses over 50 s, alternating between ``names``, none of them reused."""
    st = ReuseStats(100.0, categories=names, origin=0.0)
    n = 500
    code = (np.arange(n) % len(names)).astype(np.int32)
    st.ingest(np.linspace(0.0, 50.0, n), code, np.full(n, np.nan), np.full(n, -1, np.int32))
    return st.snapshot(60.0)


@pytest.mark.parametrize("pinned", [0.3, 7.3, 1e3])
def test_every_fitted_rate_lies_within_the_rate_bounds(pinned: float) -> None:
    """Own fits, shrunk fits, pooled ones and fits borrowed from a pool with no reuse
    (whose rate is not identified) all publish a rate inside [rate_min, rate_max]; a
    pinned rate is that rate exactly (it once came back an ulp off, or as the built-in
    default's 1/60 where nothing was reused)."""
    cases = [
        (_three_categories(), FitSettings(min_samples=10, rate_min=pinned, rate_max=pinned)),
        (_three_categories(), FitSettings(min_samples=30, rate_min=pinned, rate_max=pinned)),
        (_never_reused(["a", "b"]), FitSettings(min_samples=100, rate_min=pinned, rate_max=2e3)),
        (_never_reused(["a", "b"]), FitSettings(min_samples=300, rate_max=pinned / 1e3)),
    ]
    for snap, settings in cases:
        res = fit_all(snap, settings)
        assert res.pooled is not None
        published = [res.pooled, *res.categories.values()]
        assert {p.source for p in published} <= {"fit", "pooled"}
        for params in published:
            assert settings.rate_min <= params.rate <= settings.rate_max, (settings, params)

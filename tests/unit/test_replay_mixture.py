"""``wa-mix`` (replay only): the two-phase fit, its score and its evictor in a replay."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.policies.wa import WAPolicy
from agent.policies.wa_core import Attribution
from agent.policy_document import BUILTIN_POLICY, CategoryParams, PolicyDocument
from controlplane.fit.mle import fit_cure_rate_many
from controlplane.fit.settings import FitSettings
from controlplane.replay import catalog
from controlplane.replay.accesses import AccessColumns
from controlplane.replay.engine import replay_hits
from controlplane.replay.mixture import MixtureRefitter, MixtureWA, TwoPhase, fit_two_phase
from controlplane.replay.options import ReplayOptions
from controlplane.traces.synth import synthesize


def test_two_phase_fit_recovers_a_mixture_and_beats_one_exponential() -> None:
    rng = np.random.default_rng(3)
    fast = rng.exponential(1 / 5.0, 6000)
    slow = rng.exponential(1 / 0.05, 4000)
    gaps = np.concatenate([fast, slow])
    edges = np.concatenate([[0.0], np.geomspace(1e-3, 1e4, 120), [np.inf]])
    observed = np.histogram(gaps, edges)[0][None, :].astype(np.int64)
    censored = np.zeros_like(observed, dtype=float)
    censored[0, -2] = 1000.0  # never reused, seen for hours
    one = fit_cure_rate_many(observed, censored, edges)[0]
    model, gain = fit_two_phase(observed[0], censored[0], edges, 0.0, one)
    assert gain > 100
    assert abs(model.fast_rate / 5.0 - 1) < 0.1 and abs(model.slow_rate / 0.05 - 1) < 0.1
    assert abs(model.fast_share - 0.6) < 0.03 and abs(model.p - 10 / 11) < 0.01


def test_two_phase_rates_lie_within_the_rate_bounds() -> None:
    """Both phases keep to the fitter's ``[rate_min, rate_max]``, as every published rate
    does (they were bounded only by the solver's own box, ``e^-14`` to ``e^7``)."""
    rng = np.random.default_rng(5)
    gaps = np.concatenate([rng.exponential(1 / 50.0, 6000), rng.exponential(1 / 1e-5, 4000)])
    edges = np.concatenate([[0.0], np.geomspace(1e-3, 1e6, 160), [np.inf]])
    observed = np.histogram(gaps, edges)[0].astype(np.int64)
    censored = np.zeros(len(observed))
    for bounds in [(1e-6, 1e3), (0.01, 10.0), (0.5, 0.5)]:
        one = fit_cure_rate_many(observed[None, :], censored[None, :], edges, rate_bounds=bounds)
        model, _ = fit_two_phase(observed, censored, edges, 0.0, one[0], rate_bounds=bounds)
        for rate in (model.fast_rate, model.slow_rate):
            assert bounds[0] <= rate <= bounds[1], (bounds, model)


def test_two_phase_score_falls_with_idle_time_and_reduces_to_one_exponential() -> None:
    mix = TwoPhase(p=0.8, fast_share=0.5, fast_rate=10.0, slow_rate=0.1)
    scores = [mix.log_reuse_prob(d, 0.1) for d in (0.0, 0.1, 1.0, 10.0, 100.0)]
    assert scores == sorted(scores, reverse=True)
    single = TwoPhase(p=0.8, fast_share=1.0, fast_rate=2.0, slow_rate=2.0)
    want = math.log(0.8) + math.log(-math.expm1(-2.0 * 0.1)) - 2.0 * 3.0
    assert math.isclose(single.log_reuse_prob(3.0, 0.1), want, rel_tol=1e-12)


def test_wa_mix_replays_in_checked_mode_and_fits_to_b_api_1_with_two_phases() -> None:
    trace = synthesize("to-b", duration_s=300, qps=6, seed=7)
    capacity = trace.n_unique // 20
    policy = catalog.create("wa-mix", capacity, trace, ReplayOptions(refit_every_s=30.0))
    hits = replay_hits(trace, policy, capacity, check=True)
    assert 0 < hits.sum() < trace.n_accesses
    inner = policy.inner
    assert isinstance(inner, MixtureWA)
    assert set(inner.mixtures) == {"api_1"}
    api = inner.mixtures["api_1"]
    assert api.fast_rate > 10 * api.slow_rate


def test_a_refit_that_publishes_nothing_keeps_the_mixtures() -> None:
    """A refit under ``min_samples`` publishes no document: the mixtures in force stay
    with the document in force (they were replaced by the refit's, none, on the refit
    that also refits mixtures)."""
    refitter = MixtureRefitter(["a"], FitSettings(window_s=60.0, min_samples=200))
    target = MixtureWA(category_names=["a"], doc=BUILTIN_POLICY, fitted=refitter)
    kept = {"a": TwoPhase(p=0.5, fast_share=0.5, fast_rate=5.0, slow_rate=0.05)}
    refitter.mixtures = kept
    target.set_policy(BUILTIN_POLICY)
    n = 10
    cols = AccessColumns(
        ts=np.linspace(1.0, 10.0, n),
        category=np.zeros(n, np.int32),
        prev_ts=np.full(n, np.nan),
        prev_category=np.full(n, -1, np.int32),
        offsets=np.arange(n + 1, dtype=np.int64),
    )
    refitter.ingest(cols, slice(0, n))
    assert refitter.document(11.0, 1) is None
    assert refitter.mixtures == kept
    assert target.mixtures == kept


@pytest.mark.parametrize("attribution", ["last", "creator"])
def test_wa_mix_follows_the_attribution_option_as_wa_does(attribution: Attribution) -> None:
    trace = synthesize("to-b", duration_s=60, qps=4, seed=3)
    options = ReplayOptions(attribution=attribution)
    made = {name: catalog.create(name, 50, trace, options) for name in ("wa", "wa-mix")}
    assert {name: policy.inner.attribution for name, policy in made.items()} == {
        "wa": attribution,
        "wa-mix": attribution,
    }


_TWO = PolicyDocument(
    version=1,
    categories={
        "a": CategoryParams(rate=0.5, p_reuse=0.9, life_s=30),
        "b": CategoryParams(rate=0.01, p_reuse=0.2, life_s=300),
    },
)
_calls = st.lists(
    st.one_of(
        st.tuples(st.just("free"), st.lists(st.integers(0, 9), max_size=5), st.integers(0, 1)),
        st.tuples(st.just("touch"), st.lists(st.integers(0, 9), max_size=3), st.just(0)),
        st.tuples(st.just("evict"), st.just([]), st.integers(1, 4)),
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(calls=_calls, attribution=st.sampled_from(["last", "creator"]))
def test_wa_mix_without_mixtures_evicts_as_wa_under_either_attribution(
    calls: list[tuple[str, list[int], int]], attribution: Attribution
) -> None:
    """With no category two-phase, ``wa-mix`` is ``wa``: the same victims, whichever
    category a block is attributed to (a block evicted and stored again by another
    category is filed by its new creator)."""
    wa = WAPolicy(category_names=["a", "b"], doc=_TWO, attribution=attribution)
    mix = MixtureWA(category_names=["a", "b"], doc=_TWO, attribution=attribution)
    for now, (kind, blocks, arg) in enumerate(calls):
        if kind == "free":
            offsets = list(range(len(blocks)))
            for policy in (wa, mix):
                policy.free(blocks, offsets, float(now), arg)
        elif kind == "touch":
            for policy in (wa, mix):
                policy.touch(blocks, float(now))
        else:
            assert mix.evict(arg) == wa.evict(arg)
    assert mix.evict(10) == wa.evict(10)

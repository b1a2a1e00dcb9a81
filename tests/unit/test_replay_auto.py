"""``kvwise replay --policy auto`` (controlplane.shadow.auto_replay): the controller's
family selection over the replayed past, switching the replayed cache with its blocks."""

from __future__ import annotations

from dataclasses import replace
from itertools import pairwise

import pytest

from controlplane.replay import catalog
from controlplane.replay.engine import replay_hits
from controlplane.replay.options import ReplayOptions
from controlplane.replay.runner import ReplayJob, run_one
from controlplane.shadow.auto_replay import AutoReplayPolicy
from controlplane.traces.model import Trace
from controlplane.traces.synth import synthesize


@pytest.fixture(scope="module")
def trace() -> Trace:
    return synthesize("to-b", duration_s=600, qps=4, seed=3)


EAGER = ReplayOptions(
    auto_rate=1.0, auto_window_s=30.0, auto_margin=0.0, auto_windows=1, auto_min_accesses=0
)


def test_auto_is_in_the_replay_catalogue() -> None:
    assert "auto" in catalog.names()


def test_switches_keep_the_cache_whole_and_consistent(trace: Trace) -> None:
    capacity = trace.n_unique // 50
    policy = catalog.create("auto", capacity, trace, EAGER)
    assert isinstance(policy, AutoReplayPolicy)
    # check=True: after every request the cache holds what the replay inserted less what
    # it evicted, within capacity, across every switch of family.
    hits = replay_hits(trace, policy, capacity, check=True)
    assert len(policy.switches) >= 2, "an eager selector switches on a trace this long"
    families = [s.verdict.chosen for s in policy.switches]
    assert all(a != b for a, b in pairwise(families))
    assert policy.family == families[-1]
    assert 0 < hits.sum() <= trace.n_accesses
    windows = [s.verdict.window_end for s in policy.switches]
    assert windows == sorted(windows)
    # Every word of the selector is kept, a switch among them with its first request.
    said = [(request, view) for request, view in policy.verdicts if view.switches]
    assert said == [(s.request, s.verdict) for s in policy.switches]
    assert len(policy.verdicts) > len(policy.switches)
    assert all(s.request > 0 and s.at_s <= trace.timestamps[s.request] for s in policy.switches)


@pytest.mark.parametrize("reuse_class", ["off", "hit"])
def test_without_evidence_auto_is_wa(trace: Trace, reuse_class: str) -> None:
    """Also with reuse classes by hit: ``auto``'s ``wa`` is told the hits and evictions
    that decide a block's class."""
    capacity = trace.n_unique // 50
    never = replace(EAGER, auto_min_accesses=10**12, reuse_class=reuse_class)
    auto = catalog.create("auto", capacity, trace, never)
    wa = catalog.create("wa", capacity, trace, never)
    assert (replay_hits(trace, auto, capacity) == replay_hits(trace, wa, capacity)).all()
    assert isinstance(auto, AutoReplayPolicy) and not auto.switches


def test_a_replay_of_auto_says_when_it_switched(trace: Trace) -> None:
    capacity = trace.n_unique // 50
    result = run_one(trace, ReplayJob("auto", capacity), options=EAGER)
    assert result.notes and all("switch to" in note for note in result.notes)
    assert result.to_json()["notes"] == result.notes
    still = run_one(
        trace, ReplayJob("auto", capacity), options=replace(EAGER, auto_min_accesses=10**12)
    )
    (stayed,) = still.notes
    assert stayed.startswith("stayed wa: no shadow window had the sampled accesses to judge (")
    assert stayed.endswith(f"windows, each under {10**12:,})")
    level = run_one(trace, ReplayJob("auto", capacity), options=replace(EAGER, auto_margin=1.0))
    (stayed,) = level.notes
    assert stayed.startswith("stayed wa: no family led it by the margin (")
    assert stayed.endswith("windows judged)")
    span = float(trace.timestamps[-1] - trace.timestamps[0])
    unjudged = run_one(
        trace, ReplayJob("auto", capacity), options=replace(EAGER, auto_window_s=span + 1)
    )
    assert unjudged.notes == [
        f"stayed wa: no shadow window ended (the trace spans {span:,.0f} s, "
        f"--auto-window {span + 1:g} s)"
    ]
    assert "notes" not in run_one(trace, ReplayJob("lru", capacity)).to_json()


def test_below_rate_one_the_shadow_is_the_controllers(trace: Trace) -> None:
    """At a rate below 1 the offline shadow keeps what the controller keeps per worker:
    the replayed cache's own prefix hits of every request (its inflow is every access
    less those hits) and the sample's share of that inflow, which sizes the miniatures."""
    capacity = trace.n_unique // 50
    never = replace(EAGER, auto_rate=0.3, auto_min_accesses=10**12)
    auto = catalog.create("auto", capacity, trace, never)
    assert isinstance(auto, AutoReplayPolicy)
    hits = replay_hits(trace, auto, capacity)
    every, sampled = auto.shadow_inflow
    assert every == trace.n_accesses - hits.sum()
    assert 0.1 * every < sampled < 0.6 * every
    sizes = {cache.capacity for cache in auto.shadow_caches}
    assert len(sizes) == 1 and sizes != {round(capacity * 0.3)}


def test_a_negative_window_minimum_is_refused_when_the_options_are_made() -> None:
    with pytest.raises(ValueError, match="auto_min_accesses >= 0"):
        ReplayOptions(auto_min_accesses=-1)

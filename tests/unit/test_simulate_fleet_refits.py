"""A simulated fleet of fitted policies refits once, as one controller fits the whole
fleet's traffic: without reuse classes by hit every instance's refit takes the same
accesses (the trace's, up to the refit), so the instances share one refitter, one set of
access columns and one document per refit (``wa-mix``: and its mixtures); with them each
instance refits on its own, sharing only the trace's previous accesses."""

from __future__ import annotations

import pytest

from controlplane.replay import catalog
from controlplane.replay.mixture import MixtureWA
from controlplane.replay.online import FittedReplayPolicy
from controlplane.replay.options import ReplayOptions
from controlplane.simulate.engine import FleetShared, SimOptions, fleet_policies
from controlplane.traces.model import Trace
from controlplane.traces.synth import synthesize

CAPACITY = 1000
EVERY_5S = ReplayOptions(refit_every_s=5.0)


@pytest.fixture(scope="module")
def toc() -> Trace:
    return synthesize("to-c", duration_s=60, qps=8, seed=5)


def fitted_fleet(
    trace: Trace, policy: str, replay: ReplayOptions, instances: int = 4
) -> list[FittedReplayPolicy]:
    made = fleet_policies(policy, CAPACITY, trace, SimOptions(instances=instances, replay=replay))
    assert all(isinstance(p, FittedReplayPolicy) for p in made)
    return [p for p in made if isinstance(p, FittedReplayPolicy)]


def arrive_all(policies: list[FittedReplayPolicy], trace: Trace) -> None:
    """Every request arrives at every policy in trace order, as the simulator does."""
    for r in range(trace.n_requests):
        for policy in policies:
            policy.arrive(r)


@pytest.mark.parametrize("policy", ["wa", "wa-ref", "wa-mix"])
def test_the_fitted_policies_of_a_fleet_share_one_refitter_and_one_set_of_columns(
    toc: Trace, policy: str
) -> None:
    fleet = fitted_fleet(toc, policy, EVERY_5S)
    assert len({id(p.refits) for p in fleet}) == 1
    assert len({id(p.refitter) for p in fleet}) == 1
    assert len({id(p.setup) for p in fleet}) == 1
    assert len({id(p.inner) for p in fleet}) == len(fleet)  # each cache's own evictor
    setup = fleet[0].setup
    assert setup is not None
    assert not setup.cols.ts.flags.writeable and not setup.cols.category.flags.writeable


@pytest.mark.parametrize(
    ("policy", "replay"),
    [
        ("wa", EVERY_5S),
        ("wa-ref", EVERY_5S),
        ("wa", ReplayOptions(wa_fit="split")),
        ("wa", ReplayOptions(refit_every_s=5.0, reuse_class="trace")),
        ("wa-mix", EVERY_5S),
        ("wa-mix", ReplayOptions(wa_fit="split")),
    ],
)
def test_a_fleet_refits_as_often_as_one_policy_and_applies_its_documents(
    toc: Trace, policy: str, replay: ReplayOptions
) -> None:
    """Four instances made as many refits as one policy alone (not four times as many),
    and every instance applied the lone policy's documents, at the same requests."""
    fleet = fitted_fleet(toc, policy, replay)
    alone = catalog.create(policy, CAPACITY, toc, replay)
    assert isinstance(alone, FittedReplayPolicy)
    arrive_all([*fleet, alone], toc)
    assert alone.refits.made > 0 and alone.versions_applied > 0
    assert fleet[0].refits.made == alone.refits.made
    expected = [(a.version, a.request, a.doc.model_dump()) for a in alone.applied]
    for member in fleet:
        assert [(a.version, a.request, a.doc.model_dump()) for a in member.applied] == expected
        assert member.policy is fleet[0].policy


def test_with_reuse_classes_by_hit_each_instance_refits_on_its_own(toc: Trace) -> None:
    """A reuse class by hit depends on the instance's own hits: its refitter is its own."""
    replay = ReplayOptions(refit_every_s=5.0, reuse_class="hit")
    fleet = fitted_fleet(toc, "wa", replay)
    assert len({id(p.refits) for p in fleet}) == len(fleet)
    assert len({id(p.refitter) for p in fleet}) == len(fleet)
    assert len({id(p.hit_classes) for p in fleet}) == len(fleet)
    arrive_all(fleet, toc)
    assert all(p.refits.made == fleet[0].refits.made > 0 for p in fleet)


def test_with_reuse_classes_by_hit_a_fleet_shares_one_previous_access_array(toc: Trace) -> None:
    """Where each access's block was accessed before does not depend on the cache: the
    instances' hit classes read one array, which none of them can write."""
    fleet = fitted_fleet(toc, "wa", ReplayOptions(refit_every_s=5.0, reuse_class="hit"))
    previous = [p.hit_classes.previous for p in fleet if p.hit_classes is not None]
    assert len(previous) == len(fleet)
    assert len({id(a) for a in previous}) == 1
    assert not previous[0].flags.writeable


def test_a_wa_mix_fleet_applies_the_mixtures_of_one_policy_alone() -> None:
    """Every instance takes the shared refitter's mixtures with each document, the ones
    a lone ``wa-mix`` fits (here a two-phase ``api_1``)."""
    trace = synthesize("to-b", duration_s=300, qps=6, seed=7)
    replay = ReplayOptions(refit_every_s=30.0)
    fleet = fitted_fleet(trace, "wa-mix", replay, instances=3)
    alone = catalog.create("wa-mix", CAPACITY, trace, replay)
    assert isinstance(alone, FittedReplayPolicy)
    arrive_all([*fleet, alone], trace)
    assert isinstance(alone.inner, MixtureWA) and set(alone.inner.mixtures) == {"api_1"}
    assert fleet[0].refits.made == alone.refits.made
    for member in fleet:
        assert isinstance(member.inner, MixtureWA)
        assert member.inner.mixtures == alone.inner.mixtures


def test_a_policy_that_cannot_share_is_made_anew_for_every_instance(toc: Trace) -> None:
    fleet = fleet_policies("lru", CAPACITY, toc, SimOptions(instances=3, replay=EVERY_5S))
    assert len({id(p) for p in fleet}) == 3
    assert not any(isinstance(p, FleetShared) for p in fleet)

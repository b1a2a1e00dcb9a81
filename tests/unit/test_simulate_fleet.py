"""A simulated fleet's results are pinned, and what its instances can share is shared:
memory changes to the simulator must not move a single figure."""

from __future__ import annotations

import pytest

from controlplane.replay import catalog
from controlplane.replay.bounds import BeladyPolicy
from controlplane.simulate.engine import SimOptions, simulate
from controlplane.simulate.report import summarize
from controlplane.traces.model import Trace
from controlplane.traces.synth import synthesize

CAPACITY = 1000
FLEET = SimOptions(instances=4, router="least-loaded")

# Measured on the simulator before the next-use table and the offsets were shared
# across instances: (hits, prefill tokens saved, TTFT mean, TTFT p99, QTTFT mean,
# QTTFT p99, makespan), seconds. The fleet queues, so eviction runs under pinning.
PINNED = {
    "lru": (
        2040,
        32640,
        0.17454898689018752,
        0.45993063381830984,
        9.484702325918771,
        27.943349662015887,
        98.18987502869443,
    ),
    "wa": (
        2227,
        35632,
        0.17964797016495362,
        0.44138656833567247,
        9.47203415607898,
        27.68292056426097,
        90.55243700570439,
    ),
    "belady": (
        2261,
        36166,
        0.17860258365381707,
        0.3991554599560539,
        9.585937257037692,
        27.6398026375129,
        100.3408292343218,
    ),
}


@pytest.fixture(scope="module")
def toc() -> Trace:
    return synthesize("to-c", duration_s=60, qps=8, seed=5)


@pytest.mark.parametrize("policy", sorted(PINNED))
def test_a_four_instance_fleet_gives_the_pinned_figures(toc: Trace, policy: str) -> None:
    work, out = simulate(toc, policy, CAPACITY, FLEET)
    got = summarize(policy, CAPACITY, work, out, toc.lengths)
    hits, saved, ttft_mean, ttft_p99, qttft_mean, qttft_p99, makespan = PINNED[policy]
    assert (got.hits, got.saved_tokens) == (hits, saved)
    assert (got.ttft.mean, got.ttft.p99) == pytest.approx((ttft_mean, ttft_p99), rel=1e-12)
    assert (got.qttft.mean, got.qttft.p99) == pytest.approx((qttft_mean, qttft_p99), rel=1e-12)
    assert got.makespan_s == pytest.approx(makespan, rel=1e-12)


def test_belady_policies_of_one_trace_share_one_next_use_table(toc: Trace) -> None:
    """The simulator builds one policy per instance: the next-use table, as large as the
    trace, is built once for all of them."""
    policies = [catalog.create("belady", CAPACITY, toc) for _ in range(3)]
    assert all(isinstance(p, BeladyPolicy) for p in policies)
    tables = {id(p.next_uses) for p in policies if isinstance(p, BeladyPolicy)}
    assert len(tables) == 1


def test_another_trace_gets_its_own_next_use_table(toc: Trace) -> None:
    other = synthesize("to-c", duration_s=60, qps=8, seed=6)
    here, there = (BeladyPolicy(CAPACITY, t) for t in (toc, other))
    assert here.next_uses is not there.next_uses
    assert here.next_uses.n_requests == toc.n_requests
    assert there.next_uses.n_requests == other.n_requests

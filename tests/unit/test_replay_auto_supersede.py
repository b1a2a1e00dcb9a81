"""``auto`` in replay with ``auto_supersede="tree"``: its ``wa`` serves as a vLLM worker's
does under the policy document's ``supersede: tree`` (superseded branches evicted first
while ``wa`` is in force, nothing tracked under a baseline), and without it, not."""

from __future__ import annotations

from dataclasses import replace

import pytest

from controlplane.replay import catalog
from controlplane.replay.engine import replay_hits
from controlplane.replay.options import ReplayOptions
from controlplane.replay.superseded import SupersedingReplayPolicy
from controlplane.shadow.auto_replay import AutoReplayPolicy
from controlplane.traces.model import Trace
from controlplane.traces.synth import synthesize

EAGER = ReplayOptions(
    auto_rate=1.0, auto_window_s=30.0, auto_margin=0.0, auto_windows=1, auto_min_accesses=0
)
NEVER = replace(EAGER, auto_min_accesses=10**12)
"""No window ever has the accesses to judge: ``auto`` stays ``wa``."""


@pytest.fixture(scope="module")
def trace() -> Trace:
    return synthesize("to-c", duration_s=600, qps=4, seed=3)


class Recording(AutoReplayPolicy):
    """``auto`` that notes, per eviction, the family in force, the superseded blocks it
    took, and whether each was accessed since ``wa`` last came in force."""

    def __init__(self, capacity: int, trace: Trace, options: ReplayOptions) -> None:
        super().__init__(capacity, trace, options)
        self.evictions: list[tuple[str, int]] = []
        self.unseen_demoted = 0
        """Demoted blocks no request accessed since ``wa`` last came in force."""
        self._since: set[int] = set()
        self._was = self.family

    def arrive(self, request: int) -> None:
        super().arrive(request)
        if self.family != self._was:
            self._was = self.family
            self._since.clear()
        lo, hi = self._trace.offsets[request], self._trace.offsets[request + 1]
        self._since.update(self._trace.blocks[lo:hi].tolist())

    def evict(self, n: int) -> list[int]:
        wa = self.wa
        assert isinstance(wa, SupersedingReplayPolicy)
        before = wa.demoted
        victims = super().evict(n)
        taken = wa.demoted - before
        self.evictions.append((self.family, taken))
        self.unseen_demoted += sum(v not in self._since for v in victims[:taken])
        return victims


def test_on_wa_auto_with_the_rule_serves_as_wa_superseded(trace: Trace) -> None:
    capacity = trace.n_unique // 10
    tree = catalog.create("auto", capacity, trace, replace(NEVER, auto_supersede="tree"))
    off = catalog.create("auto", capacity, trace, NEVER)
    assert isinstance(tree, AutoReplayPolicy) and isinstance(off, AutoReplayPolicy)
    tree_hits = replay_hits(trace, tree, capacity, check=True)
    off_hits = replay_hits(trace, off, capacity, check=True)
    superseded = catalog.create("wa-superseded", capacity, trace, NEVER)
    wa = catalog.create("wa", capacity, trace, NEVER)
    assert (tree_hits == replay_hits(trace, superseded, capacity)).all()
    assert (off_hits == replay_hits(trace, wa, capacity)).all()
    assert not tree.switches and not off.switches
    assert isinstance(tree.wa, SupersedingReplayPolicy) and tree.wa.demoted > 0
    assert not isinstance(off.wa, SupersedingReplayPolicy)
    assert (tree_hits != off_hits).any(), "the rule changes what this trace's cache holds"


@pytest.mark.parametrize("reuse_class", ["off", "hit"])
def test_superseded_blocks_are_demoted_only_while_wa_is_in_force(
    trace: Trace, reuse_class: str
) -> None:
    """A baseline auto switched to keeps its own order, as the agent's free queue runs a
    baseline untouched; back on ``wa`` the rule demotes again, tracked afresh."""
    capacity = trace.n_unique // 20
    options = replace(EAGER, auto_supersede="tree", reuse_class=reuse_class)
    policy = Recording(capacity, trace, options)
    replay_hits(trace, policy, capacity, check=True)
    assert len(policy.switches) >= 2, "an eager selector switches on a trace this long"
    on_wa = [taken for family, taken in policy.evictions if family == "wa"]
    on_baselines = [taken for family, taken in policy.evictions if family != "wa"]
    assert on_baselines, "evictions happened under a baseline"
    assert sum(on_wa) > 0
    assert sum(on_baselines) == 0
    # Tracked afresh on each return to wa: what it demotes, the requests since then
    # accessed (as the agent's free queue, whose branches start again on a switch).
    assert policy.unseen_demoted == 0


def test_an_unknown_rule_is_refused_when_the_options_are_made() -> None:
    with pytest.raises(ValueError, match="auto_supersede must be tree or off"):
        ReplayOptions(auto_supersede="chat")  # type: ignore[arg-type]

"""The evictor family selection (controlplane.shadow.selection): a family must lead the one
in force by the margin over several full windows in a row; the controller's link reads
those windows from the shadow."""

from __future__ import annotations

from itertools import pairwise

import pytest

from agent.policy_document import PolicyDocument
from controlplane.service.metrics import ControllerMetrics
from controlplane.service.shadowing import ShadowLink
from controlplane.shadow.selection import FamilySelector, Reading, SelectionSettings
from tests.agent_stream import agent_batches
from tests.shadow_samples import KEEPS_OLDEST, QUICK_SELECTION, selection_trace

RULE = SelectionSettings(margin=0.01, windows=3, min_accesses=100)


def _reading(at: float, accesses: int = 1000, **ratios: float) -> Reading:
    return Reading(ratios, accesses, at, at + 60)


def test_a_family_is_selected_only_after_leading_by_the_margin_in_a_row() -> None:
    selector = FamilySelector(RULE)
    said = [
        selector.observe(_reading(0, wa=0.30, lru=0.32), "wa"),
        selector.observe(_reading(60, wa=0.30, lru=0.305), "wa"),  # within the margin: again
        selector.observe(_reading(120, wa=0.30, lru=0.32, arc=0.33), "wa"),
        selector.observe(_reading(180, 10, wa=0.30, lru=0.50), "wa"),  # too few: no evidence
        selector.observe(_reading(240, wa=0.30, lru=0.32), "wa"),
        selector.observe(_reading(300, wa=0.30, lru=0.33, arc=0.32), "wa"),
    ]
    assert [v.streak for v in said] == [1, 0, 1, 1, 2, 3]
    assert [v.switches for v in said] == [False] * 5 + [True]
    assert said[2].leader == "arc" and said[2].lead == pytest.approx(0.03)
    assert said[3].reason.startswith("no evidence: 10 sampled accesses")
    last = said[-1]
    assert last.chosen == "lru" and last.in_force == "wa"
    assert "switch to lru: lru 0.3300 vs wa 0.3000 (+0.0300)" in last.reason


def test_switching_back_needs_the_same_evidence() -> None:
    selector = FamilySelector(SelectionSettings(margin=0.01, windows=2, min_accesses=0))
    assert not selector.observe(_reading(0, wa=0.3, s3fifo=0.35), "wa").switches
    assert selector.observe(_reading(60, wa=0.3, s3fifo=0.35), "wa").chosen == "s3fifo"
    # wa ahead once, then behind the margin once: s3fifo stays.
    assert not selector.observe(_reading(120, wa=0.37, s3fifo=0.35), "s3fifo").switches
    assert not selector.observe(_reading(180, wa=0.355, s3fifo=0.35), "s3fifo").switches
    assert not selector.observe(_reading(240, wa=0.37, s3fifo=0.35), "s3fifo").switches
    assert selector.observe(_reading(300, wa=0.37, s3fifo=0.35), "s3fifo").chosen == "wa"


def test_an_operators_switch_restarts_the_count() -> None:
    selector = FamilySelector(SelectionSettings(margin=0.0, windows=2, min_accesses=0))
    assert selector.observe(_reading(0, wa=0.3, lru=0.4, arc=0.35), "wa").streak == 1
    assert selector.observe(_reading(60, wa=0.3, lru=0.4, arc=0.35), "arc").streak == 1
    view = selector.observe(_reading(120, wa=0.3, lru=0.4), "unknown-family")
    assert not view.switches and "not among the shadow's families" in view.reason


def test_the_controllers_link_judges_full_shadow_windows_only() -> None:
    settings = QUICK_SELECTION.model_copy(update={"shadow_ladder": "1", "select_windows": 1})
    link = ShadowLink(settings, ControllerMetrics())
    assert link.evaluator is not None
    link.evaluator.set_capacities({"w1": 300})
    link.set_policy(PolicyDocument(version=3, default=KEEPS_OLDEST))
    judged = []
    for batch in agent_batches(selection_trace(), 300, batch_events=500):
        link.apply(batch)
        verdict = link.select("wa")
        if verdict is not None:
            judged.append(verdict)
    assert 3 <= len(judged) <= 5  # one per full 120 s window of a 600 s trace
    ends = [v.window_end for v in judged]
    assert all(b - a >= 120 for a, b in pairwise(ends))
    assert all(set(v.hit_ratios) == {"wa", "lru", "s3fifo"} for v in judged)
    assert any(v.switches for v in judged)  # a baseline beats a bad wa document
    assert link.view().selection == judged[-1]

"""The controller's side of the shadow evaluation: what feeds it, the refit guard, and what
it exports.

Owns ``ShadowLink``: it hands every applied batch to the ``ShadowEvaluator`` (which logs
a failure once per kind and never refuses the batch: the statistics window already took
it), refreshes the workers' capacities (from their heartbeats) and the published
document the ``wa`` curves replay, judges a candidate fit against the version in force
(``guard``: every verdict counted, the figures of the last one kept; the controller logs
a refusal, with both figures, once per run of refusals), and sets the shadow's
Prometheus gauges from each view it takes (``export``, the controller's shadow job, and
``view``, a read of the API). A scrape reads them as last set and never waits for the
evaluator: each view first replays what every worker has gathered. It must never
publish, fit or read Redis itself (the controller passes what it read).
"""

from __future__ import annotations

import dataclasses
import logging
import threading

from agent.policy_document import PolicyDocument
from agent.wire import EventBatch
from controlplane.service.agents import AgentView
from controlplane.service.metrics import ControllerMetrics
from controlplane.shadow.evaluator import ShadowEvaluator
from controlplane.shadow.selection import FamilySelector, SelectionView
from controlplane.shadow.settings import ShadowSettings
from controlplane.shadow.view import GuardView, ShadowView
from controlplane.told_once import ToldOnce

log = logging.getLogger(__name__)


class ShadowLink:
    """The shadow evaluator as the controller uses it (None inside when switched off)."""

    def __init__(
        self, settings: ShadowSettings, metrics: ControllerMetrics, max_workers: int | None = None
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.evaluator = (
            ShadowEvaluator(settings, max_workers=max_workers) if settings.shadow_enabled else None
        )
        self.selector = FamilySelector(settings.selection)
        self._judged_until = -1.0  # end of the last window the selector judged
        # Views are set on the gauges in the order they were taken (a later view is never
        # overwritten by an earlier one), and each view's series are those set last.
        self._gauges_lock = threading.Lock()
        self._curve_series: set[tuple[str, str, str]] = set()
        self._group_series: set[str] = set()
        self._failures_told: ToldOnce[type[Exception]] = ToldOnce()

    def apply(self, batch: EventBatch) -> None:
        """Hand ``batch`` to the shadow; never raises: the statistics window has taken it,
        and a batch the shadow fails on must not be refused (dead-lettered) for that."""
        if self.evaluator is None:
            return
        try:
            self.evaluator.apply(batch)  # it logs and drops what it cannot replay
        except Exception as exc:
            if self._failures_told.first(type(exc)):  # once per kind: a batch may be many
                log.exception("the shadow dropped a batch of %s", batch.worker)

    def refresh(
        self, agents: list[AgentView], current: PolicyDocument | None, idle_s: float = 0.0
    ) -> None:
        """The workers' capacities and the document in force, as last read; the requests
        of workers idle ``idle_s`` seconds (0: none) replayed; workers with no heartbeat
        and nothing sent for a whole window forgotten."""
        if self.evaluator is None:
            return
        if idle_s > 0:
            self.evaluator.flush_idle(idle_s)
        self.evaluator.forget_gone({a.id for a in agents})
        self.evaluator.set_capacities(
            {a.id: a.capacity for a in agents},
            {a.id: a.whole_requests for a in agents},
            {a.id: a.reuse_ghost_blocks if a.reuse_classes else None for a in agents},
            {a.id: a.supersedes_branches for a in agents},
        )
        if current is not None:
            self.evaluator.set_policy(current)

    def set_policy(self, doc: PolicyDocument) -> None:
        """A version just published: the ``wa`` curves replay it from now on."""
        if self.evaluator is not None:
            self.evaluator.set_policy(doc)

    def guard(self, candidate: PolicyDocument, in_force: PolicyDocument | None) -> GuardView:
        """The verdict on ``candidate``: ``refused`` means do not publish it."""
        if self.evaluator is None:
            self.metrics.guard.labels(outcome="off").inc()
            return GuardView("off", "shadow evaluation is off (KVWISE_SHADOW_ENABLED)")
        verdict = self.evaluator.judge(candidate, in_force)
        self.metrics.guard.labels(outcome=verdict.outcome).inc()
        if verdict.candidate_hit_ratio is not None and verdict.in_force_hit_ratio is not None:
            self.metrics.guard_hit_ratio.labels(version="candidate").set(
                verdict.candidate_hit_ratio
            )
            self.metrics.guard_hit_ratio.labels(version="in_force").set(verdict.in_force_hit_ratio)
        return verdict

    def select(self, in_force: str) -> SelectionView | None:
        """The selector's word on the window ending now, once a full shadow window has
        passed since the one it last judged (None: not yet, or selection off)."""
        s = self.settings
        if self.evaluator is None or not s.select_enabled or 1.0 not in s.multiples:
            return None
        reading = self.evaluator.reading()
        full = reading.end - reading.start >= s.shadow_window_s * (1 - 1 / s.shadow_buckets)
        if not full or reading.end < self._judged_until + s.shadow_window_s:
            return None
        self._judged_until = reading.end
        return self.selector.observe(reading, in_force)

    def view(self) -> ShadowView:
        """The evaluator's view with the selector's last word (its figures set on the
        gauges, as ``export`` sets them)."""
        if self.evaluator is None:
            s = self.settings
            return ShadowView(
                enabled=False,
                rate=s.shadow_rate,
                ladder=list(s.multiples),
                policies=["wa", *s.baselines],
                window_s=s.shadow_window_s,
                policy_version=None,
                guard=GuardView("off", "shadow evaluation is off (KVWISE_SHADOW_ENABLED)"),
            )
        view = self._exported_view(self.evaluator)
        return dataclasses.replace(view, selection=self.selector.last)

    def export(self) -> None:
        """Set the shadow's gauges from its current view (it replays what the evaluator
        has gathered first: never on a scrape's thread)."""
        if self.evaluator is not None:
            self._exported_view(self.evaluator)

    def _exported_view(self, evaluator: ShadowEvaluator) -> ShadowView:
        """``evaluator``'s current view, set on the gauges."""
        with self._gauges_lock:
            view = evaluator.view()
            self._set_gauges(view)
        return view

    def _set_gauges(self, view: ShadowView) -> None:
        """Set every series of ``view``, then remove those of groups gone: a series that
        stays is never missing from a scrape read meanwhile."""
        m = self.metrics
        curves: set[tuple[str, str, str]] = set()
        groups: set[str] = set()
        for group in view.groups:
            capacity = str(group.capacity)
            groups.add(capacity)
            m.shadow_sampled.labels(capacity).set(group.sampled_accesses)
            for curve in group.curves:
                for p in curve.points:
                    labels = (capacity, curve.policy, f"{p.multiple:g}")  # the label order
                    curves.add(labels)
                    m.shadow_hit_ratio.labels(*labels).set(p.hit_ratio)
                    m.shadow_ci.labels(*labels).set((p.ci_high - p.ci_low) / 2)
        for labels in self._curve_series - curves:
            m.shadow_hit_ratio.remove(*labels)
            m.shadow_ci.remove(*labels)
        for capacity in self._group_series - groups:
            m.shadow_sampled.remove(capacity)
        self._curve_series, self._group_series = curves, groups

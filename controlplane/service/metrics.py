"""Prometheus metrics of the controller, on a registry of its own (no global state).

Owns metric names and help texts, grouped by what they describe: ingest, refits, the
published policy, the agents, Redis and the checkpoint. Counters are bumped by ingest and
jobs; gauges that mirror state (policy version, per-category parameters, agents, Redis
state) are refreshed when scraped or when the state changes. It must never compute
anything it exports.
"""

from __future__ import annotations

from typing import Literal, get_args

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from controlplane.shadow.view import GuardOutcome

DEAD_LETTER_REASONS = ("decode", "limit", "apply")
GUARD_OUTCOMES = get_args(GuardOutcome)
"""Labels of ``kvwise_refit_guard``: published after judging, refused, published unjudged
for want of data, or with the shadow switched off."""
"""Labels of ``kvwise_ingest_dead_letters``: undecodable, over a limit, failed to apply."""


RefitOutcomeLabel = Literal[
    "published", "unchanged", "skipped", "held", "refused", "lost_lease", "error"
]
"""Every outcome a refit is counted under."""
REFIT_OUTCOMES: tuple[RefitOutcomeLabel, ...] = get_args(RefitOutcomeLabel)
"""They all, each series existing (at 0) from the start."""


class ControllerMetrics:
    """Every metric of one controller process."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._ingest_metrics()
        self._refusal_metrics()
        self._refit_metrics()
        self._policy_metrics()
        self._agent_metrics()
        self._redis_metrics()
        self._shadow_metrics()

    def _ingest_metrics(self) -> None:
        r = self.registry
        self.events = Counter(
            "kvwise_ingest_events", "Block access events decoded and applied", registry=r
        )
        self.batches = Counter(
            "kvwise_ingest_batches", "Event batches applied and acknowledged", registry=r
        )
        self.ingest_lag = Gauge(
            "kvwise_ingest_lag_seconds",
            "Age of the newest applied event when it was applied",
            registry=r,
        )
        self.pending = Gauge(
            "kvwise_ingest_pending_entries",
            "Stream entries delivered but not acknowledged",
            registry=r,
        )
        self.gaps = Gauge(
            "kvwise_ingest_gap_batches",
            "Batches now missing from a worker's sequence (trimmed or lost before ingest)",
            ["worker"],
            registry=r,
        )
        self.reclaimed = Counter(
            "kvwise_ingest_reclaimed_entries",
            "Pending entries reclaimed from dead consumers",
            registry=r,
        )
        self.window_categories = Gauge(
            "kvwise_window_categories",
            "Categories in the statistics window (unused ones age out with it)",
            registry=r,
        )

    def _refusal_metrics(self) -> None:
        r = self.registry
        self.dead_letters = Counter(
            "kvwise_ingest_dead_letters",
            "Stream entries refused (undecodable, over a limit, failed to apply) by reason",
            ["reason"],
            registry=r,
        )
        self.dead_letters_unwritten = Counter(
            "kvwise_ingest_dead_letters_unwritten",
            "Dead letters Redis refused to store (out of memory, ...); their entries were "
            "still acknowledged and deleted",
            registry=r,
        )
        self.clock_rejected = Counter(
            "kvwise_ingest_clock_rejected_events",
            "Events dropped because their time was outside clock_tolerance_s of the "
            "controller's clock, per worker",
            ["worker"],
            registry=r,
        )
        self.cleanup = Counter(
            "kvwise_cleanup",
            "Housekeeping removals: expired worker streams, stale consumers",
            ["what"],
            registry=r,
        )
        # Every label value from the start: a series that exists reads 0, not "no data".
        for reason in DEAD_LETTER_REASONS:
            self.dead_letters.labels(reason=reason)
        for what in ("worker", "consumer"):
            self.cleanup.labels(what=what)

    def _refit_metrics(self) -> None:
        r = self.registry
        self.refits = Counter("kvwise_refits", "Refit attempts by outcome", ["outcome"], registry=r)
        for outcome in REFIT_OUTCOMES:
            self.refits.labels(outcome=outcome)
        self.refit_seconds = Histogram(
            "kvwise_refit_duration_seconds",
            "Time to snapshot and fit all categories",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r,
        )
        self.checkpoints = Counter(
            "kvwise_checkpoints", "Window checkpoints by outcome", ["outcome"], registry=r
        )
        for written in ("written", "failed"):
            self.checkpoints.labels(outcome=written)
        self.checkpoint_bytes = Gauge(
            "kvwise_checkpoint_bytes", "Size of the last window checkpoint written", registry=r
        )

    def _policy_metrics(self) -> None:
        r = self.registry
        self.policy_version = Gauge(
            "kvwise_policy_version", "Current published policy version", registry=r
        )
        self.leader = Gauge("kvwise_leader", "1 if this replica holds the leader lease", registry=r)
        self.param = Gauge(
            "kvwise_category_param",
            "Published parameter of a category",
            ["category", "param"],
            registry=r,
        )
        self.samples = Gauge(
            "kvwise_category_samples",
            "Accesses the last fit saw per category",
            ["category"],
            registry=r,
        )

    def _agent_metrics(self) -> None:
        r = self.registry
        self.agent_version = Gauge(
            "kvwise_agent_applied_version",
            "Policy version each live agent applied",
            ["agent"],
            registry=r,
        )
        self.agent_staged_version = Gauge(
            "kvwise_agent_staged_version",
            "Policy version each live agent received, in force at its engine's next call",
            ["agent"],
            registry=r,
        )
        self.agent_evictor = Gauge(
            "kvwise_agent_evictor",
            "1 for the evictor family each live agent runs (label family)",
            ["agent", "family"],
            registry=r,
        )
        self.family_switches = Counter(
            "kvwise_evictor_family_selected_total",
            "Evictor families the controller selected and published, by family",
            ["family"],
            registry=r,
        )
        self.agent_hit_ratio = Gauge(
            "kvwise_agent_hit_ratio",
            "Block hit ratio each live agent reports",
            ["agent"],
            registry=r,
        )
        self.agent_dropped = Gauge(
            "kvwise_agent_events_dropped", "Events each live agent dropped", ["agent"], registry=r
        )

    def _redis_metrics(self) -> None:
        self.redis_state = Gauge(
            "kvwise_redis_state",
            "1 for the state Redis is in as this controller last saw it "
            "(ok, unreachable, out_of_memory, read_only, loading, auth_refused, error)",
            ["state"],
            registry=self.registry,
        )

    def _shadow_metrics(self) -> None:
        r = self.registry
        curve = ["capacity", "policy", "multiple"]
        self.shadow_hit_ratio = Gauge(
            "kvwise_shadow_hit_ratio",
            "Shadow estimate of the hit ratio a policy would have had at a multiple of a "
            "worker group's capacity, over the shadow window",
            curve,
            registry=r,
        )
        self.shadow_ci = Gauge(
            "kvwise_shadow_hit_ratio_ci_half_width",
            "Half width of the 95 % interval of kvwise_shadow_hit_ratio",
            curve,
            registry=r,
        )
        self.shadow_sampled = Gauge(
            "kvwise_shadow_sampled_accesses",
            "Sampled accesses in the shadow window, per worker group (capacity)",
            ["capacity"],
            registry=r,
        )
        self.guard = Counter(
            "kvwise_refit_guard",
            "Refits judged by the shadow guard, by outcome (waiting: too little data, "
            "published unjudged; off: shadow evaluation switched off)",
            ["outcome"],
            registry=r,
        )
        for outcome in GUARD_OUTCOMES:
            self.guard.labels(outcome=outcome)
        self.guard_hit_ratio = Gauge(
            "kvwise_refit_guard_hit_ratio",
            "Shadow hit ratio of the last judged candidate and of the version in force",
            ["version"],
            registry=r,
        )

"""Prometheus metrics of the controller, on a registry of its own (no global state).

Owns metric names and help texts. Counters are bumped by ingest and jobs; gauges that
mirror state (policy version, per-category parameters, agents) are refreshed when
scraped or after each refit. It must never compute anything it exports.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class ControllerMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
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
        self.dead_letters = Counter(
            "kvwise_ingest_dead_letters",
            "Undecodable batches sent to the dead-letter stream",
            registry=r,
        )
        self.reclaimed = Counter(
            "kvwise_ingest_reclaimed_entries",
            "Pending entries reclaimed from dead consumers",
            registry=r,
        )
        self.refits = Counter("kvwise_refits", "Refit attempts by outcome", ["outcome"], registry=r)
        self.refit_seconds = Histogram(
            "kvwise_refit_duration_seconds",
            "Time to snapshot and fit all categories",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r,
        )
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
        self.agent_hit_ratio = Gauge(
            "kvwise_agent_hit_ratio",
            "Block hit ratio each live agent reports",
            ["agent"],
            registry=r,
        )
        self.agent_dropped = Gauge(
            "kvwise_agent_events_dropped", "Events each live agent dropped", ["agent"], registry=r
        )

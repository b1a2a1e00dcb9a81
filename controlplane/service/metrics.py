"""Prometheus metrics of the controller, on a registry of its own (no global state).

Owns metric names and help texts, grouped by what they describe: ingest, refits, the
published policy, the agents, Redis and the checkpoint. Counters are bumped by ingest and
jobs; gauges that mirror state (policy version, per-category parameters, agents, Redis
state) are refreshed when scraped or when the state changes, the shadow's by the
controller's shadow job (a scrape never waits for its replays). It must never compute
anything it exports.
"""

from __future__ import annotations

from typing import Final, Literal, get_args

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from controlplane.shadow.view import GuardOutcome

DEAD_LETTER_REASONS = ("decode", "limit", "apply")
"""Labels of ``kvwise_ingest_dead_letters``: undecodable, over a limit, failed to apply."""
GUARD_OUTCOMES = get_args(GuardOutcome)
"""Labels of ``kvwise_refit_guard``: published after judging, refused, published unjudged
for want of data, or with the shadow switched off."""


RefitOutcomeLabel = Literal[
    "published", "unchanged", "skipped", "held", "refused", "lost_lease", "error"
]
"""Every outcome a refit is counted under."""
REFIT_OUTCOMES: tuple[RefitOutcomeLabel, ...] = get_args(RefitOutcomeLabel)
"""They all, each series existing (at 0) from the start."""


StoredPart = Literal["document", "base", "overrides", "pin", "current"]
"""A part of the policy state read back from Redis: a document, the base (the last fit),
the operator's overrides, the operator's pinned evictor family, the ``current`` pointer."""
STORED_PARTS: tuple[StoredPart, ...] = get_args(StoredPart)
"""Labels of ``kvwise_policy_state_refused``, each series existing (at 0) from the start."""


PER_AGENT: Final[dict[str, tuple[str, str]]] = {
    "applied_version": (
        "kvwise_agent_applied_version",
        "Policy version each live agent applied",
    ),
    "staged_version": (
        "kvwise_agent_staged_version",
        "Policy version each live agent received, in force at its engine's next call",
    ),
    "hit_ratio": ("kvwise_agent_hit_ratio", "Block hit ratio each live agent reports"),
    "events_dropped": ("kvwise_agent_events_dropped", "Events each live agent dropped"),
    "heartbeat_id_conflict": (
        "kvwise_agent_heartbeat_id_conflict",
        "Agent processes beating under one worker id at once, each beside another for "
        "over 30 s (by the id's instances hash): replicas given one KVWISE_WORKER_ID, "
        "those sending no events included; 0 when none, a restart included",
    ),
    "engine_seconds": (
        "kvwise_agent_engine_seconds",
        "Engine-thread time each live agent's kvwise calls took since it started "
        "(estimated from a timed sample of about one call in 64)",
    ),
    "engine_seconds_per_call": (
        "kvwise_agent_engine_seconds_per_call",
        "Mean engine-thread time of one kvwise call, per live agent (timed sample)",
    ),
    "engine_seconds_per_block": (
        "kvwise_agent_engine_seconds_per_block",
        "Engine-thread time of kvwise's calls per block they handled, per live agent "
        "(timed sample)",
    ),
}
"""The gauges of one number per live agent (label ``agent``): the field of its
``AgentView`` each shows, and the gauge's name and help."""


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

    def _counter(
        self, name: str, doc: str, labels: tuple[str, ...] = (), *, each: tuple[str, ...] = ()
    ) -> Counter:
        """A counter on this registry. With ``each``, its one label's series for those
        values exist from the start: a series that exists reads 0, not "no data"."""
        counter = Counter(name, doc, labels, registry=self.registry)
        for value in each:
            counter.labels(value)
        return counter

    def _gauge(self, name: str, doc: str, labels: tuple[str, ...] = ()) -> Gauge:
        """A gauge on this registry."""
        return Gauge(name, doc, labels, registry=self.registry)

    def _ingest_metrics(self) -> None:
        self.events = self._counter(
            "kvwise_ingest_events", "Block access events decoded and applied"
        )
        self.batches = self._counter(
            "kvwise_ingest_batches", "Event batches applied and acknowledged"
        )
        self.ingest_lag = self._gauge(
            "kvwise_ingest_lag_seconds", "Age of the newest applied event when it was applied"
        )
        self.pending = self._gauge(
            "kvwise_ingest_pending_entries", "Stream entries delivered but not acknowledged"
        )
        self.gaps = self._gauge(
            "kvwise_ingest_gap_batches",
            "Batches now missing from a worker's sequence (trimmed or lost before ingest)",
            ("worker",),
        )
        self.worker_id_conflict = self._gauge(
            "kvwise_ingest_worker_id_conflict",
            "Agent processes (starts) writing events under one worker id at the same time, "
            "for over 30 s (replicas given one KVWISE_WORKER_ID: their events are counted as "
            "one worker's); 0 when none do, a restart included",
            ("worker",),
        )
        self.streams_refused = self._gauge(
            "kvwise_ingest_streams_refused",
            "Worker streams found past KVWISE_MAX_WORKERS at the last discovery, left unread",
        )
        self.ingest_unexpected_errors = self._counter(
            "kvwise_ingest_unexpected_errors",
            "Passes of this controller's ingest loop (and waits between them) failed by an "
            "error not Redis's since it started, a bug most likely (its log has the "
            "traceback); the entries wait in the streams",
        )
        self.reclaimed = self._counter(
            "kvwise_ingest_reclaimed_entries", "Pending entries reclaimed from dead consumers"
        )
        self.window_categories = self._gauge(
            "kvwise_window_categories",
            "Categories in the statistics window (unused ones age out with it)",
        )

    def _refusal_metrics(self) -> None:
        self.dead_letters = self._counter(
            "kvwise_ingest_dead_letters",
            "Stream entries refused (undecodable, over a limit, failed to apply) by reason",
            ("reason",),
            each=DEAD_LETTER_REASONS,
        )
        self.ledgers_refused = self._counter(
            "kvwise_ingest_ledgers_refused",
            "Worker ledgers read back refused (not a hash, over the field count or a field's "
            "size, unparsable) and started again; ingest's next commit replaces them",
        )
        self.dead_letters_unwritten = self._counter(
            "kvwise_ingest_dead_letters_unwritten",
            "Dead letters Redis refused to store (out of memory, ...); their entries were "
            "still acknowledged and deleted",
        )
        self.clock_rejected = self._counter(
            "kvwise_ingest_clock_rejected_events",
            "Events dropped because their time was outside clock_tolerance_s of the "
            "controller's clock, per worker",
            ("worker",),
        )
        self.cleanup = self._counter(
            "kvwise_cleanup",
            "Housekeeping removals: expired worker streams, stale consumers",
            ("what",),
            each=("worker", "consumer"),
        )

    def _refit_metrics(self) -> None:
        self.refits = self._counter(
            "kvwise_refits", "Refit attempts by outcome", ("outcome",), each=REFIT_OUTCOMES
        )
        self.fits_not_converged = self._gauge(
            "kvwise_fit_not_converged",
            "Maximum-likelihood fits of the last refit (the pooled one, each category's own "
            "with reuses) that stopped before converging; their parameters are used all the "
            "same (docs/fitting.md)",
        )
        self.refit_seconds = Histogram(
            "kvwise_refit_duration_seconds",
            "Time to snapshot and fit all categories",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=self.registry,
        )
        self.checkpoints = self._counter(
            "kvwise_checkpoints",
            "Window checkpoints by outcome (refused: one read at start that could not be used: "
            "damaged, over its bounds or of another type)",
            ("outcome",),
            each=("written", "failed", "refused"),
        )
        self.checkpoint_bytes = self._gauge(
            "kvwise_checkpoint_bytes", "Size of the last window checkpoint written"
        )

    def _policy_metrics(self) -> None:
        self.policy_version = self._gauge(
            "kvwise_policy_version", "Current published policy version"
        )
        self.leader = self._gauge("kvwise_leader", "1 if this replica holds the leader lease")
        self.state_refused = self._counter(
            "kvwise_policy_state_refused",
            "Policy state read back from Redis and refused (damaged, over its bounds, another "
            "type), by part: a document reads as not stored; a base, overrides or pin as the "
            "document in force holds them; the current pointer as the newest readable kept version",
            ("part",),
            each=STORED_PARTS,
        )
        self.param = self._gauge(
            "kvwise_category_param", "Published parameter of a category", ("category", "param")
        )
        self.samples = self._gauge(
            "kvwise_category_samples", "Accesses the last fit saw per category", ("category",)
        )

    def _agent_metrics(self) -> None:
        self.agents_not_listed = self._gauge(
            "kvwise_agents_not_listed",
            "Heartbeat keys found past KVWISE_MAX_WORKERS at the last read, not read "
            "(GET /v1/agents and the per-agent gauges list the workers ingested first)",
        )
        self.heartbeats_refused = self._gauge(
            "kvwise_agent_heartbeats_refused",
            "Heartbeats unreadable at the last read (too large, not a string, another "
            "schema, corrupt): left out of GET /v1/agents",
        )
        self.agent_evictor = self._gauge(
            "kvwise_agent_evictor",
            "1 for the evictor family each live agent runs (label family)",
            ("agent", "family"),
        )
        self.agent_loop_unexpected_errors = self._gauge(
            "kvwise_agent_loop_unexpected_errors",
            "Rounds of each live agent's background loop (publisher, subscriber, heartbeat) "
            "failed by an error not Redis's since it started (the agent's log has the "
            "traceback); 0 for an agent that predates the count",
            ("agent", "loop"),
        )
        self.family_switches = self._counter(
            "kvwise_evictor_family_selected_total",
            "Evictor families the controller selected and published, by family",
            ("family",),
        )
        self.per_agent = {
            field: self._gauge(name, doc, ("agent",)) for field, (name, doc) in PER_AGENT.items()
        }
        """The ``PER_AGENT`` gauges, by the ``AgentView`` field each shows."""

    def _redis_metrics(self) -> None:
        self.redis_state = self._gauge(
            "kvwise_redis_state",
            "1 for the state Redis is in as this controller last saw it "
            "(ok, unreachable, out_of_memory, read_only, loading, auth_refused, error)",
            ("state",),
        )

    def _shadow_metrics(self) -> None:
        group = ("capacity",)  # a worker group: the workers of one capacity
        curve = (*group, "policy", "multiple")
        self.shadow_hit_ratio = self._gauge(
            "kvwise_shadow_hit_ratio",
            "Shadow estimate of the hit ratio a policy would have had at a multiple of a "
            "worker group's capacity, over the shadow window",
            curve,
        )
        self.shadow_ci = self._gauge(
            "kvwise_shadow_hit_ratio_ci_half_width",
            "Half width of the 95 % interval of kvwise_shadow_hit_ratio",
            curve,
        )
        self.shadow_sampled = self._gauge(
            "kvwise_shadow_sampled_accesses",
            "Sampled accesses in the shadow window, per worker group (capacity)",
            group,
        )
        self.guard = self._counter(
            "kvwise_refit_guard",
            "Refits judged by the shadow guard, by outcome (waiting: too little data, "
            "published unjudged; off: shadow evaluation switched off)",
            ("outcome",),
            each=GUARD_OUTCOMES,
        )
        self.guard_hit_ratio = self._gauge(
            "kvwise_refit_guard_hit_ratio",
            "Shadow hit ratio of the last judged candidate and of the version in force",
            ("version",),
        )

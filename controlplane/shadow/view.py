"""What ``GET /v1/shadow`` answers: the shadow's curves per worker group, and the guard's
last verdict. Plain dataclasses (the API's response model, the dashboard's and the demo's
input). It must never compute anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from controlplane.shadow.selection import SelectionView

GuardOutcome = Literal["passed", "refused", "waiting", "off"]


@dataclass(frozen=True)
class CurvePoint:
    """One policy at one capacity: the hit ratio over the window, with its 95 % interval."""

    multiple: float
    """Capacity as a multiple of the group's."""
    capacity: int
    """Full-size capacity in blocks (the miniature holds about ``capacity * rate``: the
    sample's share of the worker's recent inflow)."""
    hit_ratio: float
    """The estimate: the miniature's figure, moved by what the sample misses of the
    workers' own hit ratio (docs/shadow.md, "What the estimate is")."""
    ci_low: float
    ci_high: float
    """The 95 % interval of the draw of sampled subtrees; all of [0, 1] while too few
    subtrees (or no access) are sampled. The miniature's own error is not in it: on
    synthetic traces it held the full replay's figure for about three cells in four on
    to-C and one in five on to-B (docs/shadow.md, "Its error and its cost")."""
    accesses: int
    """Sampled accesses behind the estimate (0: hit_ratio 0.0 says nothing)."""
    sampled_hit_ratio: float = 0.0
    """The miniature's own figure over the sampled requests, before that move."""
    miniature_blocks: int = 0
    """Blocks the miniatures behind the point hold now (the group's, summed). Fewer than a
    few sampled requests' blocks (``GroupView.sampled_request_blocks``) and the estimate
    says little: a request longer than the miniature can never hit in it."""


@dataclass(frozen=True)
class PolicyCurve:
    """Hit ratio against capacity for one policy (``wa`` is the published document)."""

    policy: str
    points: list[CurvePoint]


@dataclass(frozen=True)
class GroupView:
    """Workers of one capacity, their traffic summed."""

    capacity: int
    workers: list[str]
    requests_seen: int
    """Whole requests rebuilt from the group's events (sampled or not)."""
    accesses_seen: int
    sampled_requests: int
    """Sampled requests in the window."""
    sampled_accesses: int
    incomplete_runs: int
    """Runs of events in the window that made no whole request (dropped)."""
    whole_requests: bool
    """Whether the events rebuild into whole requests: every worker's heartbeat says it
    reports them whole and few runs in the window were incomplete. False for SGLang
    (radix nodes, not blocks) and agents older than the heartbeat's field: the curves are
    then not the traffic's, and the refit guard leaves these workers out."""
    observed_hit_ratio: float
    """The workers' own prefix hit ratio over every whole request in the window."""
    sampled_observed_hit_ratio: float
    """The same over the sampled requests only: far from ``observed_hit_ratio``, the
    sample is richer or poorer in reuse than the traffic, and so are its curves."""
    sampled_request_blocks: float
    """Blocks of a sampled request, on average over the window (0: none sampled): a
    miniature that holds only a few of them (``CurvePoint.miniature_blocks``) cannot keep
    what the full cache would."""
    curves: list[PolicyCurve]
    capped_workers: list[str] = field(default_factory=list)
    """Workers whose last heartbeat said a capacity above ``shadow_max_capacity`` (they
    are modeled at that limit, the group's capacity, their reuse ghost scaled with it),
    or a reuse ghost above ``REUSE_GHOST_CAPACITIES`` times it (modeled there)."""
    kept_requests_dropped: int = 0
    """Sampled requests the workers' buffers for the refit guard and the warms let go
    inside the window, past ``shadow_max_requests`` or ``shadow_max_kept_blocks`` (since
    the controller started)."""
    forgotten_subtrees: int = 0
    """Sampled subtrees the workers' miniatures' counts forgot, those of fewest accesses,
    past ``MAX_SUBTREES`` (4,096) in a worker's window, since its miniatures count: the
    interval and the regression are drawn over those kept."""


@dataclass(frozen=True)
class GuardView:
    """The refit guard's last verdict on a candidate fit."""

    outcome: GuardOutcome | None
    """None: no refit judged yet."""
    reason: str
    in_force_version: int | None = None
    in_force_hit_ratio: float | None = None
    candidate_hit_ratio: float | None = None
    margin: float = 0.0
    sampled_accesses: int = 0
    at: float = 0.0


NOT_JUDGED = GuardView(None, "no refit judged yet")
"""The guard's word before its first verdict (frozen: one value serves every view)."""


@dataclass(frozen=True)
class ShadowView:
    """The whole shadow evaluation."""

    enabled: bool
    rate: float
    ladder: list[float]
    policies: list[str]
    window_s: float
    policy_version: int | None
    """Version of the ``wa`` document the ``wa`` curves replay (None: none read yet, as
    on a standby: the built-in parameters)."""
    groups: list[GroupView] = field(default_factory=list)
    waiting_workers: list[str] = field(default_factory=list)
    """Workers whose capacity is not known yet (no heartbeat read): not replayed."""
    refused_workers: list[str] = field(default_factory=list)
    """Workers left out, past ``KVWISE_MAX_WORKERS`` shadowed, told by a heartbeat or a
    batch (those whose streams ingest leaves unread, counted in
    kvwise_ingest_streams_refused, are not told to the shadow at all)."""
    guard: GuardView = NOT_JUDGED
    selection: SelectionView | None = None
    """The evictor family selection's last word (None: no full window judged yet, or off)."""

"""What a group of workers' counts read as: the curves and counts of one capacity group
(``group_view``, a ``GroupView``), and the workers' own hit ratio the estimates are moved
by (``own_ratio``).

Owns the arithmetic from the workers' window counts to the views: each policy's pooled
estimate at every step of the ladder, the sampled and seen totals, whether the group
reports whole requests. The evaluator calls it with its lock held, over the window ending
at its newest sampled request: it must never change a worker's state, take the lock, or
talk to Redis.
"""

from __future__ import annotations

from collections.abc import Iterable

from controlplane.shadow.estimator import Totals
from controlplane.shadow.guard import few_incomplete
from controlplane.shadow.miniatures import WA
from controlplane.shadow.view import CurvePoint, GroupView, PolicyCurve
from controlplane.shadow.worker import WorkerState


def group_view(
    capacity: int,
    members: list[tuple[str, WorkerState]],
    policies: tuple[str, ...],
    multiples: tuple[float, ...],
    rate: float,
    clock: float,
) -> GroupView:
    """The workers ``members`` of ``capacity`` as one group: every policy's curve over
    ``multiples`` (sampled at ``rate``), over the window ending at ``clock``."""
    seen_ratio = own_ratio((w for _, w in members), rate, clock)
    seen = sum((w.seen_all.totals(clock) for _, w in members), Totals())
    curves = []
    for name in policies:
        points = []
        for i, multiple in enumerate(multiples):
            totals = sum((w.ladders[name].counts[i].totals(clock) for _, w in members), Totals())
            est = totals.estimate(seen_ratio)
            held = sum(w.ladders[name].caches[i].capacity for _, w in members)
            points.append(
                CurvePoint(
                    multiple=multiple,
                    capacity=round(capacity * multiple),
                    hit_ratio=est.hit_ratio,
                    ci_low=est.ci_low,
                    ci_high=est.ci_high,
                    accesses=est.accesses,
                    sampled_hit_ratio=est.sampled_ratio,
                    miniature_blocks=held,
                )
            )
        curves.append(PolicyCurve(name, points))
    # Every cache of a worker serves every sampled request: any one counts them.
    sampled = sum((w.ladders[WA].counts[0].totals(clock) for _, w in members), Totals())
    requests = sum(w.requests for _, w in members)
    runs = [w.runs.totals(clock) for _, w in members]
    whole_runs, incomplete = sum(r[0] for r in runs), sum(r[1] for r in runs)
    return GroupView(
        capacity=capacity,
        workers=[worker_id for worker_id, _ in members],
        requests_seen=requests,
        accesses_seen=sum(w.accesses for _, w in members),
        sampled_requests=int(sampled.requests),
        sampled_accesses=int(sampled.accesses),
        incomplete_runs=incomplete,
        whole_requests=all(w.declares_whole for _, w in members)
        and few_incomplete(whole_runs, incomplete),
        observed_hit_ratio=seen.hit_ratio or 0.0,
        sampled_observed_hit_ratio=sampled.seen_ratio or 0.0,
        sampled_request_blocks=sampled.accesses / sampled.requests if sampled.requests else 0.0,
        curves=curves,
        capped_workers=[worker_id for worker_id, w in members if w.capped],
        kept_requests_dropped=sum(w.kept_dropped for _, w in members),
        forgotten_subtrees=sum(w.ladders[WA].counts[0].forgotten_subtrees for _, w in members),
    )


def own_ratio(workers: Iterable[WorkerState], rate: float, clock: float) -> float | None:
    """The workers' own hit ratio over every whole request, each read over the span its
    curves cover (None: no access, or a rate of 1, where the sample is the traffic)."""
    if rate >= 1:
        return None
    totals = sum((w.seen_all.totals(clock, since=w.curves_since) for w in workers), Totals())
    return totals.hit_ratio

"""The refit guard's verdict: the window's sampled requests replayed through the candidate
document and the one in force, each worker's from cold at its miniature capacity.

Owns ``GuardWork`` (one worker's part of the replay), ``compare`` (the verdict: passed,
refused, or waiting for enough sampled accesses), the verdict when no worker's events
rebuild into whole requests (``unjudgeable``), which of a worker's kept requests the
replay takes (``newest``), and when too many of its runs are incomplete for it to be
judged (``few_incomplete``, ``GUARD_MAX_INCOMPLETE_SHARE``). Its functions are pure over
what they are given: it must never hold the evaluator's lock or state, talk to Redis or
publish anything.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from agent.category_table import reused_name
from agent.policies.wa import WAPolicy
from agent.policy_document import PolicyDocument
from agent.reuse_classes import ReturnTracker
from controlplane.shadow.estimator import MiniCache, ReuseClassing
from controlplane.shadow.miniatures import branch_rule
from controlplane.shadow.rebuild import Request
from controlplane.shadow.settings import ShadowSettings
from controlplane.shadow.view import GuardView

GUARD_MAX_INCOMPLETE_SHARE = 0.1
"""A worker more than this share of whose runs do not rebuild into whole requests (events
lost, or an engine that reports a request's hits and its inserts apart) is left out of the
guard: its sample is not its traffic. So is one whose heartbeat does not say it reports
requests whole (SGLang's radix nodes; agents older than the field)."""


def few_incomplete(requests: int, incomplete: int) -> bool:
    """Whether ``incomplete`` runs are at most ``GUARD_MAX_INCOMPLETE_SHARE`` of all."""
    return incomplete <= GUARD_MAX_INCOMPLETE_SHARE * (requests + incomplete)


def unjudgeable(workers: int, in_force: PolicyDocument | None, margin: float) -> GuardView:
    """The verdict when no worker's events rebuild into whole requests."""
    return GuardView(
        "waiting",
        f"waiting: the events of {workers} worker(s) do not rebuild into whole requests "
        "(an agent that does not report requests whole, as SGLang's, or more than "
        f"{GUARD_MAX_INCOMPLETE_SHARE:.0%} of runs incomplete); published unjudged",
        in_force_version=in_force.version if in_force is not None else None,
        margin=margin,
        at=time.time(),
    )


def newest(buffer: deque[Request], max_accesses: int) -> list[Request]:
    """The newest requests of ``buffer`` holding at most ``max_accesses`` accesses (at
    least one request), in time order."""
    out: list[Request] = []
    total = 0
    for request in reversed(buffer):
        total += len(request.blocks)
        if out and total > max_accesses:
            break
        out.append(request)
    out.reverse()
    return out


@dataclass(frozen=True)
class GuardWork:
    """One worker's part of the guard's replay."""

    capacity: int
    """Its miniature capacity."""
    requests: list[Request]
    reuse_ghost: int | None = None
    """The miniature's ghost of reuse classes, None when the worker files none."""
    supersedes: bool = False
    """Whether the worker's eviction runs the document's ``supersede`` rule."""


def compare(
    work: list[GuardWork],
    names: tuple[str, ...],
    candidate: PolicyDocument,
    in_force: PolicyDocument | None,
    settings: ShadowSettings,
) -> GuardView:
    """The guard's verdict on ``work`` (per worker: miniature capacity, requests, and the
    ghost of its reuse classes when it files by class)."""
    margin = settings.guard_margin
    sampled = sum(len(r.blocks) for part in work for r in part.requests)
    if in_force is None:
        return GuardView("passed", "no version in force", margin=margin, at=time.time())
    if sampled < settings.guard_min_accesses:
        return GuardView(
            "waiting",
            f"waiting: {sampled:,} sampled accesses in the window, fewer than "
            f"guard_min_accesses ({settings.guard_min_accesses:,}); published unjudged",
            in_force_version=in_force.version,
            margin=margin,
            sampled_accesses=sampled,
            at=time.time(),
        )
    old, new = (_replayed(work, names, doc) for doc in (in_force, candidate))
    passed = new >= old - margin
    words = "passed" if passed else "refused"
    reason = (
        f"{words}: candidate's shadow hit ratio {new:.4f} against {old:.4f} of version "
        f"{in_force.version} in force (margin {margin}, {sampled:,} sampled accesses)"
    )
    return GuardView(
        "passed" if passed else "refused",
        reason,
        in_force_version=in_force.version,
        in_force_hit_ratio=old,
        candidate_hit_ratio=new,
        margin=margin,
        sampled_accesses=sampled,
        at=time.time(),
    )


def _replayed(work: list[GuardWork], names: tuple[str, ...], doc: PolicyDocument) -> float:
    """Hit ratio of ``wa`` under ``doc`` over every worker's requests, each from cold (a
    classing worker's filed by reuse class, superseded branches evicted first where the
    worker does and ``doc`` says so)."""
    code_of = {name: code for code, name in enumerate(names)}

    def reuse_class_code(code: int) -> int:
        return code_of[reused_name(names[code])]

    hits = accesses = 0
    for part in work:
        wa = WAPolicy(part.capacity, category_names=names, doc=doc)
        classing = None
        if part.reuse_ghost is not None:
            classing = ReuseClassing(ReturnTracker(part.reuse_ghost), reuse_class_code)
        cache = MiniCache(wa, part.capacity, classing)
        cache.run_branch_rule(branch_rule(part.supersedes, doc))
        for request in part.requests:
            hits += cache.serve(request)
            accesses += len(request.blocks)
    return hits / accesses if accesses else 0.0

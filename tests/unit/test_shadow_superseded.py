"""The shadow's ``wa`` under the document's ``supersede`` rule, for a worker whose eviction
runs it: ``CachedBranches`` (the rule over content hashes) against the pool's
``SupersededBranches``, a miniature against the replay's ``wa-superseded``, and the
evaluator and the guard told by the heartbeat which workers run it."""

from __future__ import annotations

import random

import pytest

from agent.branches import CachedBranches, SupersededBranches
from agent.policies.wa import WAPolicy
from agent.policy_document import BUILTIN_POLICY, PolicyDocument
from controlplane.replay import catalog
from controlplane.replay.engine import replay_hits
from controlplane.replay.options import ReplayOptions
from controlplane.shadow.estimator import MiniCache
from controlplane.shadow.guard import GuardWork, compare
from controlplane.shadow.rebuild import Request
from controlplane.shadow.settings import ShadowSettings
from controlplane.traces.model import Trace
from tests.unit.test_replay_superseded import _replacing_trace
from tests.unit.test_shadow import _shadow_at_full_rate
from tests.unit.test_superseded_branches import forking_chats

REPLACING_CAPACITY = 150
"""The replay test's cache for ``_replacing_trace``: ``wa`` hits 432 of its 2,146
accesses there, ``wa-superseded`` 768."""


def requests_of(trace: Trace) -> list[Request]:
    return [
        Request(float(trace.timestamps[r]), 0, trace.request_blocks(r).tolist())
        for r in range(trace.n_requests)
    ]


def miniature_hits(trace: Trace, capacity: int, rule: bool) -> int:
    cache = MiniCache(WAPolicy(capacity), capacity)
    cache.run_branch_rule(rule)
    return sum(cache.serve(request) for request in requests_of(trace))


def pool_pending(branches: SupersededBranches, content_of: list[int]) -> list[int]:
    return [content_of[block] for block in branches.pending()]


@pytest.mark.parametrize("seed", [7, 2028])
def test_by_content_the_rule_marks_what_the_pools_rule_marks(seed: int) -> None:
    """Synthetic forking conversations, nothing evicted: after every request the blocks
    marked over content hashes (dicts) are the pool's (lists, block ids given in order of
    first store), in the same order."""
    prompts = forking_chats(seed, 300, retries=True)
    rng = random.Random(seed)
    contents = 1 + max(max(p) for p in prompts)
    hashes = [rng.randrange(-(1 << 63), 1 << 63) for _ in range(contents)]
    assert len(set(hashes)) == contents
    by_content, pool = CachedBranches(), SupersededBranches(10_000, list(range(10_000)))
    block_of: dict[int, int] = {}
    content_of: list[int] = []
    marked = 0
    for prompt in prompts:
        hits = next((i for i, c in enumerate(prompt) if c not in block_of), len(prompt))
        for c in prompt[hits:]:
            block_of[c] = len(content_of)
            content_of.append(c)
        for branches, ids, root in (
            (by_content, [hashes[c] for c in prompt], by_content.root),
            (pool, [block_of[c] for c in prompt], pool.root),
        ):
            if hits:
                branches.touched(ids[:hits])
            if hits < len(ids):
                branches.stored(ids[hits - 1] if hits else root, ids[hits:], parting=True)
        seen = [hashes[c] for c in pool_pending(pool, content_of)]
        assert by_content.pending() == seen
        marked = max(marked, len(seen))
    assert marked > 5  # the conversations did supersede branches


def test_a_miniature_with_the_rule_scores_the_replays_wa_superseded() -> None:
    """On the replay test's conversations that replace part of each prompt (synthetic):
    432 hits of 2,146 accesses without the rule, as the replay's ``wa``, and 768 with it,
    as its ``wa-superseded``; the links held stay within the cache's blocks."""
    trace = _replacing_trace()
    options = ReplayOptions(refit_every_s=20.0)
    cap = REPLACING_CAPACITY
    replayed = {
        name: int(replay_hits(trace, catalog.create(name, cap, trace, options), cap).sum())
        for name in ("wa", "wa-superseded")
    }
    cache = MiniCache(WAPolicy(REPLACING_CAPACITY), REPLACING_CAPACITY)
    cache.run_branch_rule(True)
    hits = sum(cache.serve(request) for request in requests_of(trace))
    assert replayed == {"wa": 432, "wa-superseded": 768}
    assert miniature_hits(trace, REPLACING_CAPACITY, False) == replayed["wa"]
    assert hits == replayed["wa-superseded"]
    assert cache.branches is not None and len(cache.branches) <= REPLACING_CAPACITY


def test_the_rule_runs_only_where_the_policy_can_drop_a_block() -> None:
    class Undroppable:
        def touch(self, blocks: object, now: float) -> None: ...

    cache = MiniCache(Undroppable(), 4)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Undroppable cannot drop superseded blocks"):
        cache.run_branch_rule(True)


def shadow_wa_hit_ratio(trace: Trace, doc: PolicyDocument, supersedes: bool) -> float:
    """``wa``'s hit ratio at 1x in a full-rate shadow of worker ``w1`` of the replay
    test's capacity, its heartbeat saying whether its eviction runs the rule."""
    shadow = _shadow_at_full_rate(trace, REPLACING_CAPACITY, doc, supersedes=supersedes)
    (group,) = shadow.view().groups
    ((wa_points),) = (c.points for c in group.curves if c.policy == "wa")
    return next(p.hit_ratio for p in wa_points if p.multiple == 1.0)


def test_the_shadow_runs_the_rule_for_a_worker_that_does() -> None:
    """The evaluator's ``wa`` at 1x, at a full rate: with the rule for a worker whose
    heartbeat says its eviction runs it, under a document saying ``tree``; without it for
    one that does not, or under ``off``."""
    trace = _replacing_trace()
    off = BUILTIN_POLICY.model_copy(update={"version": 2, "supersede": "off"})
    with_rule = 768 / trace.n_accesses
    without = 432 / trace.n_accesses
    assert shadow_wa_hit_ratio(trace, BUILTIN_POLICY, True) == pytest.approx(with_rule)
    assert shadow_wa_hit_ratio(trace, BUILTIN_POLICY, False) == pytest.approx(without)
    assert shadow_wa_hit_ratio(trace, off, True) == pytest.approx(without)


def test_the_guard_replays_the_rule_for_a_worker_that_does() -> None:
    """The guard judges a document that turns the rule off against one in force with it,
    for a worker whose eviction runs it: 432 hits against 768, refused."""
    trace = _replacing_trace()
    settings = ShadowSettings(guard_min_accesses=1)
    work = [GuardWork(REPLACING_CAPACITY, requests_of(trace), None, True)]
    in_force = BUILTIN_POLICY.model_copy(update={"version": 1})
    candidate = BUILTIN_POLICY.model_copy(update={"version": 2, "supersede": "off"})
    verdict = compare(work, (), candidate, in_force, settings)
    assert verdict.outcome == "refused"
    assert verdict.in_force_hit_ratio == pytest.approx(768 / trace.n_accesses)
    assert verdict.candidate_hit_ratio == pytest.approx(432 / trace.n_accesses)
    plain = [GuardWork(REPLACING_CAPACITY, requests_of(trace))]
    assert compare(plain, (), candidate, in_force, settings).outcome == "passed"

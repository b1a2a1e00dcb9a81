"""``wa-pace`` (replay only): conversations, their pace classes and the evictor's curves."""

from __future__ import annotations

import math

import numpy as np
import pytest

from agent.policies.wa_core import log_weight
from agent.policy_document import CategoryParams, PolicyDocument
from controlplane.replay import catalog
from controlplane.replay.engine import replay_hits
from controlplane.replay.options import ReplayOptions
from controlplane.replay.pace import (
    PACE_STEPS,
    ConversationPace,
    PacedWA,
    class_factor,
    conversations,
    pace_class,
    pace_names,
)
from controlplane.traces.model import Trace

CENTER = PACE_STEPS
"""The pace class of factor 1: ``wa``'s own curve."""


def test_pace_class_is_the_gamma_posterior_mean_in_half_octaves() -> None:
    assert pace_class(0, 0.0, 1.0) == CENTER  # no gap seen: the category's own rate
    assert pace_class(3, 3.0, 1.0) == CENTER  # gaps as long as the category's mean
    assert pace_class(3, 0.0, 1.0) == CENTER + 4  # (1 + 3) / 1 = 2^2
    assert pace_class(1, 7.0, 1.0) == CENTER - 4  # (1 + 1) / 8 = 2^-2
    assert pace_class(1000, 0.0, 1.0) == 2 * PACE_STEPS  # clipped
    assert pace_class(1, 1e9, 1.0) == 0
    assert pace_class(3, 0.0, 1000.0) == CENTER  # a strong prior barely moves


def test_pace_class_refuses_a_prior_that_is_not_positive() -> None:
    with pytest.raises(ValueError, match="prior_gaps must be positive"):
        pace_class(1, 1.0, 0.0)
    with pytest.raises(ValueError, match="prior_gaps must be positive"):
        ConversationPace(-1.0)


def test_gaps_are_scaled_by_their_categorys_mean_gap() -> None:
    """Two conversations of one category, one twice as quick: its gaps scale below 1 and
    its class is above the other's; a category's first gap is its own mean."""
    pace = ConversationPace(1.0)
    assert pace.arrive(0, 0.0, category=0) == CENTER
    assert pace.arrive(1, 0.0, category=0) == CENTER
    assert pace.arrive(0, 10.0, category=0) == CENTER  # the first gap of category 0: 1
    slow = pace.arrive(1, 40.0, category=0)  # 40 s against a mean of 25 s
    quick = [pace.arrive(0, t, category=0) for t in (20.0, 30.0, 40.0)]
    assert slow < CENTER < quick[-1]
    other = pace.arrive(0, 1040.0, category=5)  # a long gap, closing category 0's request
    assert other < quick[-1]


def test_conversations_follow_parent_chat_ids() -> None:
    """A request continues its parent's conversation; a parent not in the trace (or
    none) starts one; a regenerated answer (its original's parent) joins it."""
    trace = _trace(
        chats=[10, 11, 12, 13, 14, 15],
        parents=[-1, 10, 99, 11, 10, 12],
        times=[0.0, 1.0, 2.0, 3.0, 4.0, 5.0],
    )
    assert conversations(trace) == [0, 0, 2, 0, 0, 2]


def test_a_pace_class_takes_its_categorys_curve_at_a_scaled_rate() -> None:
    params = CategoryParams(rate=0.05, p_reuse=0.8, life_s=0.1)
    doc = PolicyDocument(version=1, categories={"a": params})
    names = pace_names(["a", "b"])
    assert names[2 * CENTER] == f"a@p{CENTER}" and len(names) == 2 * (2 * PACE_STEPS + 1)
    policy = PacedWA(category_names=names, doc=doc)
    for pace in (0, CENTER, 2 * PACE_STEPS):
        scaled = params.model_copy(update={"rate": 0.05 * class_factor(pace)})
        assert policy._const_of(f"a@p{pace}") == log_weight(scaled)
    assert policy._const_of(f"a@p{CENTER}") == log_weight(params)
    assert policy._const_of(f"b@p{CENTER}") == log_weight(doc.default)
    assert policy._const_of("a") == log_weight(params)
    assert math.isclose(class_factor(CENTER + 2), 2.0)


def test_without_conversations_wa_pace_hits_as_wa_does() -> None:
    """No request has a parent: every block is in the middle class, ``wa``'s curve."""
    trace = _paced_trace(parents=False)
    options = ReplayOptions(refit_every_s=20.0)
    hits = {
        name: replay_hits(trace, catalog.create(name, 40, trace, options), 40, check=True)
        for name in ("wa", "wa-pace")
    }
    assert hits["wa"].sum() > 0
    assert np.array_equal(hits["wa"], hits["wa-pace"])


def test_wa_pace_keeps_quick_conversations_over_slow_ones() -> None:
    """Quick conversations (a turn every ~2 s) and slow ones (every ~60 s) share one
    category: ``wa`` keeps the freshest blocks, so each slow turn pushes quick
    conversations out; ``wa-pace`` files the slow ones at a slower rate and evicts them
    first."""
    trace = _paced_trace(parents=True)
    options = ReplayOptions(refit_every_s=20.0)
    hits = {
        name: replay_hits(trace, catalog.create(name, 40, trace, options), 40, check=True).sum()
        for name in ("wa", "wa-pace")
    }
    assert hits["wa-pace"] > 1.2 * hits["wa"], hits


def _paced_trace(*, parents: bool) -> Trace:
    """Four quick conversations and twenty slow ones, each re-sending its 8 blocks and
    one new one per turn, over 300 s (synthetic, made for this test)."""
    rng = np.random.default_rng(11)
    turns: list[tuple[float, int]] = []
    for conv in range(24):
        gap = 2.0 if conv < 4 else 60.0
        t = rng.uniform(0.0, gap)
        while t < 300.0:
            turns.append((t, conv))
            t += gap * rng.uniform(0.8, 1.2)
    turns.sort()
    chats, parent_of, last = [], [], dict[int, int]()
    hashes: list[int] = []
    for r, (_, conv) in enumerate(turns):
        chats.append(r)
        parent_of.append(last.get(conv, -1) if parents else -1)
        last[conv] = r
        hashes += [conv * 100 + j for j in range(8)] + [10_000 + r]
    return _trace(chats, parent_of, [t for t, _ in turns], hashes, blocks_per_request=9)


def _trace(
    chats: list[int],
    parents: list[int],
    times: list[float],
    hashes: list[int] | None = None,
    blocks_per_request: int = 1,
) -> Trace:
    n = len(chats)
    return Trace.from_arrays(
        name="pace-test",
        source_format="test",
        hash_ids=np.asarray(hashes if hashes is not None else range(n), dtype=np.int64),
        lengths=np.full(n, blocks_per_request, dtype=np.int64),
        timestamps=np.asarray(times, dtype=np.float64),
        types=["text"] * n,
        turns=np.full(n, 2, dtype=np.int64),
        chat_ids=np.asarray(chats, dtype=np.int64),
        parent_chat_ids=np.asarray(parents, dtype=np.int64),
    )

"""``wa-shared`` (replay only): shared prefixes found by fan-out, filed at their own rate."""

from __future__ import annotations

import math

import numpy as np
import pytest

from agent.reuse_classes import ReturnTracker
from controlplane.replay import catalog
from controlplane.replay.engine import replay_hits
from controlplane.replay.options import ReplayOptions
from controlplane.replay.shared_rate import (
    HALF_OCTAVES,
    MAX_READS,
    RATE_CLASS_NAMES,
    BlockHistory,
    SharedRateFiling,
    SharedRateReplayPolicy,
    SharedRateWA,
    rate_class,
    rate_class_const,
)
from controlplane.shadow.auto_replay import AutoReplayPolicy
from controlplane.shadow.estimator import MiniCache, ReuseClassing
from controlplane.shadow.rebuild import Request
from controlplane.traces.model import Trace


def test_a_rate_class_is_the_own_mean_gap_in_half_octaves_and_the_reads() -> None:
    index = rate_class(2, 0.0, 20.0)  # two reads in 20 s: 0.1 per second, 2^-3.5
    assert RATE_CLASS_NAMES[index] == "@rate-7@2"
    log_constant, rate = rate_class_const("@rate-7@2", 0.1) or (0.0, 0.0)
    assert math.isclose(rate, 2.0**-3.5)
    assert math.isclose(log_constant, math.log(3 / 4) + math.log(-math.expm1(-rate * 0.1)))
    assert RATE_CLASS_NAMES[rate_class(100, 0.0, 0.0)] == f"@rate{HALF_OCTAVES[-1]}@{MAX_READS}"
    assert RATE_CLASS_NAMES[rate_class(1, 0.0, 1e9)] == f"@rate{HALF_OCTAVES[0]}@1"
    assert rate_class_const("text_1/re", 0.1) is None


def test_a_fan_out_point_and_the_prefix_before_it_are_shared() -> None:
    history = BlockHistory(ghost_size=100)
    template = [1, 2, 3]
    for t, tail in enumerate((10, 11)):
        history.read([*template, tail], float(t))
    assert history.rate_class(3, 2.0) is None  # two ways on: a turn and what it left
    history.read([*template, 12], 2.0)
    for block in template:
        assert history.rate_class(block, 4.0) == rate_class(2, 0.0, 4.0)
    assert history.rate_class(12, 4.0) is None  # a tail read once, after the point


def test_a_conversation_that_grows_turn_by_turn_is_not_shared() -> None:
    """Each turn re-reads the history, leaves its partial last block behind and goes
    on: no block has three different next blocks."""
    history = BlockHistory(ghost_size=100)
    prompt: list[int] = []
    for turn in range(6):
        history.read([*prompt, 100 + turn], float(turn))  # 100 + turn: the partial block
        prompt += [10 * turn + 1, 10 * turn + 2]
    assert all(history.rate_class(block, 9.0) is None for block in prompt)


def test_a_block_past_the_ghost_is_forgotten() -> None:
    history = BlockHistory(ghost_size=1)
    for t, tail in enumerate((10, 11, 12)):
        history.read([1, tail], float(t))
    history.read([1], 3.0)
    assert history.rate_class(1, 4.0) is not None
    history.evicted([1])
    assert history.rate_class(1, 4.0) is not None  # in the ghost
    history.evicted([10])
    assert history.rate_class(1, 4.0) is None
    assert len(history) == 3  # 11 and 12 (cached), 10 (the ghost)


def test_wa_shared_keeps_slow_templates_that_wa_files_with_fast_returns() -> None:
    """One category: a busy template read every 0.5 s (each tail re-read once, half the
    time, 1 s later) and four slow templates of 20 blocks read every ~30 s. ``wa``'s
    return curve is the busy template's, so a slow template idle a few seconds ranks
    below fresh tails; ``wa-shared`` ranks it by its own reads."""
    trace = _templates_trace()
    hits = {
        name: replay_hits(trace, catalog.create(name, 120, trace, options), 120, check=True).sum()
        for name, options in (
            ("wa", ReplayOptions(reuse_class="hit", refit_every_s=20.0)),
            ("wa-shared", ReplayOptions(refit_every_s=20.0)),
        )
    }
    assert hits["wa-shared"] > hits["wa"] + 300, hits


def _templates_trace() -> Trace:
    """Synthetic, made for this test (600 s)."""
    rng = np.random.default_rng(5)
    requests: list[tuple[float, list[int]]] = []
    fresh = iter(range(1_000_000, 2_000_000))
    busy = list(range(100, 110))
    for step in range(1200):
        tail = [next(fresh), next(fresh)]
        requests.append((step * 0.5, busy + tail))
        if rng.random() < 0.5:
            requests.append((step * 0.5 + 1.0, busy + tail))
    for template in range(4):
        blocks = list(range(1000 * (template + 1), 1000 * (template + 1) + 20))
        t = rng.uniform(0.0, 30.0)
        while t < 600.0:
            requests.append((t, [*blocks, next(fresh), next(fresh)]))
            t += 30.0 * rng.uniform(0.8, 1.2)
    requests.sort(key=lambda request: request[0])
    n = len(requests)
    return Trace.from_arrays(
        name="templates",
        source_format="test",
        hash_ids=np.array([h for _, blocks in requests for h in blocks], dtype=np.int64),
        lengths=np.array([len(blocks) for _, blocks in requests], dtype=np.int64),
        timestamps=np.array([t for t, _ in requests], dtype=np.float64),
        types=["api"] * n,
        turns=np.ones(n, dtype=np.int64),
    )


def test_a_miniature_of_wa_shared_at_full_size_hits_as_its_replay_does() -> None:
    """The shadow's miniature (``MiniCache`` with reuse classes and the rate classes'
    filing) served every request at the cache's size, under the document the replay
    never refits, gives the replay's hits request by request."""
    trace = _templates_trace()
    capacity = 120
    never = ReplayOptions(refit_every_s=1e9)
    replayed = replay_hits(trace, catalog.create("wa-shared", capacity, trace, never), capacity)
    fitted = catalog.create("wa-shared", capacity, trace, never)
    assert isinstance(fitted, SharedRateReplayPolicy)
    names = fitted.inner.category_names
    classes = fitted.hit_classes
    assert classes is not None
    ghost = round(never.reuse_ghost * capacity)
    mini = MiniCache(
        SharedRateWA(capacity, category_names=names, doc=fitted.inner.policy),
        capacity,
        ReuseClassing(ReturnTracker(ghost), lambda code: code + classes.k),
        SharedRateFiling(BlockHistory(ghost), fitted.filing.first_rate_code, capacity),
    )
    codes = trace.categories.tolist()
    served = [
        mini.serve(Request(float(trace.timestamps[r]), codes[r], trace.request_blocks(r).tolist()))
        for r in range(trace.n_requests)
    ]
    assert served == replayed.tolist()
    assert sum(served) > 0


def test_auto_that_never_switches_serves_wa_shared() -> None:
    trace = _templates_trace()
    never = ReplayOptions(auto_wa="wa-shared", auto_min_accesses=10**12, refit_every_s=20.0)
    auto = catalog.create("auto", 120, trace, never)
    assert isinstance(auto, AutoReplayPolicy)
    alone = catalog.create("wa-shared", 120, trace, never)
    assert (replay_hits(trace, auto, 120) == replay_hits(trace, alone, 120)).all()
    assert not auto.switches
    assert isinstance(auto.shadow_caches[0].policy, SharedRateWA)


def test_auto_wa_shared_refuses_the_superseded_branch_rule() -> None:
    with pytest.raises(ValueError, match="does not run the superseded-branch rule"):
        ReplayOptions(auto_wa="wa-shared", auto_supersede="tree")
    with pytest.raises(ValueError, match="auto_wa must be wa or wa-shared"):
        ReplayOptions(auto_wa="shared")  # type: ignore[arg-type]

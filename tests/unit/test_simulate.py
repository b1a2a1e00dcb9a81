"""The serving simulator against its definitions: the cost model's prefill time, the
replay's hit ratios at low load, zero and infinite caches, pinned blocks, routers."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from controlplane.cli import app
from controlplane.replay import catalog
from controlplane.replay.accesses import AccessColumns
from controlplane.replay.engine import replay_hits
from controlplane.replay.online import FittedReplayPolicy
from controlplane.replay.options import ReplayOptions
from controlplane.replay.runner import ReplayJob, run_one
from controlplane.simulate import engine
from controlplane.simulate.cost import CostModel
from controlplane.simulate.engine import SimOptions, simulate
from controlplane.simulate.kv import InstanceCache
from controlplane.simulate.profiles import BUILTIN, DEFAULT_PROFILE
from controlplane.simulate.report import summarize
from controlplane.simulate.requests import Outcomes, Workload, workload
from controlplane.traces.arrays import I32, I64
from controlplane.traces.model import Trace
from controlplane.traces.synth import synthesize

PROFILE = BUILTIN[DEFAULT_PROFILE]


def spaced(trace: Trace, gap_s: float = 1e-3) -> Trace:
    """``trace`` with strictly increasing timestamps (no two requests tie)."""
    ts = trace.timestamps + np.arange(trace.n_requests) * gap_s
    return dataclasses.replace(trace, timestamps=ts)


@pytest.fixture(scope="module")
def toc() -> Trace:
    return spaced(synthesize("to-c", duration_s=90, qps=4, seed=5))


def quiet(**kw: object) -> SimOptions:
    """Arrivals so far apart that no two requests are ever in the engine together (times
    reach 1e7 s, so they compare to 1e-7 s)."""
    return SimOptions(speed=1e-5, **kw)  # type: ignore[arg-type]


def test_infinite_cache_no_load_ttft_is_the_cost_models_prefill(toc: Trace) -> None:
    work, out = simulate(toc, "inf", 0, quiet())
    cost = CostModel(PROFILE)
    assert (out.started == out.arrival).all()  # no queue
    for r in range(toc.n_requests):
        prompt = work.prompt_tokens[r]
        cached = min(int(out.hit_blocks[r]) * work.block_tokens, prompt - 1)
        assert out.cached_tokens[r] == cached
        want = cost.prefill_seconds(prompt - cached, cached)
        assert out.first_token[r] - out.started[r] == pytest.approx(want, abs=1e-7)
    ideal = replay_hits(toc, catalog.create("inf", 0, toc), 0)
    assert (out.hit_blocks == ideal).all()
    assert out.hit_blocks.sum() > 0


def test_long_prompts_are_chunked_by_the_step_budget() -> None:
    # 40 blocks of 512 tokens: 20,480 tokens, three steps of at most 8,192.
    trace = Trace.from_requests([list(range(40))], [0.0])
    trace = dataclasses.replace(trace, source_format="mooncake")
    work, out = simulate(trace, "lru", 100, quiet())
    cost = CostModel(PROFILE)
    one_step = cost.step_seconds(20_480, cost.chunk_pairs(20_480, 0), 20_480)
    chunked = cost.prefill_seconds(20_480, 0)
    assert work.prompt_tokens == [20_480]
    assert out.first_token[0] - out.started[0] == pytest.approx(chunked)
    assert chunked > one_step  # three step overheads and weight reads, not one


@pytest.mark.parametrize("speed", [1e-5, 50.0])
def test_zero_capacity_every_request_pays_full_prefill(toc: Trace, speed: float) -> None:
    work, out = simulate(toc, "lru", 0, SimOptions(speed=speed))
    cost = CostModel(PROFILE)
    assert out.hit_blocks.sum() == 0 and out.cached_tokens.sum() == 0
    ttft = out.first_token - out.started
    want = [cost.prefill_seconds(p, 0) for p in work.prompt_tokens]
    assert ttft == pytest.approx(want, abs=1e-7)
    if speed > 1:
        assert (out.started > out.arrival).any()  # the load was real


def test_low_load_hit_ratio_is_the_replays(toc: Trace) -> None:
    for name in catalog.names():
        for capacity in (300, 3000):
            want = run_one(toc, ReplayJob(name, capacity))
            work, out = simulate(toc, name, capacity, quiet())
            got = summarize(name, capacity, work, out, toc.lengths)
            assert (out.started == out.arrival).all(), name
            assert (got.hits, got.accesses) == (want.hits, want.accesses), (name, capacity)


@pytest.mark.parametrize("capacity", [3000, 10000])
def test_high_load_hit_ratio_falls_below_the_replays(toc: Trace, capacity: int) -> None:
    # Running requests pin their blocks and hold room for the blocks they compute, so
    # under load less of the cache is left for what finished requests leave behind.
    want = run_one(toc, ReplayJob("lru", capacity))
    work, out = simulate(toc, "lru", capacity, SimOptions(speed=10.0))
    got = summarize("lru", capacity, work, out, toc.lengths)
    assert got.queue.mean > 1.0
    assert got.hits < want.hits


def cache_of(trace: Trace, capacity: int) -> InstanceCache:
    policy = catalog.create("lru", capacity, trace)
    cats = trace.categories.tolist()
    offsets = trace.offsets.tolist()
    return InstanceCache(policy, capacity, trace.blocks, offsets, trace.n_unique, cats)


def test_running_requests_pin_their_blocks() -> None:
    trace = Trace.from_requests([[1, 2, 3], [1, 2, 3], [7, 8, 9, 10]])
    cache = cache_of(trace, 4)
    first = cache.lookup(0)
    cache.admit(0, first, 0.0)
    cache.computed(0)
    cache.release(0, 0.0)
    cache.trim()
    assert cache.cached[[0, 1, 2]].all() and len(cache.policy) == 3
    again = cache.lookup(1)  # request 1 reuses all three and pins them
    assert (again.hits, again.new_blocks, again.touch) == (3, 0, [0, 1, 2])
    cache.admit(1, again, 1.0)
    other = cache.lookup(2)  # four new blocks: 3 pinned + 4 > 4
    assert other.new_blocks == 4 and not cache.fits(other)
    cache.admit(2, other, 2.0)  # the engine does this only when 2 runs alone
    cache.computed(2)
    cache.release(2, 2.0)
    cache.trim()  # must evict, but only request 2's blocks are evictable
    assert cache.cached[[0, 1, 2]].all() and cache.pinned == 3
    assert len(cache.policy) + cache.working <= 4
    cache.release(1, 1.0)
    assert cache.pinned == 0 and cache.working == 0 and not cache.refs.any()


def test_only_the_leading_run_of_cached_blocks_is_hit() -> None:
    # An engine reuses a prefix: once a block misses, the rest of the prompt is
    # recomputed, cached or not (request 1 misses its first block, request 2 its second).
    trace = Trace.from_requests([[1, 2, 3, 4], [9, 2, 3, 4], [1, 8, 3, 4]], [0.0, 1.0, 2.0])
    cache = cache_of(trace, 100)
    cache.admit(0, cache.lookup(0), 0.0)
    cache.computed(0)
    cache.release(0, 0.0)
    assert [cache.lookup(r).hits for r in (1, 2)] == [0, 1]
    _, out = simulate(trace, "lru", 100, quiet())
    assert out.hit_blocks.tolist() == [0, 0, 1]
    assert out.cached_tokens.tolist() == [0, 0, 16]


def test_a_request_arriving_mid_decode_waits_at_most_one_step() -> None:
    requests = [list(range(10)), list(range(100, 110))]
    trace = Trace.from_arrays(
        name="two",
        source_format="bailian",
        hash_ids=np.array([b for r in requests for b in r], dtype=np.int64),
        lengths=np.array([10, 10], dtype=np.int64),
        timestamps=np.array([0.0, 1.0]),
        output_lengths=np.array([2000, 5], dtype=np.int64),
        input_lengths=np.array([160, 160], dtype=np.int64),
    )
    _, out = simulate(trace, "lru", 1000, SimOptions())
    cost = CostModel(PROFILE)
    step = cost.decode_seconds(1, 161 + 2000, 1)  # the longest step request 0 can take
    assert out.first_token[0] < 1.0 < out.finished[0]  # request 1 comes mid-decode
    assert 0 <= out.started[1] - out.arrival[1] < step
    assert out.finished[1] < out.finished[0]


def test_outcomes_summary_needs_finished_requests() -> None:
    work = Workload([0.0], [16], [1], 16, 1.0, 0.0)
    with pytest.raises(ValueError, match="never finished"):
        summarize("lru", 1, work, Outcomes.empty(work), np.array([1]))


@pytest.mark.parametrize(
    "replay",
    [
        ReplayOptions(reuse_class="hit"),
        ReplayOptions(reuse_class="trace"),
        ReplayOptions(depth="cost"),
    ],
)
def test_wa_with_classes_serves_requests_that_release_nothing(
    toc: Trace, replay: ReplayOptions
) -> None:
    """The simulator releases some requests' blocks in parts, some parts empty: every
    class split of ``wa`` takes them, under load (requests overlap)."""
    capacity = toc.n_unique // 10
    _, out = simulate(toc, "wa", capacity, SimOptions(speed=50.0, replay=replay))
    assert out.hit_blocks.sum() > 0
    assert (out.first_token >= out.arrival).all()


def test_reuse_classes_reach_the_fitter_only_once_a_request_has_released(
    toc: Trace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under load a request arrives (and a refit may fall due) before earlier ones finish:
    their reuse classes are decided at release, so the fitter must not take those accesses
    yet. It took them as first accesses: most reuses reached it in the wrong class."""
    fed: list[tuple[I64, I32]] = []
    made: list[FittedReplayPolicy] = []

    def recorded(*args: Any, **kwargs: Any) -> Any:
        policy = catalog.create(*args, **kwargs)
        assert isinstance(policy, FittedReplayPolicy)
        ingest = policy.refitter.ingest

        def ingest_recorded(cols: AccessColumns, at: slice | I64) -> None:
            fed.append((np.arange(len(cols))[at], cols.category[at].copy()))
            ingest(cols, at)

        policy.refitter.ingest = ingest_recorded  # type: ignore[method-assign]
        made.append(policy)
        return policy

    monkeypatch.setattr(engine, "catalog", SimpleNamespace(create=recorded))
    replay = ReplayOptions(reuse_class="hit", refit_every_s=5)
    simulate(toc, "wa", toc.n_unique // 10, SimOptions(speed=1.0, replay=replay))  # ~20 in flight
    classes = made[0].hit_classes
    assert classes is not None
    for request in range(toc.n_requests):  # the classes of all, final at the end
        classes.finished(request)
    final, _ = classes.released_columns()
    reused = len(classes.names) // 2
    assert sum(len(at) for at, _ in fed) > 0
    for at, categories in fed:
        assert (categories == final.category[at]).all()
    assert any((categories >= reused).any() for _, categories in fed)


def test_a_speed_that_puts_arrivals_past_a_floats_range_is_refused() -> None:
    """A positive, finite speed can still overflow the trace's span (a subnormal speed, or
    stamps near 1e308): arrivals at inf gave NaN TTFTs and QTTFTs, without a word."""
    trace = Trace.from_arrays(
        name="t",
        source_format="mooncake",
        hash_ids=np.arange(2, dtype=np.int64),
        lengths=np.ones(2, dtype=np.int64),
        timestamps=np.array([0.0, 1.5e308]),
    )
    with pytest.raises(ValueError, match=r"speed 0\.5 puts arrivals past a float's range"):
        simulate(trace, "lru", 4, SimOptions(speed=0.5))


def test_a_request_with_no_blocks_and_no_prompt_has_no_cached_tokens() -> None:
    # Only the Python API builds one: a trace file's request always has blocks.
    trace = Trace.from_requests([[], [1, 2]], [0.0, 1.0])
    work, out = simulate(trace, "lru", 100, quiet())
    assert work.prompt_tokens == [0, 32]
    assert out.cached_tokens.tolist() == [0, 0]
    assert (out.first_token >= out.started).all()


def test_an_output_no_engine_takes_is_refused_naming_the_trace_and_request(
    tmp_path: Path,
) -> None:
    """An ``output_length`` past 2^24 tokens (the reader takes any 64-bit count) was
    decoded as asked, while such a prompt was refused: 10^12 tokens never finished."""
    path = tmp_path / "long_output.jsonl"
    outputs = [1, 2**24, 2**24 + 1]
    path.write_text(
        "".join(
            json.dumps({"timestamp": t, "hash_ids": [1, 2], "input_length": 32, "output_length": n})
            + "\n"
            for t, n in enumerate(outputs)
        )
    )
    res = CliRunner().invoke(app, ["simulate", str(path), "-p", "lru", "--capacity", "4"])
    assert res.exit_code == 2, res.output
    said = f"error: {path}: request 2 asks for 16,777,217 output tokens (output_length)"
    assert res.stderr.startswith(said)
    assert len(res.stderr.strip().splitlines()) == 1
    trace = Trace.from_arrays(
        name="t",
        source_format="mooncake",
        hash_ids=np.arange(2, dtype=np.int64),
        lengths=np.ones(2, dtype=np.int64),
        timestamps=np.arange(2, dtype=np.float64),
        output_lengths=np.array(outputs[:2], dtype=np.int64),
    )
    assert workload(trace).output_tokens == [1, 2**24]

"""The load generator's pure parts: blocks -> token ids, the plan of a run, the summary's
distributions and the comparison of two runs (and its table at 80 columns). Sending is
tested over real HTTP in tests/e2e/test_bench_serve.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from controlplane.cli import app
from controlplane.loadgen.observe import CacheCounters
from controlplane.loadgen.plan import PlanOptions, plan_requests
from controlplane.loadgen.prompts import TokenSpace
from controlplane.loadgen.report import (
    COMPARED,
    SUMMARY_SCHEMA,
    compare,
    distribution,
    summarize,
)
from controlplane.loadgen.runner import BenchRun
from controlplane.traces.model import Trace


def test_a_block_is_the_same_tokens_wherever_it_appears_and_distinct_blocks_differ() -> None:
    space = TokenSpace(block_tokens=8, vocab=50, first_id=10)
    a = space.prompt(np.array([7, 8, 9]))
    b = space.prompt(np.array([7, 8, 11]))
    assert len(a) == 3 * 8 + 1 and a[-1] == space.tail_token
    assert list(a[:16]) == list(b[:16]) and list(a[16:24]) != list(b[16:24])
    tokens = space.block_token_ids(np.arange(-500, 500))
    assert tokens.min() >= 10 and tokens.max() < 50
    assert len({tuple(row) for row in tokens}) == 1000  # no two blocks alike
    # Deterministic across calls; the salt changes every block.
    assert list(space.prompt(np.array([7]))) == list(space.prompt(np.array([7])))
    salted = TokenSpace(block_tokens=8, vocab=50, first_id=10, salt=1)
    assert list(salted.block_token_ids(np.array([7]))[0]) != list(a[:8])


def test_token_space_rejects_an_empty_vocabulary() -> None:
    with pytest.raises(ValueError, match="fewer than two ids"):
        TokenSpace(vocab=11, first_id=10)
    with pytest.raises(ValueError, match="block_tokens"):
        TokenSpace(block_tokens=0)


def _trace(**kw: object) -> Trace:
    return Trace.from_requests(
        [[1, 2, 3], [1, 2, 4, 5, 6], [9]],
        timestamps=[10.0, 12.0, 16.0],
        **kw,  # type: ignore[arg-type]
    )


def test_plan_times_limit_cut_and_output_lengths() -> None:
    plan = plan_requests(_trace(), PlanOptions(speed=2.0, max_blocks=4, max_tokens=7))
    assert [p.send_at for p in plan] == [0.0, 1.0, 3.0]
    assert [list(p.hash_ids) for p in plan] == [[1, 2, 3], [1, 2, 4, 5], [9]]
    assert [p.cut_blocks for p in plan] == [0, 1, 0]
    assert [p.max_tokens for p in plan] == [7, 7, 7]  # no output lengths in the trace
    assert [p.category for p in plan] == [None] * 3  # unlabelled
    fast = plan_requests(_trace(), PlanOptions(speed=0, limit=2))
    assert [p.send_at for p in fast] == [0.0, 0.0]


def test_plan_sends_a_labelled_traces_categories_unless_told_not_to() -> None:
    labelled = _trace(types=["text", "text", "file"], turns=[1, 2, 1])
    assert [p.category for p in plan_requests(labelled, PlanOptions())] == [
        "text_1",
        "text_2",
        "file_1",
    ]
    quiet = plan_requests(labelled, PlanOptions(send_categories=False))
    assert [p.category for p in quiet] == [None] * 3


def test_a_speed_that_puts_a_send_past_a_floats_range_is_refused() -> None:
    """``--speed 1e-310`` (finite, above 0) put the second request's send at inf seconds:
    the run waited for ever."""
    with pytest.raises(ValueError, match="speed 1e-310 puts sends past a float's range"):
        plan_requests(_trace(), PlanOptions(speed=1e-310))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"speed": -1.0}, "speed"),
        ({"speed": float("inf")}, "speed"),
        ({"limit": 0}, "limit"),
        ({"max_blocks": 0}, "max_blocks"),
        ({"max_tokens": 0}, "max_tokens"),
    ],
)
def test_plan_options_are_checked(options: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PlanOptions(**options)  # type: ignore[arg-type]


def test_distribution_uses_observed_values() -> None:
    d = distribution([0.4, 0.1, 0.3, 0.2])
    assert d is not None
    assert (d["count"], d["p50"], d["p90"], d["max"]) == (4.0, 0.2, 0.4, 0.4)
    assert d["mean"] == pytest.approx(0.25)
    assert distribution([]) is None


def test_compare_reports_relative_change_and_refuses_other_files() -> None:
    a = {"schema": SUMMARY_SCHEMA, "requests": 10, "ttft_s": {"p50": 0.2}, "server": None}
    b = {"schema": SUMMARY_SCHEMA, "requests": 10, "ttft_s": {"p50": 0.1}, "server": None}
    rows = {r["key"]: r for r in compare(a, b)}
    assert rows["ttft_s.p50"]["change"] == pytest.approx(-0.5)
    assert rows["requests"]["change"] == 0.0
    assert rows["server.hit_ratio"]["a"] is None and rows["server.hit_ratio"]["change"] is None
    with pytest.raises(ValueError, match="B is not a bench summary"):
        compare(a, {"requests": 3})


@pytest.mark.parametrize(
    "after",
    [CacheCounters(hits=10.0, queries=30.0), CacheCounters(hits=150.0, queries=20.0)],
    ids=["both-down", "queries-down"],
)
def test_counters_that_go_down_during_a_run_give_no_hit_ratio_and_say_why(
    after: CacheCounters,
) -> None:
    # The server restarted: its counters began again from 0 (a negative or garbage ratio).
    before = CacheCounters(hits=100.0, queries=200.0)
    run = BenchRun([], started_at=0.0, wall_s=1.0, counters_before=before, counters_after=after)
    server = summarize(run, {})["server"]
    assert server["hit_ratio"] is None
    assert server["prefix_cache_hits"] is None and server["prefix_cache_queries"] is None
    assert "went down during the run" in server["error"]
    steady = BenchRun([], 0.0, 1.0, before, CacheCounters(hits=130.0, queries=260.0))
    assert summarize(steady, {})["server"] == {
        "prefix_cache_hits": 30.0,
        "prefix_cache_queries": 60.0,
        "hit_ratio": 0.5,
    }


def test_compare_keeps_every_row_on_one_line_at_80_columns(tmp_path: Path) -> None:
    """``hit ratio (server counters)`` wrapped over two lines at 80 columns."""
    rng = np.random.default_rng(0)
    n = 100
    wide = {"mean": 1.3107, "p50": 12.3456, "p90": 9.9999, "p99": 1234.5678, "max": 1500.0}

    def summary(shift: float) -> dict[str, Any]:
        ttft = rng.uniform(0.01, 0.2, n) * shift
        per_request = {
            "index": list(range(n)),
            "ttft_s": ttft.tolist(),
            "prompt_tokens": [1000] * n,
            "cached_tokens": rng.integers(0, 1000, n).tolist(),
        }
        return {
            "schema": SUMMARY_SCHEMA, "requests": 1_200_000, "errors": 10_000,
            "hit_ratio": 0.5, "server": {"hit_ratio": 0.4},
            "ttft_s": wide, "latency_s": wide, "queue_wait_s": wide,
            "output_tokens_per_s": 123_456.7, "wall_s": 12_345.6, "per_request": per_request,
        }  # fmt: skip

    paths = [tmp_path / "a.json", tmp_path / "b.json"]
    for path, shift in zip(paths, (1.0, 2.5), strict=True):
        path.write_text(json.dumps(summary(shift)))
    res = CliRunner().invoke(
        app, ["bench", "serve", "--compare", *map(str, paths)], env={"COLUMNS": "80"}
    )
    assert res.exit_code == 0, res.output
    body = [line for line in res.stdout.splitlines() if line.startswith("│")]
    assert [line.split("│")[1].strip() for line in body] == [label for label, _, _ in COMPARED]
    assert max(len(line) for line in res.stdout.splitlines()) <= 80
    assert "%" in body[2].split("│")[-2]  # the interval column is there, whole

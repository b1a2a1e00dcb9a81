"""The paired bootstrap of two bench runs: an interval that holds a real change, holds
zero when the runs differ by noise only, and is absent when it cannot be drawn."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from controlplane.loadgen import paired
from controlplane.loadgen.client import RequestResult
from controlplane.loadgen.paired import MIN_PAIRS, change_intervals, per_request
from controlplane.loadgen.report import SUMMARY_SCHEMA, compare


def _run(
    ttft: np.ndarray, cached: np.ndarray, order: np.ndarray | None = None
) -> dict[str, list[int] | list[float]]:
    indices = range(len(ttft)) if order is None else order
    results = [
        RequestResult(
            index=int(i),
            category=None,
            scheduled_s=0.0,
            ttft_s=float(ttft[i]),
            prompt_tokens=100,
            cached_tokens=int(cached[i]),
        )
        for i in indices
    ]
    return per_request(results)


def test_a_real_change_is_inside_its_interval_and_zero_is_not() -> None:
    rng = np.random.default_rng(1)
    base = rng.lognormal(-2.0, 0.8, size=400)  # long prompts slow in both runs
    cached = rng.integers(0, 60, size=400)
    a = _run(base * rng.normal(1.0, 0.05, size=400), cached)
    faster = base * 0.8 * rng.normal(1.0, 0.05, size=400)
    more_hits = np.minimum(cached + 10, 100)
    # B lists its requests in another order: pairs are made by trace index.
    b = _run(faster, more_hits, order=rng.permutation(400))
    intervals = change_intervals(a, b)
    lo, hi = intervals["ttft_s.mean"]
    assert lo < -0.2 + 0.02 and hi > -0.2 - 0.02 and hi < 0
    lo, hi = intervals["hit_ratio"]
    true_change = more_hits.sum() / cached.sum() - 1
    assert lo < true_change < hi and lo > 0
    assert set(intervals) == {"hit_ratio", "ttft_s.mean", "ttft_s.p50", "ttft_s.p90"}


def test_noise_alone_gives_an_interval_around_zero() -> None:
    rng = np.random.default_rng(2)
    base, cached = rng.lognormal(-2.0, 0.8, size=300), rng.integers(0, 60, size=300)
    a = _run(base * rng.normal(1.0, 0.05, size=300), cached)
    b = _run(base * rng.normal(1.0, 0.05, size=300), cached)
    for key, (lo, hi) in change_intervals(a, b).items():
        assert lo <= 0 <= hi, key


def test_no_interval_without_enough_shared_requests() -> None:
    ttft, cached = np.full(MIN_PAIRS, 0.1), np.full(MIN_PAIRS, 10)
    a = _run(ttft, cached)
    assert change_intervals(a, _run(ttft[:-1], cached[:-1])) == {}
    assert change_intervals(a, None) == {}
    assert change_intervals({"index": [1.0], "ttft_s": "cut"}, a) == {}


def test_compare_puts_the_intervals_on_their_rows() -> None:
    rng = np.random.default_rng(3)
    ttft, cached = rng.lognormal(-2.0, 0.5, size=100), rng.integers(0, 60, size=100)
    a = {"schema": SUMMARY_SCHEMA, "ttft_s": {"mean": 0.2}, "per_request": _run(ttft, cached)}
    b = {"schema": SUMMARY_SCHEMA, "ttft_s": {"mean": 0.1}, "per_request": _run(ttft / 2, cached)}
    rows = {r["key"]: r for r in compare(a, b)}
    lo, hi = rows["ttft_s.mean"]["interval"]  # the TTFTs kept to the microsecond
    assert lo == pytest.approx(-0.5, abs=1e-4) and hi == pytest.approx(-0.5, abs=1e-4)
    assert rows["latency_s.mean"]["interval"] is None  # not drawn for latency
    assert rows["ttft_s.p99"]["interval"] is None  # nor for p99


def test_the_draws_memory_is_bounded_however_many_requests(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Fifty draws of every pair were held at once: about 2 KB a request, gigabytes for
    the million-request summaries ``--compare`` reads. A bound on the bytes of one chunk
    of draws now holds at any size."""
    import tracemalloc

    from controlplane.loadgen import paired

    bound = 2 << 20
    monkeypatch.setattr(paired, "MAX_DRAW_BYTES", bound, raising=False)
    rng = np.random.default_rng(1)
    n = 5000
    a = _run(rng.random(n), rng.integers(0, 100, n))
    b = _run(rng.random(n), rng.integers(0, 100, n))
    tracemalloc.start()
    try:
        intervals = change_intervals(a, b)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert set(intervals) == {"hit_ratio", "ttft_s.mean", "ttft_s.p50", "ttft_s.p90"}
    assert peak < 2 * bound, f"peak {peak:,} bytes"


def _plain_bootstrap(a: dict[str, Any], b: dict[str, Any], seed: int) -> dict[str, Any]:
    """The bootstrap as written first: the same picks, each draw's pairs gathered and
    its quantiles taken by numpy (a partial sort a draw)."""
    cols = ("ttft_s", "prompt_tokens", "cached_tokens")
    rows_a, rows_b = (np.array([run[c] for c in cols], dtype=np.float64) for run in (a, b))
    n = rows_a.shape[1]
    picks = np.random.default_rng(seed).integers(0, n, size=(paired.DRAWS, n))

    def stats(rows: np.ndarray) -> dict[str, np.ndarray]:
        ttft, prompt, cached = (row[picks] for row in rows)
        return {
            "hit_ratio": cached.sum(axis=1) / prompt.sum(axis=1),
            "ttft_s.mean": ttft.mean(axis=1),
            "ttft_s.p50": np.quantile(ttft, 0.5, axis=1),
            "ttft_s.p90": np.quantile(ttft, 0.9, axis=1),
        }

    of_a, of_b = stats(rows_a), stats(rows_b)
    tail = (1 - paired.LEVEL) / 2 * 100  # 2.5, to the float change_intervals uses
    return {
        key: tuple(np.percentile((of_b[key] - of_a[key]) / of_a[key], [tail, 100 - tail]))
        for key in of_a
    }


@pytest.mark.parametrize("n", [MIN_PAIRS, 101, 2000])
def test_counting_the_picks_gives_the_plain_bootstraps_intervals(n: int) -> None:
    """Draws as counts (no sort a draw: 1,000 sorts of every request took minutes at
    400,000) are the plain bootstrap's, pick for pick: quantiles exactly, sums to
    rounding."""
    rng = np.random.default_rng(n)
    a = _run(np.round(rng.lognormal(-2.0, 1.0, n), 6), rng.integers(1, 60, n))
    b = _run(np.round(rng.lognormal(-2.1, 1.0, n), 6), rng.integers(1, 60, n))
    want = _plain_bootstrap(a, b, seed=5)
    got = change_intervals(a, b, seed=5)
    for key in ("ttft_s.p50", "ttft_s.p90"):
        assert got[key] == want[key], key
    for key in ("hit_ratio", "ttft_s.mean"):
        assert got[key] == pytest.approx(want[key], rel=1e-12), key
    assert change_intervals(a, b, seed=5) == got  # the seed makes it reproducible


def test_no_draw_is_sorted(monkeypatch: pytest.MonkeyPatch) -> None:
    """A quantile a draw sorted (partially) every request 1,000 times: 137 s at 400,000
    requests, most of an hour at the largest summary ``--compare`` reads. The runs are
    each sorted once; the draws only count."""

    def refused(*args: object, **kwargs: object) -> None:
        raise AssertionError("a draw was sorted")

    for name in ("quantile", "sort", "partition"):
        monkeypatch.setattr(np, name, refused)
    rng = np.random.default_rng(4)
    a = _run(rng.random(500), rng.integers(0, 100, 500))
    b = _run(rng.random(500), rng.integers(0, 100, 500))
    assert set(change_intervals(a, b)) == set(paired.KEYS)

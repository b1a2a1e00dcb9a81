"""`kvwise replay` on a Mooncake trace follows the replay semantics to the block.

The reference here is written from docs/replay.md's words alone, deliberately naive and
independent of the project: the file is read with the standard library, requests are
sorted by timestamp with Python's stable sort, the cache holds raw hash ids in a plain
dict, and every block is handled one at a time. Its per-request hit counts must equal
``controlplane.replay.engine.replay_hits`` and its totals what ``kvwise replay --json``
prints, for LRU at several capacities and for the infinite cache.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from controlplane.cli import app
from controlplane.replay import catalog
from controlplane.replay.engine import replay_hits
from controlplane.traces.model import Trace
from controlplane.traces.reader import load_trace

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "mooncake_synthetic.jsonl.gz"
CAPACITIES = (0, 500, 2000, 8000, 30000)  # the sample has 43,924 unique blocks


def read_requests(path: Path) -> list[list[int]]:
    """Hash ids per request in replay order: by timestamp, file order breaking ties."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    rows.sort(key=lambda row: row["timestamp"])  # list.sort is stable
    return [row["hash_ids"] for row in rows]


def cached_prefix(request: list[int], cached: Any) -> int:
    """How many leading blocks are cached: block i counts only if 0..i-1 do."""
    n = 0
    while n < len(request) and request[n] in cached:
        n += 1
    return n


def reference_lru(requests: list[list[int]], capacity: int) -> list[int]:
    """LRU by the book. ``cache`` maps each cached block to None in recency order: the
    first key is the least recently released block, the next victim."""
    cache: dict[int, None] = {}
    hits = []
    for request in requests:
        hits.append(cached_prefix(request, cache))
        # Every block is accessed, then released tail first (as vLLM frees them): the
        # head is released last, so it is the most recent and evicted last.
        for block in reversed(request):
            cache.pop(block, None)
            cache[block] = None
        while len(cache) > capacity:
            del cache[next(iter(cache))]
    return hits


def reference_inf(requests: list[list[int]]) -> list[int]:
    """An infinite cache: every block ever seen stays."""
    seen: set[int] = set()
    hits = []
    for request in requests:
        hits.append(cached_prefix(request, seen))
        seen.update(request)
    return hits


@pytest.fixture(scope="module")
def requests() -> list[list[int]]:
    return read_requests(SAMPLE)


@pytest.fixture(scope="module")
def trace() -> Trace:
    return load_trace(SAMPLE)


@pytest.fixture(scope="module")
def cli_results() -> dict[tuple[str, int], dict[str, Any]]:
    caps = ",".join(map(str, CAPACITIES))
    args = ["replay", str(SAMPLE), "-p", "lru,inf", "--capacity", caps, "--json", "--jobs", "1"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert (doc["requests"], doc["accesses"], doc["unique_blocks"]) == (3993, 121_877, 43_924)
    assert doc["skipped_lines"] == 0
    return {(r["policy"], r["capacity"]): r for r in doc["results"]}


def test_reference_reads_the_same_trace(requests: list[list[int]], trace: Trace) -> None:
    assert len(requests) == trace.n_requests
    for r in (0, 1, 1000, len(requests) - 1):
        assert trace.hashes[trace.request_blocks(r)].tolist() == requests[r]


@pytest.mark.parametrize("capacity", CAPACITIES)
def test_lru_hits_match_the_reference_per_request(
    capacity: int,
    requests: list[list[int]],
    trace: Trace,
    cli_results: dict[tuple[str, int], dict[str, Any]],
) -> None:
    expected = reference_lru(requests, capacity)
    got = replay_hits(trace, catalog.create("lru", capacity, trace), capacity)
    assert got.tolist() == expected
    total = sum(expected)
    assert total == 0 if capacity == 0 else total > 0
    cli = cli_results[("lru", capacity)]
    assert (cli["hits"], cli["accesses"]) == (total, 121_877)
    assert cli["hit_ratio"] == pytest.approx(total / 121_877)
    assert cli["per_category"]["unknown"]["hits"] == total


def test_lru_reference_is_not_trivial(requests: list[list[int]]) -> None:
    totals = [sum(reference_lru(requests, c)) for c in (500, 30000)]
    # A bigger cache must find more prefixes here, and never more than the ideal.
    assert 0 < totals[0] < totals[1] <= sum(reference_inf(requests))


def test_inf_hits_match_the_reference_per_request(
    requests: list[list[int]],
    trace: Trace,
    cli_results: dict[tuple[str, int], dict[str, Any]],
) -> None:
    expected = reference_inf(requests)
    got = replay_hits(trace, catalog.create("inf", 0, trace), 0)
    assert got.tolist() == expected
    total = sum(expected)
    for capacity in CAPACITIES:  # the ideal ignores capacity
        assert cli_results[("inf", capacity)]["hits"] == total
    # The ideal is a bound: no LRU capacity beats it, request by request.
    lru = np.array(reference_lru(requests, CAPACITIES[-1]))
    assert np.all(lru <= np.array(expected))

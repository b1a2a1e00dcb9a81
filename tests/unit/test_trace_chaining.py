"""Prefix-chained ids: a trace whose ids hash each block alone is re-chained on reading and
replays with a prefix cache's hits; a chained trace reads unchanged, every replay figure
the same as after re-chaining it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import orjson
import pytest
from typer.testing import CliRunner

from controlplane.cli import app
from controlplane.replay import catalog
from controlplane.replay.engine import replay_hits
from controlplane.traces.chaining import prefix_chained, rechain_by_prefix
from controlplane.traces.model import RechainResult, Trace
from controlplane.traces.reader import load_trace
from controlplane.traces.synth import synthesize
from controlplane.traces.writer import write_bailian

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "mooncake_synthetic.jsonl.gz"

CONTENT_HASHED = [[1, 2, 1], [2, 1], [1, 2, 1, 2], [2, 1]]
"""Two block contents, 1 and 2, hashed each on its own: ids repeat inside requests 0 and 2,
and both follow none in one request and a block in another."""
PREFIX_CACHE_HITS = [0, 0, 3, 2]
"""What an unbounded prefix cache finds, request by request: request 1's (2) and (2, 1)
were never seen (with content ids, both would hit); request 2 finds (1), (1, 2),
(1, 2, 1) from request 0, not (1, 2, 1, 2); request 3 finds request 1's two blocks."""
DISTINCT_PREFIXES = 6  # (1) (1,2) (1,2,1) (2) (2,1) (1,2,1,2)


def _mooncake_file(path: Path, requests: list[list[int]]) -> Path:
    lines = [
        {"timestamp": 1000 * i, "input_length": 16 * len(r), "output_length": 1, "hash_ids": r}
        for i, r in enumerate(requests)
    ]
    path.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))
    return path


def _hits(trace: Trace, policy: str, capacity: int) -> list[int]:
    return replay_hits(trace, catalog.create(policy, capacity, trace), capacity).tolist()


def test_a_content_hashed_trace_is_rechained_and_replays_as_a_prefix_cache(
    tmp_path: Path,
) -> None:
    trace = load_trace(_mooncake_file(tmp_path / "content.jsonl", CONTENT_HASHED))
    assert trace.rechained == RechainResult(ids_after_several_blocks=2, requests_repeating_an_id=2)
    assert trace.n_unique == DISTINCT_PREFIXES
    assert [trace.request_blocks(r).tolist() for r in range(4)] == [
        [0, 1, 2],
        [3, 4],
        [0, 1, 2, 5],
        [3, 4],
    ]
    assert trace.hashes.tolist() == list(range(DISTINCT_PREFIXES))
    assert _hits(trace, "inf", 0) == PREFIX_CACHE_HITS
    # Room for every prefix: lru evicts nothing, so it hits as the unbounded cache does.
    assert _hits(trace, "lru", DISTINCT_PREFIXES) == PREFIX_CACHE_HITS


def test_an_id_after_two_prefixes_is_rechained_without_a_repeat(tmp_path: Path) -> None:
    """Block 2 after 1 and after 3: no id repeats, yet the second 2 is no prefix hit."""
    trace = load_trace(_mooncake_file(tmp_path / "t.jsonl", [[1, 2], [3, 2], [1, 2]]))
    assert trace.rechained == RechainResult(ids_after_several_blocks=1, requests_repeating_an_id=0)
    assert _hits(trace, "inf", 0) == [0, 0, 2]


def test_rechained_ids_are_the_distinct_prefixes_and_the_counts_are_exact() -> None:
    """Random small traces of five block contents: two accesses share an id exactly when
    their whole prefixes are equal, and ``rechained`` counts what a plain reading finds."""
    rng = np.random.default_rng(1)
    for _ in range(200):
        n = int(rng.integers(1, 8))
        requests = [rng.integers(0, 5, size=int(rng.integers(1, 7))).tolist() for _ in range(n)]
        trace = prefix_chained(Trace.from_requests(requests))
        prefix_of: dict[int, tuple[int, ...]] = {}
        for r, ids in enumerate(requests):
            for i, block in enumerate(trace.request_blocks(r).tolist()):
                assert prefix_of.setdefault(block, tuple(ids[: i + 1])) == tuple(ids[: i + 1])
        assert trace.n_unique == len(set(prefix_of.values()))
        before: dict[int, set[int | None]] = {}
        for ids in requests:
            for i, h in enumerate(ids):
                before.setdefault(h, set()).add(ids[i - 1] if i else None)
        several = sum(len(blocks) > 1 for blocks in before.values())
        repeating = sum(len(set(ids)) < len(ids) for ids in requests)
        want = None if several == 0 else RechainResult(several, repeating)
        assert trace.rechained == want, requests


def _synthetic_to_c(tmp_path: Path) -> Path:
    path = tmp_path / "to_c.jsonl"
    write_bailian(synthesize("to-c", duration_s=300, qps=4, seed=5), path)
    return path


@pytest.mark.parametrize("make", [lambda _: SAMPLE, _synthetic_to_c], ids=["mooncake", "to-c"])
def test_a_chained_trace_reads_unchanged_and_rechaining_changes_no_figure(
    tmp_path: Path, make: object
) -> None:
    trace = load_trace(make(tmp_path))  # type: ignore[operator]
    assert trace.rechained is None
    forced = rechain_by_prefix(trace)
    assert np.array_equal(forced.blocks, trace.blocks)  # the same blocks, the same numbers
    assert prefix_chained(trace) is trace
    for policy in ("lru", "s3fifo", "belady", "inf"):
        for share in (0.05, 0.3):
            capacity = trace.capacity_for(share)
            assert _hits(forced, policy, capacity) == _hits(trace, policy, capacity)


def test_the_cli_says_once_that_ids_were_rechained_and_the_json_records_it(
    tmp_path: Path,
) -> None:
    path = _mooncake_file(tmp_path / "content.jsonl", CONTENT_HASHED)
    args = ["replay", str(path), "-p", "inf", "--capacity", "6", "--json"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    said = " ".join(res.stderr.split())
    assert said.count("hash_ids are not prefix-chained") == 1
    assert "(2 ids follow more than one block, 2 requests repeat an id)" in said
    doc = json.loads(res.stdout)
    assert doc["rechained"] == {"ids_after_several_blocks": 2, "requests_repeating_an_id": 2}
    assert doc["results"][0]["hits"] == sum(PREFIX_CACHE_HITS)

    chained = CliRunner().invoke(app, [*args[:1], str(SAMPLE), *args[2:]])
    assert chained.exit_code == 0, chained.output
    assert json.loads(chained.stdout)["rechained"] is None
    assert "prefix-chained" not in chained.stderr


def test_trace_stats_json_records_a_rechaining_too(tmp_path: Path) -> None:
    path = _mooncake_file(tmp_path / "content.jsonl", CONTENT_HASHED)
    res = CliRunner().invoke(app, ["trace", "stats", str(path), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["rechained"] == {"ids_after_several_blocks": 2, "requests_repeating_an_id": 2}
    chained = CliRunner().invoke(app, ["trace", "stats", str(SAMPLE), "--json"])
    assert json.loads(chained.stdout)["rechained"] is None

"""Recorded requests -> a Bailian trace: category names as type and turn, hashes renumbered
in order of first sight (shared prefixes stay shared), times from the first request, and
a request whose blocks repeat a hash refused."""

from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np
import pytest

from controlplane.traces.reader import load_trace
from controlplane.traces.recorded import NO_TURN, RecordedRequests, type_and_turn
from controlplane.traces.writer import write_bailian


@pytest.mark.parametrize(
    ("category", "want"),
    [
        ("text_2", ("text", 2)),
        ("my_api_1", ("my_api", 1)),
        ("t2_n1", ("n1", 2)),
        ("t12_n0", ("n0", 12)),
        ("default", ("default", NO_TURN)),
        ("other", ("other", NO_TURN)),
        ("_3", ("_3", NO_TURN)),
        ("chat_x", ("chat_x", NO_TURN)),
    ],
)
def test_a_category_reads_as_type_and_turn(category: str, want: tuple[str, int]) -> None:
    assert type_and_turn(category) == want


def test_recorded_requests_write_a_trace_the_reader_reads(tmp_path: Path) -> None:
    rec = RecordedRequests()
    big = 2**62
    assert rec.add(100.5, "text_1", [big, big + 1])
    assert rec.add(100.0, "t1_n0", [7, 8, 9])  # earlier: a worker's clock order, not arrival
    assert rec.add(101.0, "text_2", [big, big + 1, 5])
    assert not rec.add(102.0, "text_1", [4, 4])
    assert len(rec) == 3 and rec.refused == 1

    path = tmp_path / "r.jsonl"
    write_bailian(rec.trace("r", block_tokens=16), path)
    got = load_trace(path)
    assert got.timestamps.tolist() == [0.0, 0.5, 1.0]
    assert [got.category_names[c] for c in got.categories] == ["n0_1", "text_1", "text_2"]
    assert [got.request_blocks(r).tolist() for r in range(3)] == [[0, 1, 2], [3, 4], [3, 4, 5]]
    assert sorted(got.hashes.tolist()) == [0, 1, 2, 3, 4, 5]  # small ids in the file
    assert got.input_lengths.tolist() == [48, 32, 48]
    assert np.all(got.output_lengths == 0) and got.chat_ids.tolist() == [0, 1, 2]


def test_a_recording_is_bounded_unless_asked_not_to_be() -> None:
    """Every request is held until the end: with no --max-requests a long recording must
    still stop before it takes the host's memory."""
    from controlplane.cli.trace_record_cmd import MAX_REQUESTS, record

    default = inspect.signature(record).parameters["max_requests"].default
    assert default == MAX_REQUESTS > 0

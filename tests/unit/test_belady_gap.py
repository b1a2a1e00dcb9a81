"""The Belady-gap benchmark sorts each access by reuse gap and by whose blocks it reads."""

from __future__ import annotations

import numpy as np

from controlplane.traces.model import Trace
from tests.bench.belady_gap import access_rows, hit_flags, row_label


def two_conversations() -> Trace:
    """Chat 1 (blocks 1-3), its next turn 5 s later (1-4), then chat 2 sharing block 1
    70 s later (1, 9)."""
    requests = [[1, 2, 3], [1, 2, 3, 4], [1, 9]]
    return Trace.from_arrays(
        name="two",
        source_format="inline",
        hash_ids=np.array([h for r in requests for h in r], dtype=np.int64),
        lengths=np.array([len(r) for r in requests], dtype=np.int64),
        timestamps=np.array([0.0, 5.0, 75.0]),
        chat_ids=np.array([1, 2, 3], dtype=np.int64),
        parent_chat_ids=np.array([-1, 1, -1], dtype=np.int64),
    )


def test_each_access_gets_its_gap_row_and_kind() -> None:
    gap_row, shared = access_rows(two_conversations())
    # first accesses -1; the next turn's reuses 5 s later (row 1); block 1 after 70 s
    # (row 3), read by another conversation: shared.
    assert gap_row.tolist() == [-1, -1, -1, 1, 1, 1, -1, 3, -1]
    assert shared.tolist() == [False] * 7 + [True, False]
    assert [row_label(r) for r in (0, 1, 3, 4)] == ["0-1 s", "1-10 s", "60-300 s", ">= 300 s"]


def test_a_requests_hits_are_its_first_blocks() -> None:
    flags = hit_flags(two_conversations(), np.array([0, 2, 1], dtype=np.int64))
    assert flags.tolist() == [False, False, False, True, True, False, False, True, False]

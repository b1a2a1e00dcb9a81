"""Per-worker sequence accounting of ingest: gaps, late arrivals, resent duplicates."""

from __future__ import annotations

from controlplane.service import ingest
from controlplane.service.ingest import _Sequence


def test_in_order_has_no_gap() -> None:
    s = _Sequence()
    assert all(s.add(i) for i in range(1, 6))
    assert s.missing == 0
    assert (s.floor, s.above) == (5, set())


def test_a_gap_then_the_late_batch_fills_it() -> None:
    s = _Sequence()
    for i in (1, 2, 4, 5):
        s.add(i)
    assert s.missing == 1
    assert s.add(3)
    assert s.missing == 0
    assert s.floor == 5


def test_a_first_batch_beyond_one_counts_what_never_arrived() -> None:
    s = _Sequence()
    s.add(4)
    assert s.missing == 3


def test_a_resent_batch_is_reported_as_duplicate() -> None:
    s = _Sequence()
    s.add(1)
    s.add(3)
    assert not s.add(1)  # below the floor
    assert not s.add(3)  # above the first gap, already seen
    assert s.missing == 1


def test_memory_is_bounded_and_written_off_gaps_stay_counted(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(ingest, "MAX_OUT_OF_ORDER", 3)
    s = _Sequence()
    s.add(1)
    for i in (3, 5, 7, 9):  # gaps at 2, 4, 6, 8
        s.add(i)
    assert len(s.above) <= 3
    assert s.missing == 4
    assert s.floor == 3  # the gap at 2 was written off to make room
    assert not s.add(2)  # if it arrives after all, it is not applied a second time
    assert s.missing == 4

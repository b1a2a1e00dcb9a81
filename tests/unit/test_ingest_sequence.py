"""Per-worker sequence accounting of ingest: gaps, late arrivals, resent duplicates, and a
ledger that survives its stored form (so a restart does not move the gap gauge)."""

from __future__ import annotations

from agent.wire import decode_batch, encode_batch
from controlplane.service.ledger import (
    EPOCHS_KEPT,
    HASH_FIELDS,
    MAX_HASH_FIELDS,
    MAX_OUT_OF_ORDER,
    SequenceTracker,
    WorkerLedger,
    hash_field_bytes,
)
from tests.ledger_samples import fullest_ledger, longest_epochs
from tests.wire_samples import event_batch


def test_in_order_has_no_gap() -> None:
    s = SequenceTracker()
    assert all(s.add(i) for i in range(1, 6))
    assert s.missing == 0
    assert (s.floor, s.above) == (5, set())


def test_a_gap_then_the_late_batch_fills_it() -> None:
    s = SequenceTracker()
    for i in (1, 2, 4, 5):
        s.add(i)
    assert s.missing == 1
    assert s.add(3)
    assert s.missing == 0
    assert s.floor == 5


def test_a_first_batch_beyond_one_counts_what_never_arrived() -> None:
    s = SequenceTracker()
    s.add(4)
    assert s.missing == 3


def test_a_resent_batch_is_reported_as_duplicate() -> None:
    s = SequenceTracker()
    s.add(1)
    s.add(3)
    assert not s.add(1)  # below the floor
    assert not s.add(3)  # above the first gap, already seen
    assert s.missing == 1


def test_memory_is_bounded_and_written_off_gaps_stay_counted() -> None:
    s = SequenceTracker(max_out_of_order=3)
    s.add(1)
    for i in (3, 5, 7, 9):  # gaps at 2, 4, 6, 8
        s.add(i)
    assert len(s.above) <= 3
    assert s.missing == 4
    assert s.floor == 3  # the gap at 2 was written off to make room
    assert not s.add(2)  # if it arrives after all, it is not applied a second time
    assert s.missing == 4


def test_the_ledger_round_trips_through_its_stored_form() -> None:
    ledger = WorkerLedger("w1", max_out_of_order=8)
    for seq in (1, 2, 5, 6):
        ledger.see("e1", seq)
    ledger.counts.events = 123
    ledger.counts.clock_rejected = 4
    stored = {k.encode(): v.encode() for k, v in ledger.to_hash().items()}
    again = WorkerLedger.from_hash("w1", stored, max_out_of_order=8)
    assert again.missing == ledger.missing == 2
    assert again.counts == ledger.counts
    assert not again.see("e1", 5)  # seen before the "restart"
    assert again.see("e1", 3) and again.missing == 1


def test_old_epochs_are_forgotten() -> None:
    ledger = WorkerLedger("w1")
    for i in range(EPOCHS_KEPT + 2):
        ledger.see(f"e{i}", 2)  # each epoch misses its batch 1
    assert len(ledger.epochs) == EPOCHS_KEPT
    assert ledger.missing == EPOCHS_KEPT


def test_the_fullest_ledger_ingest_can_write_is_stored_within_its_read_bounds() -> None:
    """The bounds a ledger is read back within (``hash_field_bytes``) must hold the largest
    one ingest writes: every kept epoch as long as a batch may carry (all but a character
    escaped in JSON) with ``max_out_of_order`` sequence numbers of 19 digits above its
    floor, and counts as large; else a worker's ledger would be refused at every start."""
    for epoch in longest_epochs():
        assert (
            decode_batch(
                encode_batch(
                    event_batch(epoch=epoch, ts=1.0, block=1, category=0, offset=0, kind=1)
                )
            ).epoch
            == epoch
        )
    ledger = fullest_ledger()
    stored = ledger.to_hash()
    assert tuple(stored) == HASH_FIELDS and len(HASH_FIELDS) <= MAX_HASH_FIELDS
    assert len(ledger.epochs) == EPOCHS_KEPT
    assert all(len(t.above) == MAX_OUT_OF_ORDER for t in ledger.epochs.values())
    bounds = hash_field_bytes(MAX_OUT_OF_ORDER)
    over = {f: len(v) for f, v in stored.items() if len(v.encode()) > bounds[f]}
    assert not over, over
    assert len(stored["epochs"]) > bounds["epochs"] // 2, "a bound loose by far bounds little"

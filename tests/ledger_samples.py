"""The fullest ledger ingest can write for one worker, within the wire's bounds: every kept
epoch as long as a batch may name it (``MAX_EPOCH_CHARS``) in the characters JSON escapes,
each with ``MAX_OUT_OF_ORDER`` sequence numbers of 19 digits above its floor and stream
times as long, and counts as large."""

from __future__ import annotations

from dataclasses import fields

from agent.wire import MAX_EPOCH_CHARS
from controlplane.service.ledger import EPOCHS_KEPT, MAX_OUT_OF_ORDER, WorkerCounts, WorkerLedger

LARGE = 10**18
"""A sequence number or count of 19 digits."""


def longest_epochs() -> list[str]:
    """``EPOCHS_KEPT`` distinct epochs a batch may carry, each stored as long as one can be:
    ``MAX_EPOCH_CHARS`` characters, all but one of them escaped in JSON (two bytes each)."""
    return [('"\\'[i % 2] * (MAX_EPOCH_CHARS - 1)) + str(i) for i in range(EPOCHS_KEPT)]


def fullest_ledger(worker: str = "w1") -> WorkerLedger:
    """``worker``'s ledger with ``longest_epochs``, each tracking ``MAX_OUT_OF_ORDER``
    numbers above a gap, and every count of 19 digits."""
    ledger = WorkerLedger(worker)
    for epoch in longest_epochs():
        for seq in range(LARGE + 2, LARGE + 2 * MAX_OUT_OF_ORDER + 4, 2):  # a gap before each
            ledger.see(epoch, seq, LARGE)
    for count in fields(WorkerCounts):
        setattr(ledger.counts, count.name, 9 * LARGE)
    return ledger

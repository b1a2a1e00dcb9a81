"""Requests recorded from live workers -> a Bailian ``Trace`` (``kvwise trace record``).

Owns ``type_and_turn`` (a live category name read as the trace's type and turn) and
``RecordedRequests``, which gathers whole requests in the order they were rebuilt: block
hashes become small ids in order of first sight (one table for every worker, so a prefix
two requests share stays shared), and a request whose blocks repeat a hash is refused: an
engine's block hashes chain the prefix, so a repeat says its events were not what the
engine's cache held (the reader would re-chain such a trace, hiding that). ``trace`` gives
times relative to the first request, chat ids in time order, no parent (conversations are
not recorded), input tokens as blocks x ``block_tokens`` (which the trace carries, so that
its readers count in it too) and output tokens 0 (unknown: the simulator takes its
default). It must never do I/O or rebuild requests from events
(``controlplane.shadow.rebuild`` does).
"""

from __future__ import annotations

import re
from array import array
from collections.abc import Sequence

import numpy as np

from controlplane.traces.model import Trace

NO_TURN = 0
"""The turn of a request whose category names none (the trace's turn statistics then read
n/a: they need every turn to be known)."""

_INFERRED = re.compile(r"t(\d{1,9})_n(\d{1,9})")
"""An inferred category (``agent.category_inference``): ``t{turn}_n{new-token bucket}``."""
_TYPE_TURN = re.compile(r"(.+)_(\d{1,9})")
"""The paper's category, as a Bailian trace names it: ``{type}_{turn}`` (``text_2``)."""


def type_and_turn(category: str) -> tuple[str, int]:
    """The trace's type and turn for a live category: ``text_2`` is type ``text``, turn 2
    (read back as ``text_2``); an inferred ``t2_n1`` is type ``n1`` (its new-token bucket),
    turn 2 (read back as ``n1_2``); any other name is the type, with turn ``NO_TURN``."""
    inferred = _INFERRED.fullmatch(category)
    if inferred is not None:
        return f"n{inferred[2]}", int(inferred[1])
    paper = _TYPE_TURN.fullmatch(category)
    if paper is not None:
        return paper[1], int(paper[2])
    return category, NO_TURN


class RecordedRequests:
    """Whole requests as they come, held as compact columns (no object per block)."""

    def __init__(self) -> None:
        self._ids: dict[int, int] = {}
        self._blocks = array("q")
        self._lengths = array("q")
        self._times = array("d")
        self._turns = array("q")
        self._types: list[str] = []
        self.refused = 0
        """Requests left out because a hash repeats among their blocks."""

    def __len__(self) -> int:
        return len(self._lengths)

    def add(self, ts: float, category: str, blocks: Sequence[int]) -> bool:
        """Keep one request (``blocks``: hashes in prompt order); False if it was refused."""
        if len(set(blocks)) != len(blocks):
            self.refused += 1
            return False
        ids = self._ids
        self._blocks.extend([ids.setdefault(h, len(ids)) for h in blocks])
        self._lengths.append(len(blocks))
        self._times.append(ts)
        type_, turn = type_and_turn(category)
        self._types.append(type_)
        self._turns.append(turn)
        return True

    def trace(self, name: str, block_tokens: int) -> Trace:
        """The requests as a Bailian trace, times from the first request's."""
        times = np.frombuffer(self._times, dtype=np.float64) if self._times else np.zeros(0)
        lengths = np.frombuffer(self._lengths, dtype=np.int64) if self._lengths else _none()
        order = np.argsort(times, kind="stable")
        chat_ids = np.empty(len(times), dtype=np.int64)
        chat_ids[order] = np.arange(len(times), dtype=np.int64)
        return Trace.from_arrays(
            name=name,
            source_format="bailian",
            hash_ids=np.frombuffer(self._blocks, dtype=np.int64) if self._blocks else _none(),
            lengths=lengths,
            timestamps=times - times.min() if len(times) else times,
            types=self._types,
            turns=np.frombuffer(self._turns, dtype=np.int64) if self._turns else _none(),
            input_lengths=lengths * block_tokens,
            output_lengths=np.zeros(len(times), dtype=np.int64),
            chat_ids=chat_ids,
            parent_chat_ids=np.full(len(times), -1, dtype=np.int64),
            block_tokens=block_tokens,
        )


def _none() -> np.ndarray[tuple[int], np.dtype[np.int64]]:
    return np.zeros(0, dtype=np.int64)

"""Synthetic requests -> ``Trace``: request columns on top of a prompt forest.

Owns ``TraceBuilder``: the profiles add templates (prompts no one sends) and requests
(prompts with a time, type, turn and output length) to one ``PromptForest``; ``build``
numbers the requests (``chat_id`` in time order), links each to its previous turn
(``parent_chat_id``), keeps those inside ``[0, duration)`` and hands the columns to
``Trace.from_arrays``. Requests before 0 are the warm-up: they make the window start
mid-stream, as a slice of a real trace does (a kept request may name a parent the trace
does not hold, and its prefix is a miss, as in the public traces). It must never draw
random numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from controlplane.traces.arrays import F64, I64
from controlplane.traces.model import Trace
from controlplane.traces.synth_prefix import PromptForest, n_blocks


@dataclass
class _Requests:
    node: list[I64] = field(default_factory=list)
    time: list[F64] = field(default_factory=list)
    type_code: list[I64] = field(default_factory=list)
    turn: list[I64] = field(default_factory=list)
    output: list[I64] = field(default_factory=list)
    prev_turn: list[I64] = field(default_factory=list)


class TraceBuilder:
    """Collects templates and requests; ``build`` makes the trace."""

    def __init__(self, type_names: tuple[str, ...]) -> None:
        self.type_names = type_names
        self.forest = PromptForest()
        self._req = _Requests()

    def templates(self, *, parent: I64, shared: I64, length: I64) -> I64:
        """Prompts that only serve as shared prefixes."""
        return self.forest.add(parent=parent, shared=shared, length=length)

    def requests(
        self,
        *,
        parent: I64,
        shared: I64,
        length: I64,
        time: F64,
        type_code: I64,
        output: I64,
        turn: I64 | int = 1,
        prev_turn: I64 | int = -1,
        copy: NDArray[np.bool_] | None = None,
    ) -> I64:
        """Requests; ``prev_turn`` is the node of the previous turn's request, -1 for none
        (``turn``, ``type_code`` and ``prev_turn`` may be one value for all). By default a
        first turn: turn 1, no previous turn."""
        nodes = self.forest.add(parent=parent, shared=shared, length=length, copy=copy)
        n = len(nodes)
        r = self._req
        r.node.append(nodes)
        r.time.append(np.asarray(time, dtype=np.float64))
        r.type_code.append(np.broadcast_to(np.asarray(type_code, dtype=np.int64), (n,)))
        r.turn.append(np.broadcast_to(np.asarray(turn, dtype=np.int64), (n,)))
        r.output.append(np.asarray(output, dtype=np.int64))
        r.prev_turn.append(np.broadcast_to(np.asarray(prev_turn, dtype=np.int64), (n,)))
        return nodes

    def build(self, *, name: str, duration_s: float) -> Trace:
        r = self._req
        node = _cat(r.node)
        # Millisecond stamps, as the public traces print them.
        time = np.round(np.concatenate(r.time) if r.time else np.zeros(0), 3)
        by_time = np.lexsort((node, time))
        chat_of_node = np.full(len(self.forest), -1, dtype=np.int64)
        chat_of_node[node[by_time]] = np.arange(len(node), dtype=np.int64)
        prev = _cat(r.prev_turn)
        parent_chat = np.where(prev >= 0, chat_of_node[np.maximum(prev, 0)], -1)

        keep = by_time[(time[by_time] >= 0) & (time[by_time] < duration_s)]
        kept_nodes = node[keep]
        offsets, ids = self.forest.block_ids()
        counts = n_blocks(self.forest.lengths[kept_nodes])
        starts = np.repeat(offsets[kept_nodes], counts)
        within = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(
            np.cumsum(counts) - counts, counts
        )
        type_codes = _cat(r.type_code)[keep]
        names = np.asarray(self.type_names, dtype=object)
        return Trace.from_arrays(
            name=name,
            source_format="bailian",
            hash_ids=ids[starts + within],
            lengths=counts,
            timestamps=time[keep],
            types=[str(t) for t in names[type_codes]],
            turns=_cat(r.turn)[keep],
            input_lengths=self.forest.lengths[kept_nodes],
            output_lengths=_cat(r.output)[keep],
            chat_ids=chat_of_node[kept_nodes],
            parent_chat_ids=parent_chat[keep],
        )


def _cat(parts: list[I64]) -> I64:
    return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)

"""The in-memory trace: flat numpy arrays in replay order, never one object per block.

Owns the ``Trace`` container and ``Trace.from_requests`` (the one place that remaps block
hashes to dense ids and puts requests in replay order). It must never read files (see
``controlplane.traces.reader``) or know about policies.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

UNKNOWN_CATEGORY = "unknown"
"""Category of requests that carry no type or turn (Mooncake traces)."""


def category_name(type_: str, turn: int) -> str:
    """The paper's request category: ``"{type}_{turn}"`` (e.g. ``text_2``)."""
    return f"{type_}_{turn}"


@dataclass(frozen=True, eq=False)
class Trace:
    """A block-level request trace in replay order (timestamp, then file order).

    Request ``r`` accessed ``blocks[offsets[r]:offsets[r + 1]]`` (dense block ids, prompt
    order) at ``timestamps[r]`` seconds. ``hashes[b]`` is the original id of dense block
    ``b``. Per-request metadata arrays have ``n_requests`` entries; unknown values are
    ``-1`` (ids, turn) or the type name ``""``.
    """

    name: str
    source_format: str
    blocks: NDArray[np.int64]
    offsets: NDArray[np.int64]
    timestamps: NDArray[np.float64]
    categories: NDArray[np.int32]
    category_names: tuple[str, ...]
    hashes: NDArray[np.int64]
    input_lengths: NDArray[np.int64]
    output_lengths: NDArray[np.int64]
    turns: NDArray[np.int32]
    types: NDArray[np.int32]
    type_names: tuple[str, ...]
    chat_ids: NDArray[np.int64]
    parent_chat_ids: NDArray[np.int64]
    skipped_lines: tuple[tuple[int, str], ...] = field(default=())
    """(line number, reason) of each line skipped by ``--skip-bad-lines``."""

    @property
    def n_requests(self) -> int:
        return len(self.offsets) - 1

    @property
    def n_accesses(self) -> int:
        return len(self.blocks)

    @property
    def n_unique(self) -> int:
        return len(self.hashes)

    @property
    def lengths(self) -> NDArray[np.int64]:
        """Blocks per request."""
        return np.diff(self.offsets)

    def request_blocks(self, r: int) -> NDArray[np.int64]:
        return self.blocks[self.offsets[r] : self.offsets[r + 1]]

    def nbytes(self) -> int:
        """Memory held by the arrays."""
        return sum(
            a.nbytes
            for a in (
                self.blocks,
                self.offsets,
                self.timestamps,
                self.categories,
                self.hashes,
                self.input_lengths,
                self.output_lengths,
                self.turns,
                self.types,
                self.chat_ids,
                self.parent_chat_ids,
            )
        )

    @classmethod
    def from_arrays(
        cls,
        *,
        name: str,
        source_format: str,
        hash_ids: NDArray[np.int64],
        lengths: NDArray[np.int64],
        timestamps: NDArray[np.float64],
        types: Sequence[str] | None = None,
        turns: NDArray[np.int64] | None = None,
        input_lengths: NDArray[np.int64] | None = None,
        output_lengths: NDArray[np.int64] | None = None,
        chat_ids: NDArray[np.int64] | None = None,
        parent_chat_ids: NDArray[np.int64] | None = None,
        skipped_lines: Sequence[tuple[int, str]] = (),
    ) -> Trace:
        """Build a trace from per-request columns in file order.

        Sorts requests by timestamp (stable: file order breaks ties) and maps hashes to
        dense ids ``0..U-1`` in order of first appearance in replay order.
        """
        n = len(lengths)
        lengths = np.asarray(lengths, dtype=np.int64)
        timestamps = np.asarray(timestamps, dtype=np.float64)
        hash_ids = np.asarray(hash_ids, dtype=np.int64)
        if len(timestamps) != n:
            raise ValueError("timestamps and lengths differ in length")
        if int(lengths.sum()) != len(hash_ids):
            raise ValueError("lengths do not add up to the number of hash ids")

        order = np.argsort(timestamps, kind="stable")
        file_offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lengths, out=file_offsets[1:])
        if np.all(order[1:] > order[:-1]):
            sorted_hashes = hash_ids
            lengths_sorted = lengths
        else:
            lengths_sorted = lengths[order]
            # Gather each request's slice in replay order, vectorised.
            starts = np.repeat(file_offsets[:-1][order], lengths_sorted)
            within = np.arange(len(hash_ids), dtype=np.int64) - np.repeat(
                np.cumsum(lengths_sorted) - lengths_sorted, lengths_sorted
            )
            sorted_hashes = hash_ids[starts + within]
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lengths_sorted, out=offsets[1:])

        uniq, first_pos, inverse = np.unique(sorted_hashes, return_index=True, return_inverse=True)
        # Dense ids by first appearance, so small traces read naturally in tests.
        rank = np.empty(len(uniq), dtype=np.int64)
        rank[np.argsort(first_pos, kind="stable")] = np.arange(len(uniq), dtype=np.int64)
        blocks = rank[inverse.reshape(-1)]
        hashes = np.empty(len(uniq), dtype=np.int64)
        hashes[rank] = uniq

        def col(a: NDArray[np.int64] | None, fill: int) -> NDArray[np.int64]:
            if a is None:
                return np.full(n, fill, dtype=np.int64)
            return np.asarray(a, dtype=np.int64)[order]

        turns_arr = col(turns, -1)
        if types is None:
            type_names: tuple[str, ...] = ("",)
            type_codes = np.zeros(n, dtype=np.int32)
        else:
            tn, tc = np.unique(np.asarray(types, dtype=object).astype(str), return_inverse=True)
            type_names = tuple(str(t) for t in tn)
            type_codes = tc.astype(np.int32).reshape(-1)[order]
        if types is None and turns is None:
            cat_names: tuple[str, ...] = (UNKNOWN_CATEGORY,)
            cat_codes = np.zeros(n, dtype=np.int32)
        else:
            labels = np.array(
                [
                    category_name(type_names[t], int(u))
                    for t, u in zip(type_codes, turns_arr, strict=True)
                ],
                dtype=object,
            )
            cn, cc = np.unique(labels.astype(str), return_inverse=True)
            cat_names = tuple(str(c) for c in cn)
            cat_codes = cc.astype(np.int32).reshape(-1)
        return cls(
            name=name,
            source_format=source_format,
            blocks=blocks,
            offsets=offsets,
            timestamps=timestamps[order],
            categories=cat_codes,
            category_names=cat_names,
            hashes=hashes,
            input_lengths=col(input_lengths, -1),
            output_lengths=col(output_lengths, -1),
            turns=turns_arr.astype(np.int32),
            types=type_codes,
            type_names=type_names,
            chat_ids=col(chat_ids, -1),
            parent_chat_ids=col(parent_chat_ids, -1),
            skipped_lines=tuple(skipped_lines),
        )

    @classmethod
    def from_requests(
        cls,
        requests: Sequence[Sequence[int]],
        timestamps: Sequence[float] | None = None,
        *,
        types: Sequence[str] | None = None,
        turns: Sequence[int] | None = None,
        name: str = "inline",
    ) -> Trace:
        """A small trace from lists of hash ids (tests, examples). Timestamps default to
        the request index."""
        lengths = np.array([len(r) for r in requests], dtype=np.int64)
        flat = np.fromiter(
            (h for r in requests for h in r), dtype=np.int64, count=int(lengths.sum())
        )
        ts = (
            np.arange(len(requests), dtype=np.float64)
            if timestamps is None
            else np.asarray(timestamps, dtype=np.float64)
        )
        return cls.from_arrays(
            name=name,
            source_format="inline",
            hash_ids=flat,
            lengths=lengths,
            timestamps=ts,
            types=types,
            turns=None if turns is None else np.asarray(turns, dtype=np.int64),
        )

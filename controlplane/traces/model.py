"""The in-memory trace: flat numpy arrays in replay order, never one object per block.

Owns the ``Trace`` container and ``Trace.from_arrays`` (the one place that puts requests in
replay order and has their block hashes remapped to dense ids, by
``controlplane.traces.dense_ids``). It must never read files (see
``controlplane.traces.reader``) or know about policies.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from controlplane.traces.arrays import F64, I32, I64, SLICE
from controlplane.traces.dense_ids import dense_ids

UNKNOWN_CATEGORY = "unknown"
"""Category of requests that carry no type or turn (Mooncake traces)."""
MAX_REQUEST_TOKENS = 1 << 24
"""Most tokens of one request's prompt, or of the output asked of every request, that is
simulated or sent to a server (16,777,216: past the longest context any model takes).
The reader takes any 64-bit length; a larger prompt is refused where it would be
prefilled step by step or built whole in memory."""


def category_name(type_: str, turn: int) -> str:
    """The paper's request category: ``"{type}_{turn}"`` (e.g. ``text_2``)."""
    return f"{type_}_{turn}"


@dataclass(frozen=True)
class RechainResult:
    """Why a trace's ids were re-chained by prefix (``controlplane.traces.chaining``)."""

    ids_after_several_blocks: int
    """Ids that follow more than one block (or none in one request and a block in another)."""
    requests_repeating_an_id: int
    """Requests that hold some id more than once."""


@dataclass(frozen=True, eq=False)
class Trace:
    """A block-level request trace in replay order (timestamp, then file order).

    Request ``r`` accessed ``blocks[offsets[r]:offsets[r + 1]]`` (dense block ids, prompt
    order) at ``timestamps[r]`` seconds. ``hashes[b]`` is the original id of dense block
    ``b`` (``b`` itself where the ids were re-chained: ``rechained``). Per-request metadata
    arrays have ``n_requests`` entries; unknown values are ``-1`` (ids, turn) or the type
    name ``""``.
    """

    name: str
    source_format: str
    blocks: I64
    offsets: I64
    timestamps: F64
    categories: I32
    category_names: tuple[str, ...]
    hashes: I64
    input_lengths: I64
    output_lengths: I64
    turns: I32
    types: I32
    type_names: tuple[str, ...]
    chat_ids: I64
    parent_chat_ids: I64
    skipped_lines: tuple[tuple[int, str], ...] = field(default=())
    """(line number, reason) of each line skipped by ``--skip-bad-lines``."""
    block_tokens: int | None = None
    """Tokens per block, where the trace says it (one kvwise recorded: its lines carry
    ``block_tokens``); None: its format's (``controlplane.replay.accesses.block_tokens_of``)."""
    rechained: RechainResult | None = None
    """Set when the file's ids were not prefix-chained and were re-chained on reading
    (``controlplane.traces.chaining``); None: the blocks are the file's own ids."""

    @property
    def n_requests(self) -> int:
        return len(self.offsets) - 1

    @property
    def n_accesses(self) -> int:
        return len(self.blocks)

    @property
    def n_unique(self) -> int:
        return len(self.hashes)

    def capacity_for(self, share: float) -> int:
        """A cache size in blocks: ``share`` of the unique blocks, rounded, at least 1."""
        return max(1, round(share * self.n_unique))

    @property
    def lengths(self) -> I64:
        """Blocks per request."""
        return np.diff(self.offsets)

    def request_blocks(self, r: int) -> I64:
        return self.blocks[self.offsets[r] : self.offsets[r + 1]]

    def nbytes(self) -> int:
        """Memory held by the arrays."""
        return sum(a.nbytes for a in vars(self).values() if isinstance(a, np.ndarray))

    @classmethod
    def from_arrays(
        cls,
        *,
        name: str,
        source_format: str,
        hash_ids: I64,
        lengths: I64,
        timestamps: F64,
        types: Sequence[str] | None = None,
        turns: I64 | None = None,
        input_lengths: I64 | None = None,
        output_lengths: I64 | None = None,
        chat_ids: I64 | None = None,
        parent_chat_ids: I64 | None = None,
        skipped_lines: Sequence[tuple[int, str]] = (),
        block_tokens: int | None = None,
    ) -> Trace:
        """Build a trace from per-request columns in file order.

        Sorts requests by timestamp (stable: file order breaks ties) and maps hashes to
        dense ids ``0..U-1`` in order of first appearance in replay order.
        """
        hash_ids, lengths, timestamps = _checked(hash_ids, lengths, timestamps)
        order = np.argsort(timestamps, kind="stable")
        sorted_hashes, offsets = _in_replay_order(hash_ids, lengths, order)
        blocks, hashes = dense_ids(sorted_hashes)

        def column(values: I64 | None) -> I64:
            return _request_column(values, order)

        turn_column = column(turns)
        type_names, type_codes = _type_codes(types, order)
        category_names, category_codes = _category_codes(
            type_names, type_codes, turn_column, labelled=types is not None or turns is not None
        )
        return cls(
            name=name,
            source_format=source_format,
            blocks=blocks,
            offsets=offsets,
            timestamps=timestamps[order],
            categories=category_codes,
            category_names=category_names,
            hashes=hashes,
            input_lengths=column(input_lengths),
            output_lengths=column(output_lengths),
            turns=turn_column.astype(np.int32),
            types=type_codes,
            type_names=type_names,
            chat_ids=column(chat_ids),
            parent_chat_ids=column(parent_chat_ids),
            skipped_lines=tuple(skipped_lines),
            block_tokens=block_tokens,
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


def _checked(hash_ids: I64, lengths: I64, timestamps: F64) -> tuple[I64, I64, F64]:
    """The three columns as arrays of their types; raises ``ValueError`` if they do not
    agree (a timestamp per request, a hash id per block the lengths count)."""
    hash_ids = np.asarray(hash_ids, dtype=np.int64)
    lengths = np.asarray(lengths, dtype=np.int64)
    timestamps = np.asarray(timestamps, dtype=np.float64)
    if len(timestamps) != len(lengths):
        raise ValueError("timestamps and lengths differ in length")
    if int(lengths.sum()) != len(hash_ids):
        raise ValueError("lengths do not add up to the number of hash ids")
    return hash_ids, lengths, timestamps


def _in_replay_order(hash_ids: I64, lengths: I64, order: NDArray[np.intp]) -> tuple[I64, I64]:
    """Every request's hash ids, requests in ``order``, and the offsets of each request."""
    in_file_order = bool(np.all(order[1:] > order[:-1]))
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths if in_file_order else lengths[order], out=offsets[1:])
    if in_file_order:
        return hash_ids, offsets
    return _gathered(hash_ids, lengths, order, offsets), offsets


def _gathered(hash_ids: I64, lengths: I64, order: NDArray[np.intp], offsets: I64) -> I64:
    """``hash_ids`` with the requests in ``order`` (request ``r`` lands at ``offsets[r]``),
    gathered whole requests at a time, about ``SLICE`` hash ids a pass: a hash id's place
    in the file is where its request starts in the file plus its place in the request."""
    file_starts = np.cumsum(lengths) - lengths
    shift = file_starts[order] - offsets[:-1]  # file position minus replay position
    gathered = np.empty_like(hash_ids)
    first = 0
    while first < len(order):
        reach = int(np.searchsorted(offsets, offsets[first] + SLICE, side="right")) - 1
        last = max(first + 1, reach)
        lo, hi = int(offsets[first]), int(offsets[last])
        at = np.repeat(shift[first:last], np.diff(offsets[first : last + 1]))
        at += np.arange(lo, hi, dtype=np.int64)
        gathered[lo:hi] = hash_ids[at]
        first = last
    return gathered


def _request_column(values: I64 | None, order: NDArray[np.intp]) -> I64:
    """A per-request column in replay order; missing: ``-1`` for every request."""
    if values is None:
        return np.full(len(order), -1, dtype=np.int64)
    return np.asarray(values, dtype=np.int64)[order]


def _type_codes(
    types: Sequence[str] | None, order: NDArray[np.intp]
) -> tuple[tuple[str, ...], I32]:
    """``(type names, code per request in replay order)``; no types: the one name ``""``."""
    if types is None:
        return ("",), np.zeros(len(order), dtype=np.int32)
    names, codes = np.unique(np.asarray(types, dtype=object).astype(str), return_inverse=True)
    return tuple(str(t) for t in names), codes.astype(np.int32).reshape(-1)[order]


def _category_codes(
    type_names: tuple[str, ...],
    type_codes: I32,
    turns: I64,
    *,
    labelled: bool,
) -> tuple[tuple[str, ...], I32]:
    """``(category names, code per request)``: ``type_turn`` labels, or the single
    ``UNKNOWN_CATEGORY`` when the trace carries neither types nor turns."""
    if not labelled:
        return (UNKNOWN_CATEGORY,), np.zeros(len(type_codes), dtype=np.int32)
    labels = np.array(
        [category_name(type_names[t], int(u)) for t, u in zip(type_codes, turns, strict=True)],
        dtype=object,
    )
    names, codes = np.unique(labels.astype(str), return_inverse=True)
    return tuple(str(c) for c in names), codes.astype(np.int32).reshape(-1)

"""Which requests a run sends, when, and with what: ``plan_requests``.

Owns the slice of the trace (the first ``limit`` requests in replay order), the send times
(trace time from the slice's first request, divided by ``speed``; all at once with speed
0; a speed that puts a send past a float's range is refused), each request's output
length and category, and the cut of over-long prompts to their first ``max_blocks``
blocks (their prefix, so the sharing of prefixes is kept). Prompts are built only when a
request is sent (``PlannedRequest.prompt``), and ``trace_digest`` names a trace's requests
whatever its file is called (so two runs can tell whether they replayed the same ones). It
must never do I/O.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from controlplane.loadgen.prompts import TokenSpace
from controlplane.traces.model import UNKNOWN_CATEGORY, Trace


@dataclass(frozen=True)
class PlanOptions:
    """What to send of a trace (the CLI's options, checked)."""

    speed: float = 1.0
    """Trace seconds per wall second; 0: ignore trace times, send as fast as allowed."""
    limit: int | None = None
    """Send the first ``limit`` requests only."""
    max_tokens: int = 64
    """Output tokens asked per request: the trace's output length, capped at this."""
    max_blocks: int | None = None
    """Cut longer prompts to their first ``max_blocks`` blocks."""
    send_categories: bool = True
    """Send a labelled trace's categories as ``kv_category``."""

    def __post_init__(self) -> None:
        if not (self.speed >= 0 and np.isfinite(self.speed)):
            raise ValueError(f"speed must be a finite number >= 0, got {self.speed}")
        for name in ("limit", "max_blocks"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")


@dataclass(frozen=True)
class PlannedRequest:
    """One request of the run; ``index`` is its position in the trace (replay order)."""

    index: int
    send_at: float
    """Seconds after the run starts."""
    hash_ids: NDArray[np.int64]
    """Original block ids of the prompt, in order (already cut to ``max_blocks``)."""
    max_tokens: int
    category: str | None
    cut_blocks: int
    """Blocks cut off the end of the trace's prompt (0: sent whole)."""

    def prompt(self, space: TokenSpace) -> NDArray[np.int64]:
        return space.prompt(self.hash_ids)


def plan_requests(trace: Trace, options: PlanOptions) -> list[PlannedRequest]:
    """The requests of a run over ``trace``, in send order."""
    n = trace.n_requests if options.limit is None else min(options.limit, trace.n_requests)
    if n == 0:
        return []
    t0 = float(trace.timestamps[0])
    span = float(trace.timestamps[n - 1]) - t0
    if not np.isfinite(_send_at(span, options.speed)):
        raise ValueError(
            f"speed {options.speed:g} puts sends past a float's range (the slice's {span:g} s "
            "span / speed)"
        )
    labelled = options.send_categories and trace.category_names != (UNKNOWN_CATEGORY,)
    plan = []
    for r in range(n):
        blocks = trace.request_blocks(r)
        keep = len(blocks) if options.max_blocks is None else min(len(blocks), options.max_blocks)
        out = int(trace.output_lengths[r])
        plan.append(
            PlannedRequest(
                index=r,
                send_at=_send_at(float(trace.timestamps[r]) - t0, options.speed),
                hash_ids=trace.hashes[blocks[:keep]],
                max_tokens=options.max_tokens if out < 1 else min(out, options.max_tokens),
                category=trace.category_names[trace.categories[r]] if labelled else None,
                cut_blocks=len(blocks) - keep,
            )
        )
    return plan


def _send_at(trace_offset_s: float, speed: float) -> float:
    return 0.0 if speed == 0 else trace_offset_s / speed


DIGEST_HEX = 16
"""Hex digits of ``trace_digest`` kept (64 bits: two different traces never meet by chance
among the runs one compares)."""


def trace_digest(trace: Trace) -> str:
    """What a run can send of ``trace``, as a short hex digest: each request's time, block
    ids in order, output length and category, never the file's name, format or
    compression."""
    digest = hashlib.sha256()
    for array in (
        trace.offsets,
        trace.timestamps,
        trace.hashes[trace.blocks],
        trace.output_lengths,
        trace.categories,
    ):
        digest.update(np.ascontiguousarray(array).tobytes())
    digest.update("\0".join(trace.category_names).encode())
    return digest.hexdigest()[:DIGEST_HEX]

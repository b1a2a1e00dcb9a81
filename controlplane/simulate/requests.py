"""Requests as the simulator sees them: what each asks (``Workload``), what it got
(``Outcomes``).

Owns turning a ``Trace`` into per-request work: arrival time (trace time divided by the
speed-up), prompt tokens (the trace's ``input_length``, or blocks x block tokens when the
trace lacks it; at most ``MAX_REQUEST_TOKENS``), output tokens (the trace's
``output_length``, or the documented default ``DEFAULT_OUTPUT_TOKENS``; at most
``MAX_REQUEST_TOKENS`` too), and the tokens per block of the trace's format.
``Outcomes`` holds, per request, the instance it ran on, its hits and the times of its
life: arrival, first step (end of queueing), first token, finish.

It must never simulate, route or summarise.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from controlplane.replay.accesses import block_tokens_of
from controlplane.traces.model import MAX_REQUEST_TOKENS, Trace

DEFAULT_OUTPUT_TOKENS = 256
"""Output tokens of a request whose trace gives none (``-1``)."""
DEFAULT_BLOCK_TOKENS = 16
"""Tokens per block of a trace whose format does not say (vLLM's default block size)."""


@dataclass(frozen=True, eq=False)
class Workload:
    """Per request, in trace order: arrival (simulated seconds from the first request),
    prompt and output tokens; the tokens per block; and the clock mapping."""

    arrival: list[float]
    prompt_tokens: list[int]
    output_tokens: list[int]
    block_tokens: int
    speed: float
    start: float
    """Trace time of the first request."""

    @property
    def n_requests(self) -> int:
        return len(self.arrival)

    def trace_time(self, t: float) -> float:
        """The trace time of simulated time ``t``: what policies are told ``now`` is."""
        return self.start + t * self.speed


def workload(
    trace: Trace,
    *,
    speed: float = 1.0,
    block_tokens: int | None = None,
    output_tokens: int = DEFAULT_OUTPUT_TOKENS,
) -> Workload:
    """The work ``trace`` asks for, arriving ``speed`` times faster than recorded."""
    if output_tokens < 1:
        raise ValueError(f"output tokens must be >= 1, got {output_tokens}")
    bt = block_tokens or block_tokens_of(trace) or DEFAULT_BLOCK_TOKENS
    if bt < 1:
        raise ValueError(f"block tokens must be >= 1, got {bt}")
    arrival = arrival_times(trace, speed)
    t0 = float(trace.timestamps[0]) if trace.n_requests else 0.0
    by_blocks = trace.lengths * bt
    prompt = np.where(trace.input_lengths > 0, trace.input_lengths, by_blocks)
    _check_within_an_engine(prompt, "prompt tokens (input_length, or its blocks x block tokens)")
    output = np.where(trace.output_lengths > 0, trace.output_lengths, output_tokens)
    _check_within_an_engine(output, "output tokens (output_length)")
    return Workload(
        arrival=arrival.tolist(),
        prompt_tokens=prompt.astype(np.int64).tolist(),
        output_tokens=output.astype(np.int64).tolist(),
        block_tokens=int(bt),
        speed=speed,
        start=t0,
    )


def _check_within_an_engine(tokens: NDArray[np.int64], what: str) -> None:
    """``ValueError`` naming the first request that asks for more than
    ``MAX_REQUEST_TOKENS`` of ``what`` (a prompt would be prefilled, an output decoded,
    step by step for ever)."""
    over = np.flatnonzero(tokens > MAX_REQUEST_TOKENS)
    if len(over):
        r = int(over[0])
        raise ValueError(
            f"request {r} asks for {int(tokens[r]):,} {what}, more than the "
            f"{MAX_REQUEST_TOKENS:,} one engine takes"
        )


def arrival_times(trace: Trace, speed: float) -> NDArray[np.float64]:
    """Each request's arrival, simulated seconds from the first. ``ValueError`` for a speed
    that is not a finite number above 0, or that puts an arrival past a float's range (a
    subnormal speed, or stamps near 1e308: arrivals at inf gave NaN latencies)."""
    if not (speed > 0 and np.isfinite(speed)):
        raise ValueError(f"speed must be a positive number, got {speed}")
    t0 = float(trace.timestamps[0]) if trace.n_requests else 0.0
    with np.errstate(over="ignore"):
        arrival = (trace.timestamps - t0) / speed
    if not np.isfinite(arrival).all():
        span = float(trace.timestamps[-1]) - t0
        raise ValueError(
            f"speed {speed:g} puts arrivals past a float's range (the trace's {span:g} s "
            "span / speed)"
        )
    return arrival


@dataclass(eq=False)
class Outcomes:
    """What happened to each request (times in simulated seconds; NaN: never)."""

    instance: NDArray[np.int32]
    hit_blocks: NDArray[np.int64]
    cached_tokens: NDArray[np.int64]
    arrival: NDArray[np.float64]
    started: NDArray[np.float64]
    first_token: NDArray[np.float64]
    finished: NDArray[np.float64]
    evicted_blocks: int = 0
    """Blocks the instances' caches evicted, all of them together."""

    @classmethod
    def empty(cls, work: Workload) -> Outcomes:
        n = work.n_requests
        return cls(
            instance=np.full(n, -1, dtype=np.int32),
            hit_blocks=np.zeros(n, dtype=np.int64),
            cached_tokens=np.zeros(n, dtype=np.int64),
            arrival=np.asarray(work.arrival, dtype=np.float64),
            started=np.full(n, np.nan),
            first_token=np.full(n, np.nan),
            finished=np.full(n, np.nan),
        )

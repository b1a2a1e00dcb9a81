"""What one simulation measured: ``SimResult``, summarised from per-request outcomes.

Owns the definitions of the reported metrics (docs/simulate.md, "Output"):

- **queue**: from arrival to the request's first engine step;
- **TTFT**: from its first step to its first token (prefill of its uncached tokens,
  sharing steps with the other running requests);
- **QTTFT**: queue + TTFT, from arrival to first token (the paper's headline metric);
- **hit ratio**: hit blocks / prompt blocks, hits counted when the request starts;
- **prefill tokens saved**: prompt tokens served from the cache;
- **throughput**: output tokens (and requests) per simulated second, first arrival to
  last finish.

Latencies are given as mean and p50/p90/p99, and QTTFT also as ``QUANTILES`` for CDF
plots. It must never simulate, print or plot.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from controlplane.replay.engine import HitCounts
from controlplane.simulate.requests import Outcomes, Workload

QUANTILES = tuple(round(q / 100, 2) for q in range(0, 101))
"""Quantiles of QTTFT kept in every result (0, 0.01, ..., 1), enough for a CDF."""


@dataclass(frozen=True)
class Latency:
    """Seconds: mean and three percentiles."""

    mean: float
    p50: float
    p90: float
    p99: float

    @classmethod
    def of(cls, seconds: NDArray[np.float64]) -> Latency:
        if not len(seconds):
            return cls(0.0, 0.0, 0.0, 0.0)
        p50, p90, p99 = np.percentile(seconds, [50, 90, 99]).tolist()
        return cls(float(seconds.mean()), p50, p90, p99)

    def to_json(self) -> dict[str, float]:
        return {"mean": self.mean, "p50": self.p50, "p90": self.p90, "p99": self.p99}


@dataclass(frozen=True)
class SimResult(HitCounts):
    """One policy at one capacity on one trace and fleet."""

    policy: str
    capacity: int
    requests: int
    hits: int
    accesses: int
    prompt_tokens: int
    saved_tokens: int
    output_tokens: int
    ttft: Latency
    qttft: Latency
    queue: Latency
    makespan_s: float
    last_start_s: float
    """From the first arrival to the last request's first step: beyond the arrivals' span
    only when the queue grows (the makespan also holds the last requests' decode)."""
    qttft_quantiles: tuple[float, ...] = field(default=(), repr=False)
    seconds: float = 0.0
    """Wall time of the simulation."""
    evicted_blocks: int = 0
    """Blocks every instance's cache evicted, all together (0: each held all it saw)."""

    @property
    def saved_ratio(self) -> float:
        return self.saved_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def output_tokens_per_s(self) -> float:
        return self.output_tokens / self.makespan_s if self.makespan_s > 0 else 0.0

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.makespan_s if self.makespan_s > 0 else 0.0

    def to_json(self) -> dict[str, object]:
        return {
            "policy": self.policy,
            "capacity": self.capacity,
            "requests": self.requests,
            **self.counts_json(),
            "ttft_s": self.ttft.to_json(),
            "qttft_s": self.qttft.to_json(),
            "queue_s": self.queue.to_json(),
            "prompt_tokens": self.prompt_tokens,
            "prefill_tokens_saved": self.saved_tokens,
            "prefill_saved_ratio": self.saved_ratio,
            "output_tokens": self.output_tokens,
            "output_tokens_per_s": self.output_tokens_per_s,
            "requests_per_s": self.requests_per_s,
            "makespan_s": self.makespan_s,
            "evicted_blocks": self.evicted_blocks,
            "qttft_quantiles_s": list(self.qttft_quantiles),
            "seconds": round(self.seconds, 3),
        }


def summarize(
    policy: str,
    capacity: int,
    work: Workload,
    out: Outcomes,
    lengths: NDArray[np.int64],
    seconds: float = 0.0,
) -> SimResult:
    """The metrics of one run from its per-request outcomes (``lengths``: blocks per
    request)."""
    if np.isnan(out.finished).any():
        raise ValueError("summarize: some requests never finished")
    queue = out.started - out.arrival
    ttft = out.first_token - out.started
    qttft = out.first_token - out.arrival
    quantiles = np.quantile(qttft, QUANTILES).tolist() if len(qttft) else []
    span = float(out.finished.max() - out.arrival.min()) if len(qttft) else 0.0
    last_start = float(out.started.max() - out.arrival.min()) if len(qttft) else 0.0
    return SimResult(
        policy=policy,
        capacity=capacity,
        requests=work.n_requests,
        hits=int(out.hit_blocks.sum()),
        accesses=int(lengths.sum()),
        prompt_tokens=int(sum(work.prompt_tokens)),
        saved_tokens=int(out.cached_tokens.sum()),
        output_tokens=int(sum(work.output_tokens)),
        ttft=Latency.of(ttft),
        qttft=Latency.of(qttft),
        queue=Latency.of(queue),
        makespan_s=span,
        last_start_s=last_start,
        qttft_quantiles=tuple(quantiles),
        seconds=seconds,
        evicted_blocks=out.evicted_blocks,
    )

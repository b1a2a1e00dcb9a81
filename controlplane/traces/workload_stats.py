"""Workload statistics of a trace, the paper's way: hit ratio, reuse times, lifespans, skew.

Owns ``trace_stats`` and ``TraceStats``, the numbers ``kvwise trace stats`` prints and the
synthetic traces are calibrated against (docs/traces.md), and ``workload_samples``, the
per-request, per-access and per-block values they summarise (what the figures plot).
Everything is vectorised numpy over the flat ``Trace`` arrays (one stable sort of the
accesses by block is the costliest step), so ten million accesses take seconds. It must
never read files, print, plot, or replay a policy.

Definitions (all times in seconds, all quantiles ``inverted_cdf``: the P80 is the
smallest observed value with at least 80 % of the sample at or below it):

- *Ideal hit ratio*: an infinite cache under the replay semantics (docs/replay.md). A block at
  position ``i`` of a request is a hit iff every block ``0..i`` of that request was
  accessed by an *earlier* request (a block repeated inside one request is no hit).
- *Reuse time*: for every access of a block that is accessed again by a later request,
  the time to that next access. Grouped by the category of the earlier access (the one
  the eviction policy must judge).
- *Lifespan*: per block, time from its first to its last access. ``lifespan`` covers
  the blocks accessed by more than one request (a block never reused has no life to
  speak of); ``lifespan_all_blocks`` counts every block, the never-reused at 0 s.
- *Skew*: the smallest share of requests that together give 90 % of the ideal hits.
- *Multi-turn share*: share of requests with ``turn >= 2``. *Next-turn probability*:
  share of requests of a turn whose ``chat_id`` is the ``parent_chat_id`` of a request in
  the trace (after turn 1, and after any later turn). ``followup_share_by_type`` is that
  probability after turn 1, per type: the share of a type's conversations that go on.

Fields a trace cannot support (Mooncake has no type, turn or chat ids; a recorded trace
has turns but no ``parent_chat_id`` links) are ``None``, never zero.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from controlplane.traces.arrays import F64, I32, I64
from controlplane.traces.model import Trace

QUANTILES = (0.5, 0.8, 0.9, 0.99)
SKEW_HIT_SHARE = 0.9


@dataclass(frozen=True)
class Quantiles:
    """P50/P80/P90/P99 of a sample of ``count`` values (``inverted_cdf``)."""

    count: int
    p50: float
    p80: float
    p90: float
    p99: float

    @classmethod
    def of(cls, values: F64) -> Quantiles | None:
        if len(values) == 0:
            return None
        q = np.quantile(values, QUANTILES, method="inverted_cdf")
        return cls(len(values), *(float(x) for x in q))


@dataclass(frozen=True)
class TraceStats:
    """A trace's workload statistics; see the module docstring for each definition."""

    name: str
    source_format: str
    requests: int
    block_accesses: int
    unique_blocks: int
    duration_s: float
    qps: float | None
    mean_input_tokens: float | None
    mean_output_tokens: float | None
    ideal_hits: int
    ideal_hit_ratio: float
    skew_request_share: float | None
    type_mix: dict[str, float] | None
    multi_turn_share: float | None
    multi_turn_share_by_type: dict[str, float] | None
    next_turn_prob_first: float | None
    next_turn_prob_later: float | None
    followup_share_by_type: dict[str, float] | None
    single_turn_hit_share: float | None
    reuse_time: Quantiles | None
    reuse_time_by_category: dict[str, Quantiles]
    lifespan: Quantiles | None
    lifespan_all_blocks: Quantiles | None

    def to_json(self) -> dict[str, object]:
        """A JSON-ready dict (nested quantiles as dicts, unavailable fields as null), its
        numbers to ``JSON_DIGITS`` significant digits."""
        rounded: dict[str, object] = _rounded(asdict(self))
        return rounded


JSON_DIGITS = 12
"""Significant digits of the JSON's numbers: differences of trace timestamps carry float
noise past them (a reuse time of 0.036000000000001364 s is 0.036 s)."""


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return float(f"{value:.{JSON_DIGITS}g}")
    if isinstance(value, dict):
        return {key: _rounded(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_rounded(item) for item in value]
    return value


@dataclass(frozen=True, eq=False)
class WorkloadSamples:
    """The values the statistics summarise (module docstring for each definition)."""

    request_hits: I64
    """Ideal (infinite cache) prefix hits of each request, in replay order."""
    reuse_times: F64
    """Each access's time to the same block's next access by a later request."""
    reuse_categories: I32
    """Category code of the earlier access of each reuse time."""
    lifespans: F64
    """Per block: first to last access (0 for a block one request accessed)."""
    reused: NDArray[np.bool_]
    """Per block (same order as ``lifespans``): accessed by more than one request."""


def workload_samples(trace: Trace) -> WorkloadSamples:
    """Every sample of ``trace`` the statistics and figures are made of."""
    req_of_pos = np.repeat(np.arange(trace.n_requests, dtype=np.int64), trace.lengths)
    order = np.argsort(trace.blocks, kind="stable")  # by block, then time
    b_sorted = trace.blocks[order]
    r_sorted = req_of_pos[order]
    gaps, gap_cats = _reuse_gaps(trace, b_sorted, r_sorted)
    lifespans, reused = _lifespans(trace, b_sorted, r_sorted)
    return WorkloadSamples(
        request_hits=prefix_hits(trace, req_of_pos, b_sorted, r_sorted),
        reuse_times=gaps,
        reuse_categories=gap_cats,
        lifespans=lifespans,
        reused=reused,
    )


def trace_stats(trace: Trace, samples: WorkloadSamples | None = None) -> TraceStats:
    """Compute every statistic of ``trace`` (see the module docstring); ``samples`` when
    the caller has them already."""
    n = trace.n_requests
    s = workload_samples(trace) if samples is None else samples
    total_hits = int(s.request_hits.sum())
    duration = float(trace.timestamps[-1] - trace.timestamps[0]) if n else 0.0
    turns = _turn_stats(trace)
    has_types = any(trace.type_names)
    return TraceStats(
        name=trace.name,
        source_format=trace.source_format,
        requests=n,
        block_accesses=trace.n_accesses,
        unique_blocks=trace.n_unique,
        duration_s=duration,
        qps=n / duration if duration > 0 else None,
        mean_input_tokens=_mean_known(trace.input_lengths),
        mean_output_tokens=_mean_known(trace.output_lengths),
        ideal_hits=total_hits,
        ideal_hit_ratio=total_hits / trace.n_accesses if trace.n_accesses else 0.0,
        skew_request_share=skew_request_share(s.request_hits),
        type_mix=_type_mix(trace) if has_types else None,
        multi_turn_share=turns.multi_share,
        multi_turn_share_by_type=turns.multi_by_type if has_types else None,
        next_turn_prob_first=turns.next_first,
        next_turn_prob_later=turns.next_later,
        followup_share_by_type=turns.followup_by_type if has_types else None,
        single_turn_hit_share=_single_turn_hit_share(trace, s.request_hits, total_hits),
        reuse_time=Quantiles.of(s.reuse_times),
        reuse_time_by_category=_by_category(trace, s.reuse_times, s.reuse_categories),
        lifespan=Quantiles.of(s.lifespans[s.reused]),
        lifespan_all_blocks=Quantiles.of(s.lifespans),
    )


def prefix_hits(
    trace: Trace,
    req_of_pos: I64 | None = None,
    b_sorted: I64 | None = None,
    r_sorted: I64 | None = None,
) -> I64:
    """Ideal (infinite cache) prefix hits of every request, vectorised.

    A position is *seen* when its block's first request is an earlier one; a request's
    hits are the blocks before its first unseen position. The optional arguments are the
    request of every position and the accesses sorted by block (stable), when the caller
    has them already.
    """
    n = trace.n_requests
    if req_of_pos is None:
        req_of_pos = np.repeat(np.arange(n, dtype=np.int64), trace.lengths)
    if b_sorted is None or r_sorted is None:
        order = np.argsort(trace.blocks, kind="stable")
        b_sorted, r_sorted = trace.blocks[order], req_of_pos[order]
    hits = trace.lengths.copy()
    if len(b_sorted) == 0:
        return hits
    starts = _group_starts(b_sorted)
    first_req = np.empty(int(b_sorted[-1]) + 1, dtype=np.int64)
    first_req[b_sorted[starts]] = r_sorted[starts]
    unseen = np.flatnonzero(first_req[trace.blocks] >= req_of_pos)
    r_unseen = req_of_pos[unseen]
    first = np.ones(len(unseen), dtype=bool)
    first[1:] = r_unseen[1:] != r_unseen[:-1]
    within = unseen[first] - trace.offsets[r_unseen[first]]
    hits[r_unseen[first]] = within
    return hits


def skew_request_share(hits: I64, share: float = SKEW_HIT_SHARE) -> float | None:
    """Smallest share of requests whose hits add up to ``share`` of all hits."""
    total = int(hits.sum())
    if total == 0:
        return None
    cum = np.cumsum(np.sort(hits)[::-1])
    k = int(np.searchsorted(cum, share * total, side="left")) + 1
    return k / len(hits)


def _group_starts(sorted_keys: I64) -> I64:
    new = np.ones(len(sorted_keys), dtype=bool)
    new[1:] = sorted_keys[1:] != sorted_keys[:-1]
    return np.flatnonzero(new)


def _reuse_gaps(trace: Trace, b_sorted: I64, r_sorted: I64) -> tuple[F64, I32]:
    """Time from each access to the same block's next access by a later request, and the
    category of the earlier access."""
    pair = (b_sorted[1:] == b_sorted[:-1]) & (r_sorted[1:] != r_sorted[:-1])
    earlier, later = r_sorted[:-1][pair], r_sorted[1:][pair]
    ts = trace.timestamps
    return ts[later] - ts[earlier], trace.categories[earlier]


def _lifespans(trace: Trace, b_sorted: I64, r_sorted: I64) -> tuple[F64, NDArray[np.bool_]]:
    """Per block: first to last access, and whether more than one request accessed it."""
    if len(b_sorted) == 0:
        return np.zeros(0), np.zeros(0, dtype=bool)
    starts = _group_starts(b_sorted)
    ends = np.append(starts[1:] - 1, len(b_sorted) - 1)
    first, last = r_sorted[starts], r_sorted[ends]
    return trace.timestamps[last] - trace.timestamps[first], first != last


def _by_category(trace: Trace, gaps: F64, cats: I32) -> dict[str, Quantiles]:
    out: dict[str, Quantiles] = {}
    # Category codes are small: as 16-bit keys the stable sort is a radix sort, O(n).
    keys = cats.astype(np.uint16) if len(trace.category_names) <= 1 << 16 else cats
    order = np.argsort(keys, kind="stable")
    sorted_cats = cats[order]
    bounds = np.searchsorted(sorted_cats, np.arange(len(trace.category_names) + 1))
    for c, name in enumerate(trace.category_names):
        q = Quantiles.of(gaps[order[bounds[c] : bounds[c + 1]]])
        if q is not None:
            out[name] = q
    return out


def _mean_known(values: I64) -> float | None:
    known = values[values >= 0]
    return float(known.mean()) if len(known) else None


def _type_mix(trace: Trace) -> dict[str, float]:
    counts = np.bincount(trace.types, minlength=len(trace.type_names))
    n = max(trace.n_requests, 1)
    return {name: int(c) / n for name, c in zip(trace.type_names, counts, strict=True) if c}


def _single_turn_hit_share(trace: Trace, hits: I64, total: int) -> float | None:
    if total == 0 or not _has_turns(trace):
        return None
    return int(hits[trace.turns == 1].sum()) / total


def _has_turns(trace: Trace) -> bool:
    return trace.n_requests > 0 and bool(np.all(trace.turns >= 1))


@dataclass(frozen=True)
class _TurnStats:
    multi_share: float | None = None
    multi_by_type: dict[str, float] | None = None
    next_first: float | None = None
    next_later: float | None = None
    followup_by_type: dict[str, float] | None = None


def _turn_stats(trace: Trace) -> _TurnStats:
    if not _has_turns(trace):
        return _TurnStats()
    multi = trace.turns >= 2
    by_type = {
        name: float(multi[trace.types == t].mean())
        for t, name in enumerate(trace.type_names)
        if np.any(trace.types == t)
    }
    unlinked = np.any(multi) and not np.any(trace.parent_chat_ids >= 0)
    if np.any(trace.chat_ids < 0) or unlinked:  # no chats, or later turns with no parent
        return _TurnStats(float(multi.mean()), by_type)
    parents = trace.parent_chat_ids[trace.parent_chat_ids >= 0]
    continued = np.isin(trace.chat_ids, parents)
    first = trace.turns == 1
    followup = {
        name: float(continued[first & (trace.types == t)].mean())
        for t, name in enumerate(trace.type_names)
        if np.any(first & (trace.types == t))
    }
    return _TurnStats(
        multi_share=float(multi.mean()),
        multi_by_type=by_type,
        next_first=float(continued[first].mean()) if np.any(first) else None,
        next_later=float(continued[multi].mean()) if np.any(multi) else None,
        followup_by_type=followup,
    )

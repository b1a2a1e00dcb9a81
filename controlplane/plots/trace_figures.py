"""The paper's figures of any trace: reuse-time CDF per category, lifespan CDF, hit share by
turn, skew.

Owns drawing each figure from ``WorkloadSamples`` (``controlplane.traces.workload_stats``
computes them; the definitions are its docstring's) and ``write_trace_figures``, which
writes every figure the trace supports into one directory and says why it skipped the
others (a Mooncake trace has no turns; a trace without reuse has no reuse times). Times
are on log axes; a value under ``TIME_FLOOR_S`` is drawn at the floor. It must never
compute a statistic the library does not.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from controlplane.plots.common import DEFAULT_SIZE, Size, figure, save
from controlplane.traces.model import Trace
from controlplane.traces.workload_stats import (
    SKEW_HIT_SHARE,
    WorkloadSamples,
    skew_request_share,
)

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

TIME_FLOOR_S = 1e-3
"""Times below this (simultaneous requests) are drawn at it: a log axis has no zero."""
CDF_POINTS = 2000
"""Most points drawn per CDF: enough for a smooth curve, few enough for a small file."""
MAX_TURN = 10
"""Turns past this are drawn together (the last bar, "10+": turns 10 and later)."""
TOP_CATEGORIES = 8
"""Categories drawn in the reuse-time CDF at most (more lines than this are unreadable),
whatever the caller's ``top_categories``."""


@dataclass
class Written:
    """What ``write_trace_figures`` wrote, and each figure it skipped with the reason."""

    paths: list[Path] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)


def write_trace_figures(
    directory: Path,
    trace: Trace,
    samples: WorkloadSamples,
    *,
    size: Size = DEFAULT_SIZE,
    top_categories: int = TOP_CATEGORIES,
) -> Written:
    """Every figure ``trace`` supports, as ``directory/NAME.png`` (the folder is made if
    missing, never its parents)."""
    figures = {
        "reuse_time_cdf": reuse_time_cdf(trace, samples, size, top_categories),
        "lifespan_cdf": lifespan_cdf(samples, size, trace.name),
        "hit_share_by_turn": hit_share_by_turn(trace, samples, size),
        "skew": skew(samples, size),
    }
    written = Written()
    directory.mkdir(exist_ok=True)  # the folder named, never its parents
    for name, made in figures.items():
        if isinstance(made, str):
            written.skipped[name] = made
        else:
            written.paths.append(save(made, directory / f"{name}.png"))
    return written


def _thinned(n: int) -> NDArray[np.int64]:
    """At most ``CDF_POINTS`` evenly spread indexes of ``n`` points, first and last kept."""
    return np.unique(np.linspace(0, n - 1, min(n, CDF_POINTS)).astype(np.int64))


def _cdf(values: NDArray[np.float64]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Points ``(x, share of values <= x)`` of the empirical CDF, at most ``CDF_POINTS``."""
    x = np.sort(np.maximum(values, TIME_FLOOR_S))
    y = np.arange(1, len(x) + 1, dtype=np.float64) / len(x)
    keep = _thinned(len(x))
    return x[keep], y[keep]


def _time_axes(ax: Axes, xlabel: str, title: str) -> None:
    ax.set_xscale("log")
    ax.set_xlabel(f"{xlabel} (s, log scale; under {TIME_FLOOR_S * 1e3:g} ms at the left edge)")
    ax.set_ylabel("share at or below")
    ax.set_ylim(0, 1.01)
    ax.set_title(title)
    ax.grid(True, which="major", alpha=0.3)


def reuse_time_cdf(
    trace: Trace, samples: WorkloadSamples, size: Size, top: int = TOP_CATEGORIES
) -> Figure | str:
    """CDF of reuse times, all together and for the ``top`` categories by reuses (at most
    ``TOP_CATEGORIES``)."""
    if len(samples.reuse_times) == 0:
        return "no block is accessed by two requests"
    fig, (ax,) = figure(size=size)
    x, y = _cdf(samples.reuse_times)
    ax.plot(x, y, color="black", linewidth=2.2, label=f"all ({len(samples.reuse_times):,})")
    counts = np.bincount(samples.reuse_categories, minlength=len(trace.category_names))
    ranked = [
        int(c)
        for c in np.argsort(-counts, kind="stable")[: min(top, TOP_CATEGORIES)]
        if counts[c] > 0
    ]
    if len(ranked) > 1:
        for code in ranked:
            x, y = _cdf(samples.reuse_times[samples.reuse_categories == code])
            label = f"{trace.category_names[code]} ({counts[code]:,})"
            ax.plot(x, y, linewidth=1.2, label=label)
    _time_axes(ax, "time to the next access", f"Reuse time by category: {trace.name}")
    ax.legend(title="category (reuses)", fontsize="small", loc="lower right")
    return fig


def lifespan_cdf(samples: WorkloadSamples, size: Size, name: str = "") -> Figure | str:
    """CDF of block lifespans (first to last access) of the blocks accessed again."""
    reused = samples.lifespans[samples.reused]
    if len(reused) == 0:
        return "no block is accessed by two requests"
    fig, (ax,) = figure(size=size)
    x, y = _cdf(reused)
    share = len(reused) / len(samples.lifespans)
    ax.plot(x, y, color="tab:blue", linewidth=2, label=f"reused blocks ({len(reused):,})")
    p90 = float(np.quantile(reused, 0.9, method="inverted_cdf"))
    ax.axvline(max(p90, TIME_FLOOR_S), color="gray", linestyle=":", label=f"P90 {p90:,.3g} s")
    _time_axes(ax, "lifespan, first to last access", f"Lifespan of reused blocks: {name}")
    ax.legend(loc="lower right")
    ax.text(
        0.02,
        0.95,
        f"{share:.1%} of {len(samples.lifespans):,} blocks are accessed again; the rest live 0 s",
        transform=ax.transAxes,
        va="top",
    )
    return fig


def hit_share_by_turn(trace: Trace, samples: WorkloadSamples, size: Size) -> Figure | str:
    """Share of ideal hits and of requests by turn (turn ``MAX_TURN`` and later together)."""
    if trace.n_requests == 0 or np.any(trace.turns < 1):
        return "the trace has no turn numbers (Mooncake traces carry none)"
    total_hits = int(samples.request_hits.sum())
    if total_hits == 0:
        return "the trace has no hits"
    turn = np.minimum(trace.turns, MAX_TURN)
    hits = np.bincount(turn, weights=samples.request_hits, minlength=MAX_TURN + 1)[1:]
    requests = np.bincount(turn, minlength=MAX_TURN + 1)[1:]
    fig, (ax,) = figure(size=size)
    at = np.arange(1, MAX_TURN + 1)
    ax.bar(at - 0.2, hits / total_hits, width=0.4, label="share of ideal hits")
    ax.bar(at + 0.2, requests / trace.n_requests, width=0.4, label="share of requests")
    ax.set_xticks(at, [str(t) for t in at[:-1]] + [f"{MAX_TURN}+"])
    ax.set_xlabel("turn")
    ax.set_ylabel("share")
    ax.set_title(f"Ideal (infinite cache) hits by turn: {trace.name}")
    ax.legend()
    ax.grid(True, axis="y", alpha=0.3)
    return fig


def skew(samples: WorkloadSamples, size: Size) -> Figure | str:
    """Cumulative share of ideal hits against the share of requests, most hits first."""
    hits = samples.request_hits
    share = skew_request_share(hits)
    if share is None:
        return "the trace has no hits"
    cumulative = np.cumsum(np.sort(hits)[::-1]) / hits.sum()
    requests = np.arange(1, len(hits) + 1) / len(hits)
    keep = _thinned(len(hits))
    fig, (ax,) = figure(size=size)
    ax.plot(requests[keep], cumulative[keep], linewidth=2, label="this trace")
    ax.plot([0, 1], [0, 1], color="gray", linestyle=":", label="hits spread evenly")
    ax.axhline(SKEW_HIT_SHARE, color="gray", linewidth=0.8)
    ax.axvline(share, color="tab:red", linestyle="--", label=f"{share:.1%} of requests")
    ax.set_xlabel("share of requests, those with the most ideal hits first")
    ax.set_ylabel("share of all ideal hits")
    ax.set_title(f"Skew: {share:.1%} of requests give {SKEW_HIT_SHARE:.0%} of the hits")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.01)
    ax.legend(loc="lower right")
    ax.grid(True, alpha=0.3)
    return fig

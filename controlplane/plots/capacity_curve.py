"""Hit ratio against cache size, one line per policy, the bounds drawn apart.

Owns ``capacity_curve`` and ``write_capacity_curve`` for ``kvwise replay --plot``: each
policy's block hit ratio at every capacity of the run, Belady and the infinite cache as
dashed and dotted reference lines, the capacity in blocks below and as a share of the
trace's unique blocks above. It must never replay anything (the results are
``controlplane.replay``'s).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import ArrayLike, NDArray

from controlplane.plots.common import DEFAULT_SIZE, Size, figure, save
from controlplane.replay.catalog import BOUNDS
from controlplane.replay.engine import ReplayResult

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

_BOUND_STYLE = {"belady": ("black", "--"), "inf": ("gray", ":")}
_BOUND_LABEL = {"belady": "belady (farthest next use)", "inf": "inf (infinite cache)"}
LOG_SCALE_SPAN = 8
"""Capacities spanning this factor or more go on a log axis."""
MAX_CAPACITY_TICKS = 8
"""Up to this many capacities, each gets its own tick (labels would crowd past it)."""


def capacity_curve(
    results: Sequence[ReplayResult], unique_blocks: int, title: str, size: Size = DEFAULT_SIZE
) -> Figure:
    """The figure of ``results`` (every policy at every capacity of one trace)."""
    fig, (ax,) = figure(size=size)
    policies = list(dict.fromkeys(r.policy for r in results))
    for policy in [p for p in policies if p not in BOUNDS] + [p for p in BOUNDS if p in policies]:
        runs = sorted((r for r in results if r.policy == policy), key=lambda r: r.capacity)
        capacities = [r.capacity for r in runs]
        ratios = [r.hit_ratio for r in runs]
        if policy in _BOUND_STYLE:
            color, style = _BOUND_STYLE[policy]
            ax.plot(capacities, ratios, color=color, linestyle=style, label=_BOUND_LABEL[policy])
        else:
            ax.plot(capacities, ratios, marker="o", linewidth=1.6, label=policy)
    capacities = sorted({r.capacity for r in results})
    if capacities[0] > 0 and capacities[-1] / capacities[0] >= LOG_SCALE_SPAN:
        ax.set_xscale("log")
    _capacity_ticks(ax, capacities, unique_blocks)
    ax.set_xlabel("cache size (blocks)")
    ax.set_ylabel("block hit ratio")
    ax.set_ylim(0, max(1e-3, max(r.hit_ratio for r in results)) * 1.08)
    ax.set_title(title)
    ax.grid(True, which="major", alpha=0.3)
    fig.legend(loc="outside right upper", title="policy")
    return fig


def _capacity_ticks(ax: Axes, capacities: list[int], unique_blocks: int) -> None:
    """Ticks at the capacities of the run (a few at most: else the axis's own), in blocks
    below and as a percentage of the unique blocks on a second axis on top."""
    from matplotlib.ticker import FuncFormatter, NullLocator

    top = None
    if unique_blocks > 0:

        def to_percent(blocks: ArrayLike) -> NDArray[np.float64]:
            return np.asarray(blocks, dtype=np.float64) * (100.0 / unique_blocks)

        def to_blocks(percent: ArrayLike) -> NDArray[np.float64]:
            return np.asarray(percent, dtype=np.float64) * (unique_blocks / 100.0)

        top = ax.secondary_xaxis("top", functions=(to_percent, to_blocks))
        top.set_xlabel("cache size, % of the trace's unique blocks")
    if len(capacities) > MAX_CAPACITY_TICKS:
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _pos: f"{x:,.0f}"))
        if top is not None:
            top.xaxis.set_major_formatter(FuncFormatter(lambda x, _pos: f"{x:.3g}%"))
        return
    ax.set_xticks(capacities, [f"{c:,}" for c in capacities])
    ax.xaxis.set_minor_locator(NullLocator())
    if top is not None:
        percents = [c * 100.0 / unique_blocks for c in capacities]
        top.set_xticks(percents, [f"{p:.3g}%" for p in percents])
        top.xaxis.set_minor_locator(NullLocator())


def write_capacity_curve(
    path: Path,
    results: Sequence[ReplayResult],
    unique_blocks: int,
    title: str,
    size: Size = DEFAULT_SIZE,
) -> Path:
    """``capacity_curve`` written to ``path`` as a PNG."""
    return save(capacity_curve(results, unique_blocks, title, size), path)

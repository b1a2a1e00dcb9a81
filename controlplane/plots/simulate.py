"""``kvwise simulate --plot``: QTTFT CDF per policy; hit ratio and QTTFT against size.

Owns the simulate figure: three panels drawn from ``SimResult`` values (the QTTFT
quantiles each result carries), the CDF at the smallest simulated size, where policies
differ most. The CDF's QTTFT axis starts at 0 and is linear up to the decade of the
smallest QTTFT above 0, logarithmic past it, labelled at 0 and every decade, so an
unloaded fleet's milliseconds and a loaded one's minutes both read. It must never run
simulations.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from controlplane.plots.common import Size, figure, save
from controlplane.simulate.report import QUANTILES, SimResult

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

SIZE = Size(1800, 456)
"""Three panels side by side, each 600 x 456 pixels."""


def plot_simulation(results: Sequence[SimResult], path: Path, *, title: str = "") -> None:
    """Write the simulate figure for ``results`` to ``path`` (PNG)."""
    save(simulation_figure(results), path, title)


def simulation_figure(results: Sequence[SimResult]) -> Figure:
    """The simulate figure for ``results``: CDF, hit ratio and mean QTTFT, side by side."""
    policies = list(dict.fromkeys(r.policy for r in results))
    capacities = sorted({r.capacity for r in results})
    by = {(r.policy, r.capacity): r for r in results}
    fig, (cdf, hits, qttft) = figure(3, size=SIZE)
    smallest = capacities[0]
    shown: list[float] = []
    for name in policies:
        r = by.get((name, smallest))
        if r is not None and r.qttft_quantiles:
            cdf.plot(r.qttft_quantiles, QUANTILES, label=name)
            shown.extend(r.qttft_quantiles)
        sizes = [c for c in capacities if (name, c) in by]
        hits.plot(sizes, [by[(name, c)].hit_ratio for c in sizes], marker="o", label=name)
        qttft.plot(sizes, [by[(name, c)].qttft.mean for c in sizes], marker="o", label=name)
    _seconds_axis(cdf, shown)
    cdf.set(xlabel="QTTFT (s)", ylabel="share of requests")
    cdf.set_title(f"QTTFT CDF at {smallest:,} blocks")
    hits.set(xlabel="cache size (blocks per instance)", ylabel="block hit ratio")
    hits.set_title("Hit ratio")
    qttft.set(xlabel="cache size (blocks per instance)", ylabel="mean QTTFT (s)")
    qttft.set_title("Mean QTTFT")
    for ax in (cdf, hits, qttft):
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    return fig


FINEST = 1e-4
"""The smallest decade the QTTFT axis labels (0.1 ms): below it is the linear part."""


def _seconds_axis(ax: Axes, seconds: Sequence[float]) -> None:
    """Make ``ax``'s x axis fit ``seconds`` (0 or more): from 0, linear up to the decade of
    the smallest above 0 (at least ``FINEST``), logarithmic to the decade at or above the
    largest, with 0 and each decade labelled in plain numbers."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    above = [s for s in seconds if s > 0 and math.isfinite(s)]
    low = math.floor(math.log10(max(min(above), FINEST))) if above else 0
    high = max(math.ceil(math.log10(max(above))), low + 1) if above else 0
    ax.set_xscale("symlog", linthresh=10.0**low, linscale=0.5)
    ax.set_xlim(0, 10.0**high)
    ax.xaxis.set_major_locator(FixedLocator([0.0, *(10.0**k for k in range(low, high + 1))]))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: _plain(x)))
    steps = [m * 10.0**k for k in range(low, high) for m in range(2, 10)]
    ax.xaxis.set_minor_locator(FixedLocator(steps))
    ax.xaxis.set_minor_formatter(NullFormatter())


def _plain(seconds: float) -> str:
    """A decade of seconds as a plain number: 0, 0.001, 1, 100."""
    return f"{seconds:.{max(0, -math.floor(math.log10(seconds)))}f}" if seconds > 0 else "0"

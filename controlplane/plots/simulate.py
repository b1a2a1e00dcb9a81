"""``kvwise simulate --plot``: QTTFT CDF per policy; hit ratio and QTTFT against size.

Owns the simulate figure: three panels drawn from ``SimResult`` values (the QTTFT
quantiles each result carries), the CDF at the smallest simulated size, where policies
differ most. It must never run simulations.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from controlplane.plots.common import Size, figure, save
from controlplane.simulate.report import QUANTILES, SimResult

SIZE = Size(1800, 456)
"""Three panels side by side, each 600 x 456 pixels."""


def plot_simulation(results: Sequence[SimResult], path: Path, *, title: str = "") -> None:
    """Write the simulate figure for ``results`` to ``path`` (PNG)."""
    policies = list(dict.fromkeys(r.policy for r in results))
    capacities = sorted({r.capacity for r in results})
    by = {(r.policy, r.capacity): r for r in results}
    fig, (cdf, hits, qttft) = figure(3, size=SIZE)
    smallest = capacities[0]
    for name in policies:
        r = by.get((name, smallest))
        if r is not None and r.qttft_quantiles:
            cdf.plot(r.qttft_quantiles, QUANTILES, label=name)
        sizes = [c for c in capacities if (name, c) in by]
        hits.plot(sizes, [by[(name, c)].hit_ratio for c in sizes], marker="o", label=name)
        qttft.plot(sizes, [by[(name, c)].qttft.mean for c in sizes], marker="o", label=name)
    cdf.set(xscale="symlog", xlabel="QTTFT (s)", ylabel="share of requests")
    cdf.set_title(f"QTTFT CDF at {smallest:,} blocks")
    hits.set(xlabel="cache size (blocks per instance)", ylabel="block hit ratio")
    hits.set_title("Hit ratio")
    qttft.set(xlabel="cache size (blocks per instance)", ylabel="mean QTTFT (s)")
    qttft.set_title("Mean QTTFT")
    for ax in (cdf, hits, qttft):
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    save(fig, path, title)

"""Regenerate the figures docs/ shows, with the commands the docs give for them.

    python docs/figures/make_figures.py            # writes docs/figures/*.png
    python docs/figures/make_figures.py --out DIR --duration 120   # a quick check

Synthetic data: a to-C trace from ``kvwise trace synth`` (calibrated to the paper,
docs/traces.md; seed 7), never a measurement of the real traces. The trace figures are
``kvwise trace stats --plot`` on 1,800 s of it at 6 QPS; the capacity curve is
``kvwise replay --plot`` on the first 600 s. Each PNG is then reduced to a 64-colour
palette (Pillow, which matplotlib depends on) so the committed files stay small; the
pixels' size is unchanged.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
TRACE_FIGURES = ("reuse_time_cdf", "lifespan_cdf", "hit_share_by_turn", "skew")
REPLAY_FIGURE = "capacity_curve"
POLICIES = "lru,fifo,lfu,s3fifo,sieve,arc,wa"
CAPACITY_FRACS = "0.02,0.05,0.1,0.2,0.4"
PALETTE_COLOURS = 64


def kvwise(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "controlplane", *args], check=True)


def shrink(png: Path) -> None:
    from PIL import Image

    with Image.open(png) as image:
        small = image.convert("RGB").quantize(colors=PALETTE_COLOURS)
    small.save(png, optimize=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE)
    parser.add_argument("--duration", type=float, default=1800.0, help="seconds of trace")
    parser.add_argument("--replay-duration", type=float, default=600.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        stats_trace, replay_trace = Path(tmp) / "toc.jsonl.gz", Path(tmp) / "toc-short.jsonl.gz"
        common = ["--profile", "to-c", "--qps", "6", "--seed", "7"]
        kvwise("trace", "synth", *common, "--duration", str(args.duration), "-o", str(stats_trace))
        kvwise("trace", "stats", str(stats_trace), "--plot", str(args.out), "--json")
        duration = str(min(args.replay_duration, args.duration))
        kvwise("trace", "synth", *common, "--duration", duration, "-o", str(replay_trace))
        curve = args.out / f"{REPLAY_FIGURE}.png"
        kvwise("replay", str(replay_trace), "-p", POLICIES, "--capacity-frac", CAPACITY_FRACS,
               "--plot", str(curve), "--json")  # fmt: skip
    for name in (*TRACE_FIGURES, REPLAY_FIGURE):
        shrink(args.out / f"{name}.png")
        print(f"{args.out / name}.png")


if __name__ == "__main__":
    main()

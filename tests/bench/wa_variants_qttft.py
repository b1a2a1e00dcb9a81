"""QTTFT of ``wa``'s variants and of ``auto`` in the serving simulator: the "A better wa"
and "``auto`` with reuse classes" QTTFT rows of docs/policy.md.

Run (not collected by pytest)::

    python -m tests.bench.wa_variants_qttft --seed 4242 --speeds to-c=0.75,to-b=1.75
    python -m tests.bench.wa_variants_qttft --seed 4242 --speeds to-c=0.75,to-b=1.75 \
        --policies lru,s3fifo,arc,wa,auto --variants "" --auto reuse_class=hit

On synthetic to-C and to-B traces (``controlplane.traces.synth``) it serves each trace
with the catalogue's ``--policies``, the variants of ``tests.bench.wa_variants`` named in
``--variants`` and ``auto`` with each ``--auto`` set of replay options, on one instance of
the default profile, at 0.5 and 1 times its KV pool and the given speed-up, and prints
mean QTTFT (seconds) and hit ratio per policy. Results to stdout, progress to stderr.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from controlplane.replay.options import ReplayOptions
from controlplane.simulate.engine import SimOptions
from controlplane.simulate.runner import run_matrix
from controlplane.traces.synth import synthesize
from tests.bench import auto_report
from tests.bench.ablation import Variant
from tests.bench.simulate_qttft import pool_blocks
from tests.bench.wa_variants import VARIANTS


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=4242)
    ap.add_argument("--duration", type=float, default=1800.0)
    ap.add_argument("--speeds", default="to-c=0.75,to-b=1.75")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument(
        "--variants",
        default="wa + reuse classes (hit or ghost 16x),wa + depth classes + saved-prefill weights",
    )
    ap.add_argument("--policies", default="lru,wa", help="catalogue policies, comma-separated")
    auto_report.add_variant_option(
        ap, "--auto", "also auto with these replay options, e.g. reuse_class=hit"
    )
    args = ap.parse_args(argv)
    labels = {name: name for name in args.policies.split(",") if name}
    for name, overrides in auto_report.register_variants(args.auto).items():
        labels[name] = f"auto, {overrides}"
    for label in [v for v in args.variants.split(",") if v]:
        labels[
            Variant(f"q:{label}", "wa", "censored", VARIANTS[label](ReplayOptions())).register()
        ] = label
    print("| trace, speed | size | " + " | ".join(labels.values()) + " |")
    print("|---|---|" + "---:|" * len(labels))
    for spec in args.speeds.split(","):
        profile, speed = spec.split("=")
        trace = synthesize(profile, duration_s=args.duration, qps=6.0, seed=args.seed)
        pool = pool_blocks(trace)
        caps = [round(0.5 * pool), pool]
        results = run_matrix(
            trace, list(labels), caps, SimOptions(speed=float(speed)), jobs=args.jobs
        )
        by = {(r.policy, r.capacity): r for r in results}
        for cap, size in zip(caps, ("0.5x", "1x"), strict=True):
            cells = [f"{by[n, cap].qttft.mean:.3f} ({by[n, cap].hit_ratio:.3f})" for n in labels]
            print(f"| {profile} x{speed} | {size} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()

"""Benchmark: reuse-statistics ingest and ``fit_all`` on a 10-million-access window.

Synthetic data only (``tests.synth_reuse.chain_stream``): each category gets a known
``p`` in [0.1, 0.9] and a rate log-uniform in [1e-3, 1] per second, and its share of the
accesses; streams run for one hour into a one-hour window (120 buckets). ``--events`` is
a target: chains cut at the end of the hour leave the window slightly short of it, so the
default of 10.5 million gives a window of just over 10 million accesses.

1. Ingest: events per second applied by ``ReuseStats.ingest`` on one core, in batches of
   several sizes, against a floor in the same process: ``np.add.at`` of the same events
   into one counter table (one scatter, the least any counting ingest does).
2. Fit: ``snapshot`` and ``fit_all`` of the full window for 20 and 100 categories (median
   of ``--repeat`` runs), against the same fit run one category at a time
   (``fit_cure_rate`` in a loop), which is what a per-category optimiser costs at best.

    python -m tests.bench.bench_fit [--events 10500000] [--repeat 5]

Not collected by pytest (no ``test_`` prefix); results go in docs/benchmarks.md ("Fitting").
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from controlplane.fit import fit_all, fit_cure_rate
from controlplane.fit.reuse_window import ReuseStats
from controlplane.fit.settings import FitSettings
from tests.synth_reuse import Stream, chain_stream

HOUR = 3600.0


def make_stream(n_events: int, n_categories: int, seed: int) -> Stream:
    rng = np.random.default_rng(seed)
    p = rng.uniform(0.1, 0.9, n_categories)
    rate = 10 ** rng.uniform(-3, 0, n_categories)
    share = rng.dirichlet(np.ones(n_categories))
    # A chain of category c has about 1 / (1 - p) accesses.
    chains = np.maximum((share * n_events * (1 - p)).astype(np.int64), 1)
    return chain_stream(chains.tolist(), p.tolist(), rate.tolist(), HOUR, seed=seed)


def bench_ingest(s: Stream, n_categories: int, batch: int) -> dict[str, float]:
    """Events/s (wall and CPU time of this process) of ReuseStats and of the floor, over
    the whole stream in ``batch``-sized cuts."""
    names = [f"c{i}" for i in range(n_categories)]
    st = ReuseStats(HOUR, categories=names, origin=0.0)
    cuts = range(0, len(s), batch)
    w0, c0 = time.perf_counter(), time.process_time()
    for i in cuts:
        j = i + batch
        st.ingest(s.ts[i:j], s.category[i:j], s.prev_ts[i:j], s.prev_category[i:j])
    w1, c1 = time.perf_counter(), time.process_time()
    table = np.zeros(120 * n_categories, dtype=np.int64)
    for i in cuts:
        j = i + batch
        cell = (s.ts[i:j] // 30.0).astype(np.int64) % 120 * n_categories + s.category[i:j]
        np.add.at(table, cell, 1)
    w2, c2 = time.perf_counter(), time.process_time()
    n = len(s)
    return {
        "wall": n / (w1 - w0),
        "cpu": n / (c1 - c0),
        "floor_wall": n / (w2 - w1),
        "floor_cpu": n / (c2 - c1),
    }


def bench_fit(s: Stream, n_categories: int, repeat: int) -> dict[str, float]:
    st = ReuseStats(HOUR, categories=[f"c{i}" for i in range(n_categories)], origin=0.0)
    st.ingest(s.ts, s.category, s.prev_ts, s.prev_category)
    settings = FitSettings()
    times: dict[str, list[float]] = {}

    def timed(key: str, w0: float, c0: float) -> tuple[float, float]:
        w, c = time.perf_counter(), time.process_time()
        times.setdefault(key + "_wall", []).append(w - w0)
        times.setdefault(key + "_cpu", []).append(c - c0)
        return w, c

    for _ in range(repeat):
        w, c = time.perf_counter(), time.process_time()
        snap = st.snapshot(HOUR)
        w, c = timed("snapshot", w, c)
        res = fit_all(snap, settings)
        w, c = timed("fit_all", w, c)
        for k in range(n_categories):
            fit_cure_rate(snap.observed[k], snap.censored[k], snap.edges)
        timed("one_by_one", w, c)
    out = {k: statistics.median(v) for k, v in times.items()}
    out["accesses"] = float(snap.total_accesses)
    out["fitted"] = float(sum(p.source == "fit" for p in res.categories.values()))
    out["state_mb"] = st.nbytes() / 1e6
    out["max_ks"] = max(
        (p.fit_quality or 0.0 for p in res.categories.values() if p.source == "fit"), default=0.0
    )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=10_500_000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    load = os.getloadavg()[0]
    print(f"cpus visible: {os.cpu_count()}, load average {load:.1f}; numpy {np.__version__}")
    for n_cat in (20, 100):
        t0 = time.perf_counter()
        s = make_stream(args.events, n_cat, seed=n_cat)
        print(
            f"\n{n_cat} categories: {len(s):,} events generated in {time.perf_counter() - t0:.1f} s"
        )
        for batch in (1_000, 10_000, 100_000):
            g = bench_ingest(s, n_cat, batch)
            print(
                f"  ingest batch {batch:>7,}: {g['wall'] / 1e6:5.2f} M events/s wall, "
                f"{g['cpu'] / 1e6:5.2f} M/s CPU (floor np.add.at: {g['floor_wall'] / 1e6:5.2f} "
                f"wall, {g['floor_cpu'] / 1e6:5.2f} CPU)"
            )
        r = bench_fit(s, n_cat, args.repeat)
        print(
            f"  window: {r['accesses']:,.0f} accesses, {r['fitted']:.0f} own fits, "
            f"state {r['state_mb']:.1f} MB, largest KS of an own fit {r['max_ks']:.3f}"
        )
        for key, label in (
            ("snapshot", "snapshot"),
            ("fit_all", "fit_all"),
            ("one_by_one", "same MLE one category at a time"),
        ):
            print(
                f"  {label}: {r[key + '_wall'] * 1e3:.1f} ms wall, "
                f"{r[key + '_cpu'] * 1e3:.1f} ms CPU (median of {args.repeat})"
            )


if __name__ == "__main__":
    main()

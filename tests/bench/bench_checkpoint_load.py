"""Benchmark: loading a checkpoint that is small in Redis and declares far more than the
window holds, before and after the bounded read.

A checkpoint of the controller's default window shape whose gap counts declare
``--declared-mb`` MB (int32, a ``--noise`` share of them 1, so the archive is about 800 KB)
is stored in Redis under its own key prefix. The same process then loads it ``--repeat``
times each way, the bounded read first (so the process's peak RSS, which only grows, says
what each added):

- after: ``CheckpointStore.load`` as the controller builds it (default settings), which
  refuses it from the array header;
- before: the read it replaced, one GET and every member unpacked by ``np.load``, as the
  checkpoint module did before any check.

Reported: time (best of the repeats, untraced), the growth of the process's peak RSS over
them, and tracemalloc's peak in one more, traced, load.

    python -m tests.bench.bench_checkpoint_load [--declared-mb 224] [--noise 0.004]
        [--repeat 3] [--redis-url redis://127.0.0.1:6379/0]

Not collected by pytest; results go in docs/benchmarks.md ("Checkpoint read bounds").
"""

from __future__ import annotations

import argparse
import io
import resource
import time
import tracemalloc
from collections.abc import Callable

import numpy as np
import redis

from agent.wire import Keys
from controlplane.service.checkpoint import CheckpointError, encode
from controlplane.service.controller_parts import checkpoint_store, live_window
from controlplane.service.settings import ControllerSettings
from tests import checkpoint_bombs

PREFIX = "kvwise-bench-checkpoint:"


def unbounded_load(r: redis.Redis, key: str) -> None:
    """The read before the bounds: the value whole, then every member unpacked."""
    raw = r.get(key)
    assert raw is not None
    with np.load(io.BytesIO(raw), allow_pickle=False) as archive:
        {name: archive[name] for name in archive.files}


def outcome(load: Callable[[], object]) -> str:
    """What ``load`` did: the refusal (a ``CheckpointError``) or "loaded"."""
    try:
        load()
    except CheckpointError as exc:
        return f"refused: {exc}"
    return "loaded"


def measured(load: Callable[[], object], repeat: int) -> tuple[float, int, int]:
    """(best time in s, peak RSS growth, tracemalloc peak; both in bytes) of ``load``: the
    timed runs untraced, then one traced run."""
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        said = outcome(load)
        best = min(best, time.perf_counter() - start)
    rss = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) * 1024
    tracemalloc.start()
    outcome(load)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    print(f"  {said[:200]}")
    return best, rss, peak


def run(declared_mb: float, noise: float, repeat: int, redis_url: str) -> None:
    settings = ControllerSettings(redis_url=redis_url, key_prefix=PREFIX)
    window = live_window(settings)
    bomb = checkpoint_bombs.declaring(
        encode(window.stats.state()), int(declared_mb * 1e6) // 4 * 4, noise=noise
    )
    r = redis.Redis.from_url(redis_url)
    key = Keys(PREFIX).checkpoint
    r.set(key, bomb)
    try:
        print(f"stored {len(bomb):,} bytes declaring {declared_mb:g} MB of gap counts")
        store = checkpoint_store(r, Keys(PREFIX), settings, window)
        rows = {
            "after (bounded)": measured(store.load, repeat),
            "before (GET + np.load)": measured(lambda: unbounded_load(r, key), repeat),
        }
    finally:
        r.delete(key)
    print(f"| read | time, best of {repeat} | peak RSS growth | tracemalloc peak |")
    print("|---|---|---|---|")
    for name, (best, rss, peak) in rows.items():
        print(f"| {name} | {best * 1e3:.1f} ms | {rss / 2**20:.0f} MiB | {peak / 2**20:.1f} MiB |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--declared-mb", type=float, default=224.0)
    parser.add_argument("--noise", type=float, default=0.004)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    args = parser.parse_args()
    run(args.declared_mb, args.noise, args.repeat, args.redis_url)


if __name__ == "__main__":
    main()

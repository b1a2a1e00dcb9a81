"""Benchmark: controller ingest, events decoded and applied per second on one core.

Synthetic data (``tests.synth_reuse.chain_stream``, 20 categories, one hour) cut into wire
batches of ``--batch`` events, as an agent sends them. Three measurements in one process:

1. decode only (``agent.wire.decode_batch``): the floor of any ingest;
2. decode + apply (``ReuseStats.ingest_batch``): the controller's work per batch;
3. the whole path through a real Redis: the batches are XADDed to a worker stream first
   (not timed), then ``controlplane.service.ingest.Ingestor`` reads them with XREADGROUP, decodes,
   applies and XACKs until the stream is drained.

    python -m tests.bench.bench_ingest [--events 4000000] [--batch 8192] [--redis-url URL]

Not collected by pytest; results go in docs/benchmarks.md ("Controller ingest").
"""

from __future__ import annotations

import argparse
import time
import uuid

import numpy as np
import redis

from agent.wire import EventBatch, EventKind, Keys, decode_batch, encode_batch
from controlplane.fit.reuse_window import ReuseStats
from controlplane.service.ingest import Ingestor
from tests.synth_reuse import chain_stream

HOUR = 3600.0


def make_batches(n_events: int, batch: int, seed: int) -> list[dict[str, bytes]]:
    k = 20
    rng = np.random.default_rng(seed)
    p = rng.uniform(0.1, 0.9, k)
    rate = 10 ** rng.uniform(-3, 0, k)
    chains = np.maximum((n_events / k * (1 - p)).astype(np.int64), 1)
    s = chain_stream(chains.tolist(), p.tolist(), rate.tolist(), HOUR, seed=seed)
    names = tuple(f"c{i}" for i in range(k))
    out = []
    for i in range(0, len(s), batch):
        j = min(i + batch, len(s))
        n = j - i
        out.append(
            encode_batch(
                EventBatch(
                    worker="bench",
                    seq=len(out) + 1,
                    epoch="e",
                    categories=names,
                    ts=s.ts[i:j],
                    block=rng.integers(0, 2**62, n, dtype=np.int64),
                    category=s.category[i:j],
                    offset=np.zeros(n, dtype=np.int32),
                    kind=np.where(np.isnan(s.prev_ts[i:j]), EventKind.INSERT, EventKind.HIT).astype(
                        np.uint8
                    ),
                    prev_ts=s.prev_ts[i:j],
                    prev_category=s.prev_category[i:j],
                )
            )
        )
    return out


def run(n_events: int, batch: int, url: str) -> None:
    batches = make_batches(n_events, batch, seed=1)
    raw = [{k.encode(): v for k, v in b.items()} for b in batches]  # as redis-py returns them
    total = sum(int(b["n"]) for b in batches)
    print(f"{total:,} events in {len(batches)} batches of {batch}")

    t0 = time.perf_counter()
    for fields in raw:
        decode_batch(fields)
    t_decode = time.perf_counter() - t0

    stats = ReuseStats(HOUR, origin=0.0)
    t0 = time.perf_counter()
    for fields in raw:
        stats.ingest_batch(decode_batch(fields))
    t_apply = time.perf_counter() - t0

    client = redis.Redis.from_url(url)
    keys = Keys(f"kvwise-bench-{uuid.uuid4().hex[:6]}:")
    stream = keys.events_stream("bench")
    try:
        pipe = client.pipeline(transaction=False)
        for b in batches:
            pipe.xadd(stream, b)  # type: ignore[arg-type]
        pipe.execute()
        stats2 = ReuseStats(HOUR, origin=0.0)
        ing = Ingestor(
            client, keys, stats2.ingest_batch, group="bench", consumer="c1", count=64, block_ms=0
        )
        t0 = time.perf_counter()
        while ing.counters.batches < len(batches):
            ing.poll_once()
        t_redis = time.perf_counter() - t0
    finally:
        client.delete(stream)
    for label, t in (
        ("decode only", t_decode),
        ("decode + apply", t_apply),
        ("Redis -> decode -> apply -> XACK", t_redis),
    ):
        print(f"{label:34s} {total / t / 1e6:6.2f} M events/s  ({t:.2f} s)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=4_000_000)
    ap.add_argument("--batch", type=int, default=8192)
    ap.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    a = ap.parse_args()
    run(a.events, a.batch, a.redis_url)


if __name__ == "__main__":
    main()

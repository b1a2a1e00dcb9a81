"""Benchmark: controller ingest, events decoded and applied per second on one core.

Synthetic data (``tests.synth_reuse.chain_stream``, 20 categories, one hour) cut into wire
batches of ``--batch`` events, as an agent sends them. Three measurements in one process:

1. decode only (``agent.wire.decode_batch``): the floor of any ingest;
2. decode + apply (``LiveWindow.apply``: clock and category checks, then the reuse window):
   the controller's work per batch;
3. the whole path through a real Redis: the batches are XADDed to a worker stream first
   (timed apart, with the Redis server's CPU), then ``controlplane.service.ingest.Ingestor``
   reads them (bounded reads in Lua), decodes, applies, acknowledges and trims until the
   stream is drained; the Redis server's CPU time for both is reported.
4. with and without the shadow evaluation: a synthetic to-C trace of ``--shadow-accesses``
   block accesses as the wire batches a worker sends (``tests.agent_stream``: whole
   requests, hits and inserts, evictions), decoded and applied (``LiveWindow.apply``),
   then the same plus ``ShadowEvaluator.apply`` at the default settings; runs alternate,
   ``--shadow-rounds`` each (default three), CPU time (``time.process_time``) per wire
   event, the best run of each and the median over rounds of each round's difference
   from the run without (a paired figure, steadier on a loaded machine); once per size in
   ``--shadow-batches`` (a lightly loaded worker sends small batches, a busy one full
   ones: the agent's default is 8,192 events). A third run, ``with the rule``, is the
   shadow of a worker whose heartbeat says its eviction runs the document's ``supersede``
   rule (a vLLM or SGLang worker): its ``wa`` miniatures replay the rule too.

    python -m tests.bench.bench_ingest [--events 4000000] [--batch 8192] [--redis-url URL]
                                       [--shadow-accesses 1000000]
                                       [--shadow-batches 1000,8192] [--shadow-only]
                                       [--shadow-rounds 3]

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
from controlplane.service.ingest_settings import IngestSettings
from controlplane.service.settings import ControllerSettings
from controlplane.service.window import LiveWindow, WindowLimits
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

    window = live_window()
    t0 = time.perf_counter()
    for fields in raw:
        window.apply(decode_batch(fields), HOUR)
    t_apply = time.perf_counter() - t0

    client = redis.Redis.from_url(url)
    keys = Keys(f"kvwise-bench-{uuid.uuid4().hex[:6]}:")
    stream = keys.events_stream("bench")
    try:
        cpu0 = redis_cpu(client)
        t0 = time.perf_counter()
        pipe = client.pipeline(transaction=False)
        for b in batches:
            pipe.xadd(stream, b)  # type: ignore[arg-type]
        pipe.execute()
        t_xadd = time.perf_counter() - t0
        cpu_xadd = redis_cpu(client) - cpu0
        window2 = live_window()

        def apply(batch: EventBatch) -> int:
            return window2.apply(batch, HOUR)  # trace time: "now" is the trace's end

        settings = ControllerSettings(consumer_group="bench", ingest_block_ms=0)
        ing = Ingestor(client, keys, apply, IngestSettings.from_settings(settings, "c1"))
        cpu0 = redis_cpu(client)
        t0 = time.perf_counter()
        while ing.counters.batches < len(batches):
            ing.poll_once()
        t_redis = time.perf_counter() - t0
        cpu_ingest = redis_cpu(client) - cpu0
    finally:
        client.delete(stream, keys.ingest_state("bench"))
    for label, t in (
        ("decode only", t_decode),
        ("decode + apply", t_apply),
        ("Redis -> decode -> apply -> XACK", t_redis),
    ):
        print(f"{label:34s} {total / t / 1e6:6.2f} M events/s  ({t:.2f} s)")
    print(f"XADD of the batches (agents' side)  {total / t_xadd / 1e6:6.2f} M events/s")
    per_core = total / max(cpu_xadd + cpu_ingest, 1e-9)
    print(
        f"Redis CPU: {cpu_xadd:.2f} s for XADD + {cpu_ingest:.2f} s for ingest "
        f"= {per_core / 1e6:.2f} M events per Redis CPU-second"
    )


def shadow_overhead(min_accesses: int, batch_events: int, rounds: int, seed: int = 12) -> None:
    """CPU per wire event of decode + apply, without and with the shadow (default
    settings, the worker's capacity known), alternating, ``rounds`` runs each."""
    from controlplane.shadow.evaluator import ShadowEvaluator
    from controlplane.shadow.settings import ShadowSettings
    from tests.agent_stream import agent_batches
    from tests.bench.bench_shadow import build_trace

    trace = build_trace("to-c", seed, min_accesses)
    capacity = max(1, round(0.05 * len(trace.hashes)))
    entries = [
        {k.encode(): v for k, v in encode_batch(b).items()}
        for b in agent_batches(trace, capacity, batch_events=batch_events)
    ]
    events = sum(int(e[b"n"]) for e in entries)
    print(
        f"shadow overhead: {trace.name}, {trace.n_accesses:,} accesses, {events:,} wire "
        f"events in batches of {batch_events:,}, worker capacity {capacity:,}"
    )
    settings = ShadowSettings()
    cpu: dict[str, list[float]] = {"without": [], "with": [], "with the rule": []}
    for _ in range(rounds):
        for label in cpu:
            window = live_window()
            shadow = ShadowEvaluator(settings)
            shadow.set_capacities({"w1": capacity}, supersedes={"w1": label == "with the rule"})
            t0 = time.process_time()
            for fields in entries:
                batch = decode_batch(fields)
                window.apply(batch, HOUR)
                if label != "without":
                    shadow.apply(batch)
            if label != "without":
                shadow.flush("w1")  # what is still gathered, counted too
            cpu[label].append((time.process_time() - t0) / events * 1e6)
    base = min(cpu["without"])
    print(f"  decode + apply                {base:.3f} us/event  (runs: {_runs(cpu['without'])})")
    for label, words in (("with", "+ shadow"), ("with the rule", "+ shadow, rule")):
        more = min(cpu[label])
        print(f"  decode + apply {words:<15}{more:.3f} us/event  (runs: {_runs(cpu[label])})")
        print(
            f"  shadow at rate {settings.shadow_rate:g}{', rule' * (label != 'with')}: "
            f"+{more - base:.3f} us/event, +{(more / base - 1) * 100:.0f} % per-event CPU "
            f"(best of {rounds} each); median of the rounds' differences "
            f"+{_median_difference(cpu[label], cpu['without']):.3f} us/event"
        )


def _median_difference(runs: list[float], without: list[float]) -> float:
    """The median over rounds of a run's CPU less the same round's run without."""
    return float(np.median(np.subtract(runs, without)))


def _runs(values: list[float]) -> str:
    return ", ".join(f"{v:.3f}" for v in values)


def live_window() -> LiveWindow:
    """The controller's window with its default limits."""
    limits = WindowLimits(clock_tolerance_s=60, max_categories=2048, max_categories_per_worker=1024)
    return LiveWindow(ReuseStats(HOUR, origin=0.0), limits)


def redis_cpu(client: redis.Redis) -> float:
    """CPU seconds the Redis server has used (user + system, all its threads)."""
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=4_000_000)
    ap.add_argument("--batch", type=int, default=8192)
    ap.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    ap.add_argument("--shadow-accesses", type=int, default=1_000_000, help="0: skip part 4")
    ap.add_argument(
        "--shadow-batches", default="1000,8192", help="part 4's wire batch sizes (events)"
    )
    ap.add_argument("--shadow-only", action="store_true", help="part 4 only")
    ap.add_argument("--shadow-rounds", type=int, default=3, help="part 4's runs of each")
    a = ap.parse_args()
    if not a.shadow_only:
        run(a.events, a.batch, a.redis_url)
    if a.shadow_accesses:
        for batch_events in (int(size) for size in a.shadow_batches.split(",")):
            shadow_overhead(a.shadow_accesses, batch_events, a.shadow_rounds)


if __name__ == "__main__":
    main()

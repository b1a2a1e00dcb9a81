"""Benchmark: hot-reload latency, from a policy's publication to its application by every
worker, with 8 simulated workers (separate processes) replaying synthetic to-C traffic.

Each round publishes a new version through the REST API (an override, so the controller's
own refits do not interfere: its refit interval is set to an hour) and waits until every
worker's heartbeat reports it. Latency per worker = the worker's ``applied_at`` minus the
document's ``created_at`` (both wall clock on this one machine). It includes the pub/sub
notice, the fetch and validation, and the wait for the worker's next step.

    python -m tests.bench.bench_hot_reload [--workers 8] [--rounds 25] [--redis-url URL]

Not collected by pytest; results go in docs/benchmarks.md ("Hot-reload latency").
"""

from __future__ import annotations

import tempfile
import time
import uuid
from pathlib import Path

import httpx
import numpy as np

from controlplane.traces.synth import synthesize
from controlplane.traces.writer import write_bailian
from tests.bench.command_line import REDIS_URL, run_from_command_line
from tests.e2e.procs import Stack, get
from tests.waiting import wait_until

TOKEN = "bench"


def run(workers: int, rounds: int, redis_url: str) -> None:
    with tempfile.TemporaryDirectory(prefix="kvwise-bench-") as tmp:
        work = Path(tmp)
        trace = synthesize("to-c", duration_s=600, qps=3, seed=3)
        path = work / "toc.jsonl"
        write_bailian(trace, path)
        stack = Stack(work, redis_url, f"kvwise-bench-{uuid.uuid4().hex[:6]}:")
        try:
            _, api = stack.controller("ctl", KVWISE_REFIT_INTERVAL_S="3600", KVWISE_API_TOKEN=TOKEN)
            for i in range(workers):
                stack.worker(
                    f"w{i}",
                    path,
                    trace.n_unique // 10,
                    speed=10,
                    KVWISE_HEARTBEAT_INTERVAL_S="0.1",
                    KVWISE_POLL_INTERVAL_S="2.0",  # the default: pub/sub is the fast path
                )
            wait_until(
                lambda: len(get(api, "/v1/agents")) == workers, timeout=60, what="all workers"
            )
            lat: list[float] = []
            for r in range(rounds):
                doc = httpx.put(
                    f"{api}/v1/policy/overrides/text_1",
                    json={"life_s": 10.0 + r},
                    headers={"Authorization": f"Bearer {TOKEN}"},
                    timeout=5,
                ).json()
                v, created = doc["version"], doc["created_at"]

                def applied(v: int = v) -> list[dict[str, float]] | None:
                    agents = get(api, "/v1/agents")
                    ok = len(agents) == workers and all(a["applied_version"] >= v for a in agents)
                    return agents if ok else None

                agents = wait_until(applied, timeout=20, what=f"version {v} everywhere")
                lat += [a["applied_at"] - created for a in agents if a["applied_version"] == v]
                time.sleep(0.3)
        finally:
            stack.stop_all()
    ms = np.array(lat) * 1000
    print(f"{len(ms)} samples ({rounds} versions x {workers} workers)")
    for q in (50, 90, 99):
        print(f"p{q}: {np.percentile(ms, q):.1f} ms")
    print(f"max: {ms.max():.1f} ms")


def main() -> None:
    run_from_command_line(__doc__, run, workers=8, rounds=25, redis_url=REDIS_URL)


if __name__ == "__main__":
    main()

"""Soak: the live loop for minutes under faults and hostile input, then an exact account.

A controller and four ``kvwise worker`` processes on a Redis of their own (append-only,
fsynced: a restart loses nothing), for ``--minutes``. Meanwhile poison is mixed into the
streams every few seconds (bad UTF-8, nesting too deep, a category bomb, an entry over the
size limits, a batch from a clock two hours ahead, entries from a schema-1 agent); at 30 %
of the run Redis is restarted, at 60 % the controller is SIGKILLed and a new one (another
consumer) takes over and loads the last checkpoint. At the end the workers stop and print
what they sent and dropped, and the script checks, per worker, from the controller's
ledgers in Redis:

- sent <= ingested + dropped-and-counted by the controller <= sent + dropped by the worker
  (a batch whose XADD landed while its connection broke is counted dropped by the worker
  and ingested by the controller: the only double count there can be);
- nothing stuck: every stream empty (acknowledged entries trimmed), nothing pending;
- every poison entry dead-lettered (or counted clock-rejected), none applied;
- memory: peak resident size of each controller and worker (VmHWM), Redis's peak;
- the fit across the SIGKILL: samples and parameters of the last fit before the kill
  against the first fit of the new controller (which loaded the checkpoint).

    python -m tests.bench.soak [--minutes 10] [--out soak.json]

Not collected by pytest; results go in docs/benchmarks.md ("Soak"). Synthetic traffic.
"""

from __future__ import annotations

import argparse
import json
import signal
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import redis

from agent.wire import WIRE_SCHEMA_VERSION, Keys, encode_batch
from controlplane.dev.embedded_redis import EmbeddedRedis
from controlplane.traces.synth import synthesize
from controlplane.traces.writer import write_bailian
from tests.e2e.procs import Proc, Stack, get
from tests.integration.controller_fixtures import reuse_batch
from tests.waiting import wait_until

WORKERS = 4
CONTROLLER_SETTINGS = {
    "KVWISE_REFIT_INTERVAL_S": "5",
    "KVWISE_CHECKPOINT_INTERVAL_S": "10",
    "KVWISE_CLOCK_TOLERANCE_S": "60",
    "KVWISE_INGEST_MAX_EVENTS": "20000",
    "KVWISE_RECLAIM_IDLE_MS": "5000",
    "KVWISE_LEASE_TTL_S": "3",
    "KVWISE_STREAM_TRIM_GRACE_S": "0",  # "nothing stuck" looks for empty streams
}


def peak_rss_mb(pid: int) -> float:
    """VmHWM of a live process (its peak resident size), in MB."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


class Poisoner(threading.Thread):
    """Mixes hostile entries into the streams until stopped; counts what it sent."""

    def __init__(self, url: str, keys: Keys, stop: threading.Event) -> None:
        super().__init__(name="poisoner", daemon=True)
        self.r = redis.Redis.from_url(url)
        self.keys = keys
        self.stop = stop
        self.entries = 0
        self.future_events = 0

    def run(self) -> None:
        v = str(WIRE_SCHEMA_VERSION).encode()
        plain = {b"v": v, b"w": b"w0", b"e": b"p", b"s": b"1", b"c": b"[]", b"n": b"0", b"d": b""}
        kinds: list[dict[bytes, bytes]] = [
            {**plain, b"\xff": b"x"},
            {**plain, b"v": b"\xfe"},
            {**plain, b"c": b"[" * 50_000 + b"]" * 50_000},
            {**plain, b"c": json.dumps([f"bomb{i}" for i in range(20_000)]).encode()},
            {**plain, b"n": b"100000", b"d": b"\0" * (100_000 * 37)},
            {**plain, b"v": b"1"},
        ]
        i = 0
        while not self.stop.wait(3.0):
            fields = kinds[i % len(kinds)]
            target = self.keys.events_stream(f"w{i % WORKERS}")
            future = reuse_batch(
                "evil", i + 1, category="x", n=50, rate=1, p=0.5, t0=time.time() + 7200, seed=i
            )
            try:
                self.r.xadd(target, fields)  # type: ignore[arg-type]
                self.entries += 1
                self.r.xadd(self.keys.events_stream("evil"), encode_batch(future))  # type: ignore[arg-type]
                self.future_events += len(future)
            except redis.RedisError:
                pass  # Redis is restarting: try the next one
            i += 1


PARAMS = ("rate", "p_reuse", "life_s")


def fit_summary(url: str) -> dict[str, Any]:
    """The controller's last fit: total samples, and the categories fitted on their own."""
    cats = get(url, "/v1/categories")
    fitted = {c["name"]: c["fitted"] for c in cats if c["fitted"]}
    own = {n: f for n, f in fitted.items() if f["source"] == "fit"}
    return {"samples": sum(f["samples"] for f in fitted.values()), "own": own}


def fit_change(a: dict[str, Any], b: dict[str, Any]) -> dict[str, float]:
    """Relative change of each parameter of the categories both fits fitted on their own:
    the mean weighted by samples, and the largest."""
    total = weighted = worst = 0.0
    for name, p in a["own"].items():
        q = b["own"].get(name)
        if q is None:
            continue
        change = max(abs(p[k] - q[k]) / max(abs(p[k]), 1e-12) for k in PARAMS)
        weighted += change * p["samples"]
        total += p["samples"]
        worst = max(worst, change)
    return {"weighted_mean": round(weighted / max(total, 1), 4), "largest": round(worst, 4)}


def run(minutes: float, workdir: Path) -> dict[str, Any]:
    trace = synthesize("to-c", duration_s=1200, qps=3, seed=21)
    path = workdir / "toc.jsonl"
    write_bailian(trace, path)
    capacity = max(200, trace.n_unique // 10)
    (workdir / "redis").mkdir()
    server = EmbeddedRedis(workdir / "redis", persist=True).start()
    stack = Stack(workdir, server.url, f"kvwise-soak-{uuid.uuid4().hex[:6]}:")
    keys = Keys(stack.prefix)
    out: dict[str, Any] = {"minutes": minutes, "workers": WORKERS}
    stop = threading.Event()
    poisoner = Poisoner(server.url, keys, stop)
    controllers: list[Proc] = []
    peaks: dict[str, float] = {}
    try:
        ctl, url = stack.controller("ctl-a", **CONTROLLER_SETTINGS)
        controllers.append(ctl)
        workers = [stack.worker(f"w{i}", path, capacity, speed=10) for i in range(WORKERS)]
        poisoner.start()
        t0 = time.monotonic()
        end = t0 + minutes * 60

        def at(share: float) -> None:
            left = t0 + share * minutes * 60 - time.monotonic()
            stop.wait(max(left, 0.0))

        def sample() -> None:
            for p in [*controllers, *workers]:
                if p.alive():
                    peaks[p.name] = max(peaks.get(p.name, 0.0), peak_rss_mb(p.popen.pid))

        at(0.3)
        sample()
        server.stop()
        stop.wait(5.0)
        server.start()
        out["redis_restart_at_s"] = round(time.monotonic() - t0)
        at(0.6)
        sample()
        earlier = fit_summary(url)
        stop.wait(6.0)  # one refit later: the drift of a fit that nothing disturbed
        before = fit_summary(url)
        ctl.stop(signal.SIGKILL)
        out["sigkill_at_s"] = round(time.monotonic() - t0)
        ctl_b, url = stack.controller("ctl-b", **CONTROLLER_SETTINGS)
        controllers.append(ctl_b)
        wait_until(lambda: fit_summary(url)["samples"] > 0, timeout=60, what="ctl-b's fit")
        after = fit_summary(url)
        out["fit_across_sigkill"] = {
            "samples_before": before["samples"],
            "samples_first_fit_after": after["samples"],
            "change_across_the_kill": fit_change(before, after),
            "change_between_two_fits_before": fit_change(earlier, before),
        }
        while time.monotonic() < end:
            sample()
            stop.wait(5.0)
        sample()
        stop.set()
        summaries = {}
        for w in workers:
            assert w.stop(timeout=60) == 0, w.output()[-2000:]
            summaries[w.name] = stack.summary(w)
        out.update(account(server.url, keys, summaries, poisoner))
        sample()
        out["peak_rss_mb"] = {k: round(v, 1) for k, v in peaks.items()}
        info = redis.Redis.from_url(server.url).info("memory")
        out["redis_peak_mb"] = round(int(info["used_memory_peak"]) / 2**20, 1)
        out["controller_log_warnings"] = sum(
            line.count(" WARNING ") for p in controllers for line in p.output().splitlines()
        )
    finally:
        stop.set()
        stack.stop_all()
        server.stop()
    return out


def account(
    url: str, keys: Keys, summaries: dict[str, dict[str, Any]], poisoner: Poisoner
) -> dict[str, Any]:
    r = redis.Redis.from_url(url)

    def drained() -> bool:
        for w in summaries:
            stream = keys.events_stream(w)
            if r.xlen(stream) or int(r.xpending(stream, "controller")["pending"]):
                return False
        return True

    wait_until(drained, timeout=120, what="every stream drained")
    stuck = sum(
        int(r.xpending(keys.events_stream(w), "controller")["pending"])
        + r.xlen(keys.events_stream(w))
        for w in summaries
    )
    per_worker = {}
    ok = True
    for w, s in summaries.items():
        ledger = {k.decode(): v.decode() for k, v in r.hgetall(keys.ingest_state(w)).items()}
        ingested = int(ledger.get("events", 0))
        clock, refused = int(ledger.get("clock_rejected", 0)), int(ledger.get("refused", 0))
        counted = clock + refused
        sent, dropped = s["events_sent"], s["events_dropped"]
        holds = sent <= ingested + counted <= sent + dropped
        ok = ok and holds
        per_worker[w] = {
            "sent": sent,
            "dropped_by_worker": dropped,
            "ingested": ingested,
            "dropped_and_counted_by_controller": counted,
            "of_which_clock_rejected": clock,
            "landed_though_counted_dropped": ingested + counted - sent,
            "gap_batches": int(ledger.get("missing", 0)),
            "dead_letters": int(ledger.get("dead_letters", 0)),
            "holds": holds,
        }
    letters = r.xlen(keys.dead_letter)
    reasons: dict[str, int] = {}
    for _, f in r.xrange(keys.dead_letter):
        head = f[b"reason"].decode()[:48]
        reasons[head] = reasons.get(head, 0) + 1
    evil = {k.decode(): v.decode() for k, v in r.hgetall(keys.ingest_state("evil")).items()}
    return {
        "accounting_holds": ok,
        "per_worker": per_worker,
        "poison_entries_sent": poisoner.entries,
        "dead_letters": letters,
        "dead_letter_reasons": reasons,
        "future_clock_events_sent": poisoner.future_events,
        "future_clock_events_rejected": int(evil.get("clock_rejected", 0)),
        "future_clock_events_ingested": int(evil.get("events", 0)),
        "stuck_pending_or_unread": stuck,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvwise-soak-") as d:
        result = run(a.minutes, Path(d))
    text = json.dumps(result, indent=2)
    print(text)
    if a.out:
        a.out.write_text(text + "\n")


if __name__ == "__main__":
    main()

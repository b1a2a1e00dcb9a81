"""Benchmark: accuracy and CPU cost of the shadow evaluation against the full replay.

Builds a synthetic trace (``controlplane.traces.synth``; synthetic data, not a public
trace) of at least ``--min-accesses`` block accesses and turns it into the wire batches a
worker of ``--capacity-frac`` of the trace's unique blocks sends (its own ``lru`` decides
what is a hit; ``tests.agent_stream``). For every policy (``wa`` with the controller's fit
of the whole trace, and the baselines) and every ladder step it computes the full
replay's hit ratio (``controlplane.replay.engine.replay_hits``), then runs the shadow
(``controlplane.shadow.evaluator``, the window covering the whole trace) at each
``--rates`` and reports, per rate, the largest and mean absolute error against the full
replay, how often the full figure lies in the shadow's 95 % interval, and the shadow's
CPU time per wire event (``time.process_time`` around ``ShadowEvaluator.apply``).

    python -m tests.bench.bench_shadow [--profile to-c] [--seed 11] [--min-accesses 1000000]
        [--capacity-frac 0.05] [--rates 0.02,0.05,0.1,0.2] [--json]

Choose the default rate on one seed; report on another. Not collected by pytest; results
go in docs/benchmarks.md ("Shadow evaluation") and docs/shadow.md.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass

from agent.policies import create
from agent.policies.wa import WAPolicy
from agent.policy_document import PolicyDocument
from agent.wire import EventBatch
from controlplane.replay.engine import replay_hits
from controlplane.shadow.evaluator import ShadowEvaluator
from controlplane.shadow.settings import ShadowSettings
from controlplane.traces.model import Trace
from controlplane.traces.synth import synthesize
from tests.agent_stream import agent_batches, fitted_document

QPS = 4.0
LADDER = "0.25,0.5,1,2,4"
BASELINES = "lru,s3fifo,arc"


@dataclass(frozen=True)
class RateRow:
    rate: float
    key_depth: int
    max_abs_error: float
    mean_abs_error: float
    in_interval: float
    """Share of (policy, step) whose full-replay figure lies in the shadow's interval."""
    cpu_us_per_event: float
    sampled_accesses: int
    errors: dict[str, list[float]]
    """Per policy, per ladder step: shadow minus full."""
    observed: float
    """The worker's own hit ratio over all its requests ..."""
    sampled_observed: float
    """... and over the sampled ones."""


def build_trace(profile: str, seed: int, min_accesses: int) -> Trace:
    duration = 1800.0
    while True:
        trace = synthesize(profile, duration_s=duration, qps=QPS, seed=seed)  # type: ignore[arg-type]
        if trace.n_accesses >= min_accesses:
            return trace
        duration *= 1.2 * min_accesses / max(trace.n_accesses, 1)


def full_replays(trace: Trace, capacity: int, doc: PolicyDocument) -> dict[str, list[float]]:
    """Per policy, per ladder step: the full replay's hit ratio (the shadow stands for the
    same full-size caches)."""
    settings = ShadowSettings(shadow_ladder=LADDER)
    out: dict[str, list[float]] = {}
    for name in ("wa", *BASELINES.split(",")):
        ratios = []
        for multiple in settings.multiples:
            size = round(capacity * multiple)
            policy = (
                WAPolicy(size, category_names=trace.category_names, doc=doc)
                if name == "wa"
                else create(name, size)
            )
            ratios.append(float(replay_hits(trace, policy, size).sum()) / trace.n_accesses)
        out[name] = ratios
    return out


def shadow_run(
    batches: list[EventBatch],
    capacity: int,
    doc: PolicyDocument,
    rate: float,
    span: float,
    key_depth: int,
) -> tuple[ShadowEvaluator, float]:
    settings = ShadowSettings(
        shadow_rate=rate,
        shadow_key_depth=key_depth,
        shadow_policies=BASELINES,
        shadow_ladder=LADDER,
        shadow_window_s=span,
        shadow_buckets=1,
    )
    shadow = ShadowEvaluator(settings)
    shadow.set_capacities({"w1": capacity})
    shadow.set_policy(doc)
    t0 = time.process_time()
    for batch in batches:
        shadow.apply(batch)
    shadow.flush("w1")
    return shadow, time.process_time() - t0


def measure(
    batches: list[EventBatch],
    capacity: int,
    doc: PolicyDocument,
    rate: float,
    span: float,
    full: dict[str, list[float]],
    key_depth: int,
) -> RateRow:
    shadow, cpu = shadow_run(batches, capacity, doc, rate, span, key_depth)
    (group,) = shadow.view().groups
    errors: dict[str, list[float]] = {}
    inside = total = 0
    for curve in group.curves:
        errors[curve.policy] = []
        for point, truth in zip(curve.points, full[curve.policy], strict=True):
            errors[curve.policy].append(point.hit_ratio - truth)
            inside += point.ci_low <= truth <= point.ci_high
            total += 1
    flat = [abs(e) for row in errors.values() for e in row]
    events = sum(len(b) for b in batches)
    return RateRow(
        rate=rate,
        key_depth=key_depth,
        max_abs_error=max(flat),
        mean_abs_error=sum(flat) / len(flat),
        in_interval=inside / total,
        cpu_us_per_event=cpu / events * 1e6,
        sampled_accesses=group.sampled_accesses,
        errors=errors,
        observed=group.observed_hit_ratio,
        sampled_observed=group.sampled_observed_hit_ratio,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profile", default="to-c", choices=("to-c", "to-b"))
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--min-accesses", type=int, default=1_000_000)
    ap.add_argument("--capacity-frac", type=float, default=0.05)
    ap.add_argument("--rates", default="0.02,0.05,0.1,0.2")
    ap.add_argument("--key-depths", default=str(ShadowSettings().shadow_key_depth))
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    trace = build_trace(a.profile, a.seed, a.min_accesses)
    capacity = trace.capacity_for(a.capacity_frac)
    doc = fitted_document(trace)
    span = float(trace.timestamps[-1] - trace.timestamps[0]) + 1.0
    batches = agent_batches(trace, capacity, batch_events=4096)
    events = sum(len(b) for b in batches)
    print(
        f"{trace.name}: {trace.n_requests:,} requests, {trace.n_accesses:,} accesses, "
        f"{trace.n_unique:,} unique blocks; worker capacity {capacity:,}; {events:,} wire events"
    )
    rows = []
    settings = [(float(r), int(d)) for r in a.rates.split(",") for d in a.key_depths.split(",")]
    full = full_replays(trace, capacity, doc)
    for rate, depth in settings:
        row = measure(batches, capacity, doc, rate, span, full, depth)
        rows.append(row)
        print(
            f"rate {rate:<5g} key depth {depth:<3d} max |error| {row.max_abs_error:.4f}"
            f"  mean {row.mean_abs_error:.4f}"
            f"  in 95% interval {row.in_interval:4.0%}  CPU {row.cpu_us_per_event:6.3f} us/event"
            f"  ({row.sampled_accesses:,} sampled accesses)"
        )
        print(
            f"    the worker's own hit ratio: {row.observed:.4f} over all requests, "
            f"{row.sampled_observed:.4f} over the sampled ones"
        )
        for policy, errs in row.errors.items():
            cells = "  ".join(f"{t:.4f}{e:+.4f}" for t, e in zip(full[policy], errs, strict=True))
            print(f"    {policy:7s} full+error at x{LADDER.replace(',', ' x')}: {cells}")
    if a.json:
        print(json.dumps([asdict(r) for r in rows], indent=1))


if __name__ == "__main__":
    main()

"""Benchmark: accuracy and CPU cost of the shadow evaluation against the full replay.

Builds a synthetic trace (``controlplane.traces.synth``; synthetic data, not a public
trace) of at least ``--min-accesses`` block accesses and turns it into the wire batches a
worker of ``--capacity-frac`` of the trace's unique blocks sends (its own ``lru`` decides
what is a hit; ``tests.agent_stream``). For every policy (``wa`` with the controller's fit
of the whole trace, and the baselines) and every ladder step it computes the full
replay's hit ratio (``controlplane.replay.engine.replay_hits``), then runs the shadow
(``controlplane.shadow.evaluator``, the window covering the whole trace) at each
``--rates``, once per sample (``--salts``: each salt draws other subtrees), and reports
per rate, for the estimate the shadow serves and for the miniature's own figure before
the regression moves it: the largest absolute error over every sample, policy and step,
the mean of each sample's largest, the root mean square (and the served estimate's
largest and root mean square per policy), how often the full figure lies
in the served estimate's 95 % interval, and the shadow's CPU time per wire event
(``time.process_time`` around ``ShadowEvaluator.apply``). With ``--supersede`` the worker
runs the document's ``supersede`` rule under ``wa`` (a vLLM worker's default), as its
heartbeat says: the shadow's ``wa`` replays the rule, and so does the full replay of
``wa`` it is judged against.

    python -m tests.bench.bench_shadow [--profile to-c] [--seed 11] [--min-accesses 1000000]
        [--capacity-frac 0.05] [--rates 0.02,0.05,0.1,0.2] [--salts 10] [--supersede]
        [--json]

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
from controlplane.shadow.estimator import MiniCache
from controlplane.shadow.evaluator import ShadowEvaluator
from controlplane.shadow.rebuild import Request
from controlplane.shadow.settings import ShadowSettings
from controlplane.traces.model import Trace
from controlplane.traces.synth import synthesize
from tests.agent_stream import agent_batches, fitted_document

QPS = 4.0
LADDER = "0.25,0.5,1,2,4"
BASELINES = "lru,s3fifo,arc"


@dataclass(frozen=True)
class Draw:
    """One sample (salt) of one setting."""

    salt: int
    served: dict[str, list[float]]
    """Per policy, per ladder step: the served estimate minus the full replay's figure."""
    sampled: dict[str, list[float]]
    """The same for the miniature's own figure."""
    in_interval: float
    """Share of (policy, step) whose full-replay figure lies in the served interval."""
    cpu_us_per_event: float
    sampled_accesses: int
    observed: float
    """The worker's own hit ratio over all its requests ..."""
    sampled_observed: float
    """... and over the sampled ones."""


@dataclass(frozen=True)
class Errors:
    """Absolute errors of one estimate over every draw, policy and step."""

    largest: float
    mean_largest: float
    """The mean over draws of each draw's largest."""
    rms: float

    @classmethod
    def of(cls, per_draw: list[dict[str, list[float]]]) -> Errors:
        flat = [[abs(e) for row in d.values() for e in row] for d in per_draw]
        every = [e for draw in flat for e in draw]
        return cls(
            largest=max(every),
            mean_largest=sum(max(draw) for draw in flat) / len(flat),
            rms=(sum(e * e for e in every) / len(every)) ** 0.5,
        )


@dataclass(frozen=True)
class RateRow:
    rate: float
    key_depth: int
    served: Errors
    sampled: Errors
    in_interval: float
    cpu_us_per_event: float
    draws: list[Draw]


def build_trace(profile: str, seed: int, min_accesses: int) -> Trace:
    duration = 1800.0
    while True:
        trace = synthesize(profile, duration_s=duration, qps=QPS, seed=seed)  # type: ignore[arg-type]
        if trace.n_accesses >= min_accesses:
            return trace
        duration *= 1.2 * min_accesses / max(trace.n_accesses, 1)


def full_replays(
    trace: Trace, capacity: int, doc: PolicyDocument, supersede: bool
) -> dict[str, list[float]]:
    """Per policy, per ladder step: the full replay's hit ratio (the shadow stands for the
    same full-size caches; ``wa`` evicting superseded branches first with ``supersede``)."""
    settings = ShadowSettings(shadow_ladder=LADDER)
    out: dict[str, list[float]] = {}
    for name in ("wa", *BASELINES.split(",")):
        ratios = []
        for multiple in settings.multiples:
            size = round(capacity * multiple)
            if name == "wa" and supersede:
                ratios.append(superseding_wa_replay(trace, size, doc))
                continue
            policy = (
                WAPolicy(size, category_names=trace.category_names, doc=doc)
                if name == "wa"
                else create(name, size)
            )
            ratios.append(float(replay_hits(trace, policy, size).sum()) / trace.n_accesses)
        out[name] = ratios
    return out


def superseding_wa_replay(trace: Trace, size: int, doc: PolicyDocument) -> float:
    """``wa`` under ``doc`` at ``size`` blocks over the whole trace, superseded branches
    evicted first as a vLLM worker's queue does: a miniature cache at full size and rate
    (the replay's semantics: ``MiniCache``)."""
    cache = MiniCache(WAPolicy(size, category_names=trace.category_names, doc=doc), size)
    cache.run_branch_rule(True)
    hits = 0
    times, codes = trace.timestamps.tolist(), trace.categories.tolist()
    for r in range(trace.n_requests):
        hits += cache.serve(Request(times[r], codes[r], trace.request_blocks(r).tolist()))
    return hits / trace.n_accesses


@dataclass(frozen=True)
class Stream:
    """What every draw replays: the worker's batches, its capacity, the fitted document
    and the window."""

    batches: list[EventBatch]
    capacity: int
    doc: PolicyDocument
    span: float
    supersede: bool = False
    """Whether the worker's heartbeat says its eviction runs the ``supersede`` rule."""


def shadow_run(
    stream: Stream, rate: float, key_depth: int, salt: int = 0
) -> tuple[ShadowEvaluator, float]:
    settings = ShadowSettings(
        shadow_rate=rate,
        shadow_key_depth=key_depth,
        shadow_policies=BASELINES,
        shadow_ladder=LADDER,
        shadow_window_s=stream.span,
        shadow_buckets=1,
    )
    shadow = ShadowEvaluator(settings, salt)
    shadow.set_capacities({"w1": stream.capacity}, supersedes={"w1": stream.supersede})
    shadow.set_policy(stream.doc)
    t0 = time.process_time()
    for batch in stream.batches:
        shadow.apply(batch)
    shadow.flush("w1")
    return shadow, time.process_time() - t0


def draw(
    stream: Stream, rate: float, key_depth: int, salt: int, full: dict[str, list[float]]
) -> Draw:
    shadow, cpu = shadow_run(stream, rate, key_depth, salt)
    (group,) = shadow.view().groups
    served: dict[str, list[float]] = {}
    sampled: dict[str, list[float]] = {}
    inside = total = 0
    for curve in group.curves:
        truths = full[curve.policy]
        served[curve.policy] = [p.hit_ratio - t for p, t in zip(curve.points, truths, strict=True)]
        sampled[curve.policy] = [
            p.sampled_hit_ratio - t for p, t in zip(curve.points, truths, strict=True)
        ]
        inside += sum(p.ci_low <= t <= p.ci_high for p, t in zip(curve.points, truths, strict=True))
        total += len(truths)
    return Draw(
        salt=salt,
        served=served,
        sampled=sampled,
        in_interval=inside / total,
        cpu_us_per_event=cpu / sum(len(b) for b in stream.batches) * 1e6,
        sampled_accesses=group.sampled_accesses,
        observed=group.observed_hit_ratio,
        sampled_observed=group.sampled_observed_hit_ratio,
    )


def measure(
    stream: Stream, rate: float, key_depth: int, salts: int, full: dict[str, list[float]]
) -> RateRow:
    draws = [draw(stream, rate, key_depth, salt, full) for salt in range(salts)]
    return RateRow(
        rate=rate,
        key_depth=key_depth,
        served=Errors.of([d.served for d in draws]),
        sampled=Errors.of([d.sampled for d in draws]),
        in_interval=sum(d.in_interval for d in draws) / len(draws),
        cpu_us_per_event=min(d.cpu_us_per_event for d in draws),
        draws=draws,
    )


def report(row: RateRow, full: dict[str, list[float]], verbose: bool) -> None:
    print(
        f"rate {row.rate:<5g} key depth {row.key_depth:<3d} {len(row.draws)} samples; "
        f"in 95% interval {row.in_interval:4.0%}; CPU {row.cpu_us_per_event:6.3f} us/event"
    )
    for label, e in (("served estimate", row.served), ("miniature's own", row.sampled)):
        print(
            f"    {label:16s} |error| largest {e.largest:.4f}  mean of largest "
            f"{e.mean_largest:.4f}  rms {e.rms:.4f}"
        )
    for policy in row.draws[0].served:
        e = Errors.of([{policy: d.served[policy]} for d in row.draws])
        print(f"    served, {policy:7s} |error| largest {e.largest:.4f}  rms {e.rms:.4f}")
    for d in row.draws if verbose else row.draws[:1]:
        print(
            f"    salt {d.salt}: worker's own hit ratio {d.observed:.4f} over all requests, "
            f"{d.sampled_observed:.4f} over the sampled ones ({d.sampled_accesses:,} accesses)"
        )
        for policy, errs in d.served.items():
            cells = "  ".join(f"{t:.4f}{e:+.4f}" for t, e in zip(full[policy], errs, strict=True))
            print(f"    {policy:7s} full+error at x{LADDER.replace(',', ' x')}: {cells}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profile", default="to-c", choices=("to-c", "to-b"))
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--min-accesses", type=int, default=1_000_000)
    ap.add_argument("--capacity-frac", type=float, default=0.05)
    ap.add_argument("--rates", default="0.02,0.05,0.1,0.2")
    ap.add_argument("--key-depths", default=str(ShadowSettings().shadow_key_depth))
    ap.add_argument("--salts", type=int, default=10, help="samples drawn per setting")
    ap.add_argument("--verbose", action="store_true", help="every sample's errors")
    ap.add_argument(
        "--supersede", action="store_true", help="the worker runs the supersede rule under wa"
    )
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    trace = build_trace(a.profile, a.seed, a.min_accesses)
    capacity = trace.capacity_for(a.capacity_frac)
    stream = Stream(
        agent_batches(trace, capacity, batch_events=4096),
        capacity,
        fitted_document(trace),
        float(trace.timestamps[-1] - trace.timestamps[0]) + 1.0,
        a.supersede,
    )
    events = sum(len(b) for b in stream.batches)
    print(
        f"{trace.name}: {trace.n_requests:,} requests, {trace.n_accesses:,} accesses, "
        f"{trace.n_unique:,} unique blocks; worker capacity {capacity:,}; {events:,} wire events"
    )
    full = full_replays(trace, capacity, stream.doc, a.supersede)
    rows = []
    for rate in (float(r) for r in a.rates.split(",")):
        for depth in (int(d) for d in a.key_depths.split(",")):
            rows.append(measure(stream, rate, depth, a.salts, full))
            report(rows[-1], full, a.verbose)
    if a.json:
        print(json.dumps([asdict(r) for r in rows], indent=1))


if __name__ == "__main__":
    main()

"""Benchmark: what the agent costs the engine thread per recorded block access.

Replays a synthetic trace (generated here, seeded; not a real workload) through the same
driver loop twice per policy, in the same process: once calling the evictor alone
(baseline: ``touch``/``free``/``evict`` as an engine without kvwise would) and once through
``Agent`` hooks, which add the category table and the recorder. The difference divided
by the operations recorded is the agent's engine-thread cost per recorded block access
(goal: <= 1 us amortized). The work moved off the engine thread (resolving raw operations
against the access history into wire events, ``AccessHistory.resolve``) is done by the
driver every few requests, as the publisher thread would, timed separately and reported
per event as the publisher's cost. Times are CPU time of the thread (``time.thread_time``),
so other processes on a shared machine do not count; ``--wall`` uses wall time instead.
``--redis`` adds a run with the real publisher thread sending to a throwaway local
redis-server, timed in wall time (the engine thread then also waits for the GIL). Also
times ``EventRecorder.record`` alone on 100-block requests, and (``--sampling-rounds R``)
what timing the hooks costs (``agent.engine_time``: every call counted, about one in 64
timed), per call, in alternating rounds: ``bench_sampling``.

    python -m tests.bench.bench_agent [--requests 20000] [--repeats 3] [--redis]
        [--sampling-rounds 0]

Not collected by pytest (no ``test_`` prefix); results go in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import tempfile
import time
from collections.abc import Callable
from itertools import compress
from pathlib import Path
from typing import Any

import numpy as np

from agent.engine_time import EngineTime
from agent.policies import EvictionPolicy, create, names
from agent.recorder import EventRecorder
from agent.runtime.agent import Agent
from agent.settings import AgentSettings
from controlplane.traces.model import Trace

TYPES = ("text", "image", "search", "file")


def synthetic_trace(n_requests: int, seed: int = 1) -> Trace:
    """Multi-turn chats: half the requests extend an earlier prompt (a prefix hit when it
    is still cached); prompt lengths lognormal around 40 blocks."""
    rng = np.random.default_rng(seed)
    prompts: list[list[int]] = []
    types: list[str] = []
    turns: list[int] = []
    next_id = 0
    for _ in range(n_requests):
        if prompts and rng.random() < 0.5:
            j = int(rng.integers(max(0, len(prompts) - 2000), len(prompts)))
            base, turn, type_ = prompts[j], turns[j] + 1, types[j]
        else:
            base, turn, type_ = [], 1, str(rng.choice(TYPES))
        extra = int(np.clip(rng.lognormal(np.log(20), 0.8), 1, 400))
        prompt = base + list(range(next_id, next_id + extra))
        next_id += extra
        prompts.append(prompt)
        types.append(type_)
        turns.append(min(turn, 5))
    ts = np.cumsum(rng.exponential(0.1, size=n_requests))
    return Trace.from_requests(prompts, ts.tolist(), types=types, turns=turns, name="synthetic")


def drive(
    trace: Trace,
    hooks: Any,
    contains: Callable[[object], bool],
    capacity: int,
    drain: Callable[[], object] | None = None,
) -> int:
    """The engine's side of the replay semantics; returns the prefix hits. ``hooks`` is
    an evictor (baseline) or an Agent: both take the same calls here."""
    hashes = trace.hashes[trace.blocks]
    offsets = trace.offsets.tolist()
    times = trace.timestamps.tolist()
    cats = trace.categories.tolist()
    size = hooks.policy.__len__ if isinstance(hooks, Agent) else hooks.__len__
    agent = isinstance(hooks, Agent)
    names_ = trace.category_names
    hits = 0
    for r in range(trace.n_requests):
        lo, hi = offsets[r], offsets[r + 1]
        req: list[int] = hashes[lo:hi].tolist()
        now = times[r]
        cached = list(map(contains, req))
        try:
            h = cached.index(False)
        except ValueError:
            h = hi - lo
        hits += h
        category: Any = names_[cats[r]] if agent else cats[r]
        if any(cached):
            if agent:
                hooks.touch(list(compress(req, cached)), now, category)
            else:
                hooks.touch(list(compress(req, cached)), now)
        req.reverse()
        hooks.free(req, range(hi - lo - 1, -1, -1), now, category)
        excess = size() - capacity
        if excess > 0:
            if agent:
                hooks.evict(excess, now)
            else:
                hooks.evict(excess)
        if drain is not None:
            drain()
    return hits


CLOCK: Callable[[], float] = time.thread_time


def timed(fn: Callable[[], Any], clock: Callable[[], float] | None = None) -> tuple[float, Any]:
    clock = clock or CLOCK
    gc.collect()
    t0 = clock()
    out = fn()
    return clock() - t0, out


def bench_policy(
    trace: Trace, policy: str, capacity: int, repeats: int, redis_url: str | None
) -> dict[str, Any]:
    base_s: list[float] = []
    agent_s: list[float] = []
    live_s: list[float] = []
    live_base_s: list[float] = []
    resolve_s: list[float] = []
    live_dropped: list[float] = []
    ops = events = hook_calls = 0
    settings = AgentSettings(
        evictor=policy,
        worker_id="bench",
        buffer_events=1 << 20,
        batch_events=8192,
        redis_url=redis_url or "redis://127.0.0.1:9/0",
    )
    for _ in range(repeats):
        ev: EvictionPolicy = create(policy, capacity)
        dt, base_hits = timed(lambda ev=ev: drive(trace, ev, ev.__contains__, capacity))
        base_s.append(dt)
        agent = Agent(settings, capacity=capacity)
        publisher = Resolver(agent)
        dt, agent_hits = timed(
            lambda a=agent, p=publisher: drive(trace, a, a.policy.__contains__, capacity, p)
        )
        publisher.run()
        assert agent_hits == base_hits, (agent_hits, base_hits)
        assert agent.events_dropped == 0
        agent_s.append(dt - publisher.seconds)
        resolve_s.append(publisher.seconds)
        ops = agent.recorder.recorded
        hook_calls = agent.engine_time.calls
        events = publisher.events
        agent.close()
        if redis_url is not None:
            live = Agent(
                settings.model_copy(update={"buffer_events": 1 << 18}), capacity=capacity
            ).start()
            dt, _ = timed(
                lambda a=live: drive(trace, a, a.policy.__contains__, capacity),
                time.perf_counter,
            )
            live_s.append(dt)
            live.close()  # before the baseline: its last flush must not overlap it
            live_dropped.append(live.events_dropped / live.recorder.recorded)
            ev2 = create(policy, capacity)
            dt, _ = timed(
                lambda ev=ev2: drive(trace, ev, ev.__contains__, capacity), time.perf_counter
            )
            live_base_s.append(dt)
    b, a = min(base_s), min(agent_s)
    out = {
        "policy": policy,
        "accesses": trace.n_accesses,
        "operations": ops,
        "hook_calls": hook_calls,
        "events": events,
        "baseline_ns_per_access": 1e9 * b / trace.n_accesses,
        "agent_ns_per_access": 1e9 * a / trace.n_accesses,
        "overhead_ns_per_op": 1e9 * (a - b) / ops,
        "overhead_ns_per_op_median": 1e9
        * (statistics.median(agent_s) - statistics.median(base_s))
        / ops,
        "resolve_ns_per_event": 1e9 * min(resolve_s) / events,
    }
    if live_s:
        out["live_overhead_ns_per_op"] = 1e9 * (min(live_s) - min(live_base_s)) / ops
        out["live_dropped_fraction"] = max(live_dropped)
    return out


def bench_sampling(policy: str, rounds: int, calls: int = 50_000) -> tuple[float, float]:
    """What timing the hooks adds per call, median over ``rounds`` alternating rounds of
    ``calls`` calls each, in ns: ``EngineTime.begin`` plus the ``end`` of the calls it
    times (the whole cost at a site whose work is inline: the vLLM queue and wrappers,
    ``Agent.evict``), and ``Agent.touch`` against its untimed twin ``record_touch`` on a
    one-block request (the same plus the call from one to the other)."""
    settings = AgentSettings(
        evictor=policy, worker_id="bench", buffer_events=1 << 21, redis_url="redis://127.0.0.1:9/0"
    )
    agent = Agent(settings, capacity=1024)
    agent.free([1], [0], 0.0, "chat")
    meter, block = EngineTime(), [1]

    def sampled() -> None:
        for _ in range(calls):
            started = meter.begin()
            if started:
                meter.end(started, 1)

    def bare() -> None:
        for _ in range(calls):
            pass

    def hook() -> None:
        for _ in range(calls):
            agent.touch(block, 1.0, "chat")

    def twin() -> None:
        for _ in range(calls):
            agent.record_touch(block, 1.0, "chat")

    begin_ns: list[float] = []
    touch_ns: list[float] = []
    for r in range(rounds):
        for diffs, pair in ((begin_ns, (sampled, bare)), (touch_ns, (hook, twin))):
            first, second = pair if r % 2 else pair[::-1]
            a, b = timed(first)[0], timed(second)[0]
            timed_s, untimed_s = (a, b) if first is pair[0] else (b, a)
            diffs.append(1e9 * (timed_s - untimed_s) / calls)
        agent.recorder.drain()  # never full: a dropped record would cost less
    agent.close()
    return statistics.median(begin_ns), statistics.median(touch_ns)


class Resolver:
    """Stands in for the publisher thread, on the engine thread of the benchmark: every
    ``batch_events`` recorded operations it drains and resolves them (no sending), timing
    itself so that the driver can subtract it."""

    def __init__(self, agent: Agent) -> None:
        self.publisher = agent.publisher
        self.recorder = agent.recorder
        self.seconds = 0.0
        self.events = 0

    def __call__(self) -> None:
        if self.recorder.pending >= self.recorder.batch_events:
            self.run()

    def run(self) -> None:
        t0 = CLOCK()
        self.events += sum(len(c) for c in self.publisher.collect())
        self.seconds += CLOCK() - t0


def bench_recorder(repeats: int, width: int = 100, calls: int = 20_000) -> float:
    """ns per event of ``EventRecorder.record`` alone, on ``width``-block requests."""
    blocks = list(range(width))
    offsets = np.arange(width, dtype=np.int32)
    best = float("inf")
    for _ in range(repeats):
        rec = EventRecorder(2 * width * calls, 8192)
        t0 = CLOCK()
        for _ in range(calls):
            rec.record(1, 1.0, blocks, 3, offsets)
        best = min(best, CLOCK() - t0)
        assert rec.dropped == 0
    return 1e9 * best / (width * calls)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--capacity-frac", type=float, default=0.1)
    ap.add_argument("--policies", default="lru,wa")
    ap.add_argument("--redis", action="store_true", help="also run with a live publisher")
    ap.add_argument("--wall", action="store_true", help="wall time instead of thread CPU time")
    ap.add_argument(
        "--sampling-rounds", type=int, default=0, help="rounds of timed vs untimed hooks"
    )
    args = ap.parse_args()
    global CLOCK
    if args.wall:
        CLOCK = time.perf_counter

    trace = synthetic_trace(args.requests)
    capacity = trace.capacity_for(args.capacity_frac)
    print(
        f"synthetic trace: {trace.n_requests:,} requests, {trace.n_accesses:,} block accesses, "
        f"{trace.n_unique:,} unique blocks, {len(trace.category_names)} categories; "
        f"capacity {capacity:,} blocks; best of {args.repeats}"
    )
    rec_ns = bench_recorder(args.repeats)
    print(f"EventRecorder.record alone (100-block requests): {rec_ns:.1f} ns/event")
    server = None
    redis_url = None
    tmp = None
    if args.redis:
        from controlplane.dev.embedded_redis import EmbeddedRedis

        tmp = tempfile.TemporaryDirectory()
        server = EmbeddedRedis(Path(tmp.name)).start()
        redis_url = server.url
    try:
        for policy in args.policies.split(","):
            if policy not in names():
                print(f"{policy}: not registered, skipped")
                continue
            res = bench_policy(trace, policy, capacity, args.repeats, redis_url)
            line = (
                f"{policy:>5}: evictor alone {res['baseline_ns_per_access']:.0f} ns/access, "
                f"through Agent {res['agent_ns_per_access']:.0f} ns/access; "
                f"{res['operations']:,} operations recorded; engine-thread overhead "
                f"{res['overhead_ns_per_op']:.0f} ns/op (median-based "
                f"{res['overhead_ns_per_op_median']:.0f}); publisher resolve "
                f"{res['resolve_ns_per_event']:.0f} ns/event ({res['events']:,} events)"
            )
            if "live_overhead_ns_per_op" in res:
                live = res["live_overhead_ns_per_op"]
                line += (
                    f"; with the publisher thread sending (wall time): {live:.0f} ns/op, "
                    f"at most {res['live_dropped_fraction']:.1%} of operations dropped"
                )
            print(line)
            if args.sampling_rounds:
                begin_ns, touch_ns = bench_sampling(policy, args.sampling_rounds)
                calls = res["hook_calls"]
                print(
                    f"{policy:>5}: timing (engine_time): begin/end {begin_ns:.1f} ns per call, "
                    f"Agent.touch over record_touch {touch_ns:.1f} ns per call; at "
                    f"{calls:,} hook calls per replay, {touch_ns * calls / res['operations']:.2f} "
                    f"ns/op (median of {args.sampling_rounds} alternating rounds)"
                )
    finally:
        if server is not None:
            server.stop()
        if tmp is not None:
            tmp.cleanup()


if __name__ == "__main__":
    main()

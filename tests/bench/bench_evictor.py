"""Benchmark: cost of ``touch``, ``free`` and ``evict`` for ``wa`` against ``lru``.

Drives each policy the way the replay does (touch the cached blocks of a request, free
all of them tail first, evict down to capacity) on one synthetic request stream. All
policies run in the same process in lockstep, request by request, each call timed, so
that load on the machine falls on them alike. Synthetic data: W categories (type x turn,
turns 1-5), half the requests a next turn of a recent conversation (its whole prompt plus
new blocks), the rest new prompts behind one of a few shared system prompts; prompt
lengths lognormal around 60 blocks; about 6 requests a second. ``wa`` and ``wa-ref`` get
one random parameter set per category (rates 0.001-1/s, p 0.05-0.95, life windows
1-600 s): not fitted, so their hit ratios say nothing about the policy.

    python -m tests.bench.bench_evictor [--capacity 100000] [--categories 20 100]
        [--requests 10000] [--warmup 3000] [--repeat 2] [--seed 1]

Reports nanoseconds per block touched, freed and evicted (calls of every size pooled),
microseconds per request and the ratios to ``lru`` (goal: ``wa`` within 2x). Each policy's
figures come from its fastest repeat. Not collected by pytest (no ``test_`` prefix);
results go in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import gc
import platform
import time
from dataclasses import dataclass, field

import numpy as np

from agent.policies import create
from agent.policies.base import EvictionPolicy
from agent.policies.wa import WAPolicy
from agent.policy_document import CategoryParams, PolicyDocument
from controlplane.replay.reference.wa_ref import WARefPolicy

Request = tuple[list[int], float, int]
"""(prompt blocks in offset order, time, category code)"""


def synthetic_requests(n: int, n_categories: int, seed: int) -> list[Request]:
    rng = np.random.default_rng(seed)
    n_types = max(1, n_categories // 5)
    systems = [list(range(-8 * (i + 1), -8 * i)) for i in range(4)]  # shared prefixes
    recent: list[tuple[list[int], int, int]] = []  # prompt, type, turn
    next_id = 0
    t = 0.0
    out: list[Request] = []
    for _ in range(n):
        t += float(rng.exponential(1 / 6))
        if recent and rng.random() < 0.5:
            prev, type_, turn = recent[int(rng.integers(len(recent)))]
            turn = min(turn + 1, 5)
            grow = int(np.clip(rng.lognormal(np.log(20), 0.8), 1, 400))
            prompt = prev + list(range(next_id, next_id + grow))
            prompt = prompt[:2000]
        else:
            type_, turn = int(rng.integers(n_types)), 1
            length = int(np.clip(rng.lognormal(np.log(50), 0.9), 1, 1500))
            prompt = systems[int(rng.integers(len(systems)))] + list(
                range(next_id, next_id + length)
            )
        next_id += len(prompt)
        recent.append((prompt, type_, turn))
        if len(recent) > 2000:
            recent.pop(0)
        out.append((prompt, t, (type_ * 5 + turn - 1) % n_categories))
    return out


def random_document(n_categories: int, seed: int) -> PolicyDocument:
    rng = np.random.default_rng(seed)
    cats = {
        f"c{i}": CategoryParams(
            rate=float(10 ** rng.uniform(-3, 0)),
            p_reuse=float(rng.uniform(0.05, 0.95)),
            life_s=float(10 ** rng.uniform(0, np.log10(600))),
            source="fit",
        )
        for i in range(n_categories)
    }
    return PolicyDocument(version=1, created_at=0.0, categories=cats)


OPERATIONS = ("touch", "free", "evict")


@dataclass
class OperationCost:
    """Seconds spent in one operation and the blocks it handled."""

    seconds: float = 0.0
    blocks: int = 0

    def add(self, seconds: float, blocks: int) -> None:
        self.seconds += seconds
        self.blocks += blocks


@dataclass
class Cost:
    """Each operation's cost, the requests driven and their prefix-hit blocks."""

    operations: dict[str, OperationCost] = field(
        default_factory=lambda: {op: OperationCost() for op in OPERATIONS}
    )
    requests: int = 0
    hits: int = 0

    @property
    def total_s(self) -> float:
        return sum(op.seconds for op in self.operations.values())

    def per_block_ns(self) -> dict[str, float]:
        ns = {name: 1e9 * op.seconds / max(op.blocks, 1) for name, op in self.operations.items()}
        return ns | {"request_us": 1e6 * self.total_s / self.requests}


def drive(
    policies: dict[str, EvictionPolicy], reqs: list[Request], capacity: int, warmup: int
) -> dict[str, Cost]:
    """The replay loop of ``controlplane.replay.engine``, each call timed, all policies in
    lockstep (request by request) so that load on the machine hits them alike."""
    costs = {name: Cost() for name in policies}
    clock = time.perf_counter
    for i, (prompt, now, cat) in enumerate(reqs):
        released = prompt[::-1]
        offsets = range(len(prompt) - 1, -1, -1)
        for name, policy in policies.items():
            cached = list(map(policy.__contains__, prompt))
            hit_blocks = [b for b, c in zip(prompt, cached, strict=True) if c]
            t0 = clock()
            if hit_blocks:
                policy.touch(hit_blocks, now)
            t1 = clock()
            policy.free(released, offsets, now, cat)
            t2 = clock()
            excess = len(policy) - capacity
            victims = policy.evict(excess) if excess > 0 else []
            t3 = clock()
            if i >= warmup:
                cost = costs[name]
                cost.operations["touch"].add(t1 - t0, len(hit_blocks))
                cost.operations["free"].add(t2 - t1, len(prompt))
                cost.operations["evict"].add(t3 - t2, len(victims))
                cost.requests += 1
                cost.hits += cached.index(False) if False in cached else len(cached)
    return costs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--capacity", type=int, default=100_000)
    ap.add_argument("--categories", type=int, nargs="+", default=[20, 100])
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--warmup", type=int, default=3_000)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    print(f"python {platform.python_version()} on {platform.machine()}, capacity {args.capacity}")
    print("ns per block touched / freed / evicted, us per request, block hit ratio, and the")
    print("ratio to lru per request (per operation in brackets)")
    print(
        f"{'W':>4} {'policy':<11} {'touch':>6} {'free':>6} {'evict':>6} {'us/req':>8} {'hits':>6}"
    )
    for w in args.categories:
        reqs = synthetic_requests(args.requests + args.warmup, w, args.seed)
        d = random_document(w, args.seed)
        names = [f"c{i}" for i in range(w)]
        best: dict[str, Cost] = {}
        for _ in range(args.repeat):
            gc.collect()
            policies: dict[str, EvictionPolicy] = {
                "lru": create("lru", args.capacity),
                "wa": WAPolicy(args.capacity, category_names=names, doc=d),
                "wa creator": WAPolicy(
                    args.capacity, category_names=names, doc=d, attribution="creator"
                ),
                "wa-ref": WARefPolicy(args.capacity, category_names=names, doc=d),
            }
            for name, cost in drive(policies, reqs, args.capacity, args.warmup).items():
                if name not in best or cost.total_s < best[name].total_s:
                    best[name] = cost
        base = best["lru"].per_block_ns()
        for label, cost in best.items():
            ns = cost.per_block_ns()
            ratio = " ".join(f"{ns[k] / base[k]:4.1f}" for k in OPERATIONS)
            print(
                f"{w:>4} {label:<11} {ns['touch']:>6.0f} {ns['free']:>6.0f} {ns['evict']:>6.0f}"
                f" {ns['request_us']:>8.1f} {cost.hits / cost.operations['free'].blocks:>6.3f}"
                f" {ns['request_us'] / base['request_us']:>6.2f}x  ({ratio})"
            )


if __name__ == "__main__":
    main()

"""Benchmark: kvwise's cost in SGLang's real ``RadixCache`` against SGLang's own LRU
strategy, same process. Runs where sglang imports (the virtualenv of
``.ci/stage_sglang.sh``).

A tree of ``--requests`` requests (each a shared prefix of one of 8 system prompts plus a
unique suffix, one of 4 categories) is built afresh, untimed, before every run. Two
measurements, each the best of ``--repeat`` runs:

- *evict*: one ``evict`` pass freeing ``--evict`` tokens, in microseconds per pass and
  per evicted node (SGLang scores every evictable leaf on each pass, then pops victims
  from a heap);
- *score*: the strategy's share of a pass, ``get_priority`` of every evictable leaf plus
  the heap built from the keys, in nanoseconds per leaf (best of 25 rounds per run);
- *request*: ``match_prefix`` with the request then ``insert`` of its whole sequence, in
  microseconds per request (the plugin's hit and insert reports, category lookup and
  event recording included).

Stock is SGLang's ``RadixCache`` with its default ``lru`` strategy; kvwise is the same
class built through the plugin (``RadixOrder`` with a 4-category policy, wrappers, side
table; the agent's Redis is unreachable, so events are buffered and dropped, never
waited for).

    python -m tests.bench.bench_sglang_radix [--requests 4000] [--evict 20000]
        [--repeat 5]

Torch runs on one thread (``torch.set_num_threads(1)``): on a busy 2-core machine its
thread pool made the allocator's ``torch.cat`` in every free take milliseconds. Not
collected by pytest.
"""

from __future__ import annotations

import argparse
import heapq
import os
import random
import time
from array import array
from types import SimpleNamespace
from typing import Any

from agent.integrations.radix_order import RadixOrder

CATEGORIES = ("chat", "doc", "code", "agent")


def build(kvwise: bool, size: int) -> tuple[Any, Any]:
    import torch
    from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.radix_cache import RadixCache

    from agent.integrations import sglang as plugin
    from agent.policy_document import CategoryParams, PolicyDocument
    from agent.settings import AgentSettings

    allocator = TokenToKVPoolAllocator(size, torch.int64, "cpu", None, False)
    params = CacheInitParams(
        disable=False, req_to_token_pool=None, token_to_kv_pool_allocator=allocator, page_size=1
    )
    if not kvwise:
        return RadixCache(params), None
    plugin.detach()
    cache = RadixCache(params)
    settings = AgentSettings(enable=True, redis_url="redis://127.0.0.1:1/0", redis_timeout_s=0.1)
    hooks = plugin.attach(cache, settings)
    doc = PolicyDocument(
        version=2,
        categories={
            name: CategoryParams(rate=0.01 * (i + 1), p_reuse=0.2 * (i + 1), life_s=60.0)
            for i, name in enumerate(CATEGORIES)
        },
    )
    hooks.order.set_policy(doc)
    return cache, hooks


class Workload:
    def __init__(self, requests: int, seed: int) -> None:
        rng = random.Random(seed)
        prompts = [[rng.randrange(1, 30000) for _ in range(256)] for _ in range(8)]
        self.seqs = [
            rng.choice(prompts)[: rng.choice([64, 128, 256])]
            + [rng.randrange(1, 30000) for _ in range(rng.randrange(16, 128))]
            for _ in range(requests)
        ]
        self.cats = [CATEGORIES[rng.randrange(4)] for _ in range(requests)]

    def tokens(self) -> int:
        return sum(map(len, self.seqs))


def request(tokens: list[int], category: str) -> Any:
    params = SimpleNamespace(custom_params={"kv_category": category})
    return SimpleNamespace(sampling_params=params, origin_input_ids=tokens)


def serve_all(cache: Any, hooks: Any, work: Workload) -> None:
    """Each request as the scheduler drives the tree: match (with the request), insert."""
    import torch
    from sglang.srt.mem_cache.base_prefix_cache import InsertParams, MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixKey

    allocator = cache.token_to_kv_pool_allocator
    for seq, cat in zip(work.seqs, work.cats, strict=True):
        req = request(seq, cat)
        key = RadixKey(array("q", seq))
        m = cache.match_prefix(MatchPrefixParams(key=key, req=req))
        new = allocator.alloc(len(seq) - m.device_prefix_len)
        value = torch.cat([cache.path_device_indices(m.last_device_node), new])
        if hooks is not None:
            with hooks.serving(req):
                cache.insert(InsertParams(key=RadixKey(array("q", seq)), value=value))
        else:
            cache.insert(InsertParams(key=RadixKey(array("q", seq)), value=value))


def run(kvwise: bool, args: argparse.Namespace) -> dict[str, float]:
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams

    work = Workload(args.requests, seed=1)
    size = work.tokens() + 1
    best_evict = best_pass = best_request = best_score = float("inf")
    for _ in range(args.repeat):
        cache, hooks = build(kvwise, size)
        start = time.perf_counter()
        serve_all(cache, hooks, work)
        best_request = min(best_request, (time.perf_counter() - start) / args.requests)
        best_score = min(best_score, score(cache))
        nodes_before = count_nodes(cache)
        start = time.perf_counter()
        cache.evict(EvictParams(num_tokens=args.evict))
        elapsed = time.perf_counter() - start
        evicted = nodes_before - count_nodes(cache)
        best_evict = min(best_evict, elapsed / max(evicted, 1))
        best_pass = min(best_pass, elapsed)
    return {
        "evict_pass_us": best_pass * 1e6,
        "evict_us_per_node": best_evict * 1e6,
        "request_us": best_request * 1e6,
        "score_ns_per_leaf": best_score * 1e9,
    }


def score(cache: Any, rounds: int = 25) -> float:
    """Seconds per leaf to key every evictable leaf and heap them, as ``evict`` does (best
    of ``rounds``: one round takes a millisecond or two, shorter than the noise)."""
    strategy = cache.eviction_strategy
    if isinstance(strategy, RadixOrder):
        strategy.begin(time.monotonic())
    leaves = list(cache.evictable_leaves)
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        heap = [(strategy.get_priority(node), node) for node in leaves]
        heapq.heapify(heap)
        best = min(best, time.perf_counter() - start)
    return best / len(leaves)


def count_nodes(cache: Any) -> int:
    stack, n = list(cache.root_node.children.values()), 0
    while stack:
        node = stack.pop()
        n += 1
        stack.extend(node.children.values())
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=4000)
    ap.add_argument("--evict", type=int, default=20000, help="tokens per eviction pass")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    os.environ.setdefault("KVWISE_ENABLE", "1")
    import torch

    torch.set_num_threads(1)
    stock = run(False, args)
    kv = run(True, args)
    print(f"{'':28} {'stock lru':>12} {'kvwise wa':>12} {'ratio':>7}")
    rows = (
        ("score_ns_per_leaf", "score + heap, ns per leaf"),
        ("evict_pass_us", "evict pass, us"),
        ("evict_us_per_node", "evict, us per evicted node"),
        ("request_us", "match + insert, us per req"),
    )
    for name, label in rows:
        print(f"{label:28} {stock[name]:12.2f} {kv[name]:12.2f} {kv[name] / stock[name]:7.2f}")


if __name__ == "__main__":
    main()

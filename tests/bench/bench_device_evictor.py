"""Benchmark: ``evict(n)`` of the device (torch) evictor against the CPU ``wa`` and against
vLLM's stock free queue, same process, same cache size.

Each evictor is filled with ``--blocks`` cached, evictable blocks: requests of 1-64 blocks
released tail first, 20 categories with random fitted-like parameters (synthetic data),
times increasing. Then, for each ``n``, every timed call evicts ``n`` blocks; the victims
are released again (untimed) so the size stays constant. vLLM's queue "evicts" with
``popleft_n(n)`` and takes the blocks back with ``append_n``; it is vLLM's own
``FreeKVCacheBlockQueue`` when vLLM imports here, else a re-implementation of its doubly
linked list written from vLLM's source semantics (the report says which).

    python -m tests.bench.bench_device_evictor [--blocks 100000 1000000] [--n 1 16 256]
        [--device cpu] [--threads 1] [--calls 200] [--seed 1]

``--threads`` sets torch's intra-op threads: on a small shared CPU several threads make
each small op wait on the others (100x slower here), so the default is one.

Reports microseconds per ``evict(n)`` call (median and mean of ``--calls``; the device
evictor and ``wa`` called in turn, call by call, so that load falls on both alike) and
nanoseconds per evicted block (median). Not collected by pytest; results go in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import gc
import platform
import statistics
import time
from typing import Any

import numpy as np
import torch

from agent.device_evictor import DeviceEvictor
from agent.policies.wa import WAPolicy
from agent.policy_document import CategoryParams, PolicyDocument

N_CATEGORIES = 20


def document(rng: np.random.Generator) -> PolicyDocument:
    cats = {
        f"c{i}": CategoryParams(
            rate=float(10 ** rng.uniform(-3, 0)),
            p_reuse=float(rng.uniform(0.05, 0.95)),
            life_s=float(10 ** rng.uniform(0, 2.8)),
            source="fit",
        )
        for i in range(N_CATEGORIES)
    }
    return PolicyDocument(version=1, categories=cats)


def fill(pol: Any, n_blocks: int, rng: np.random.Generator) -> float:
    """Release ``n_blocks`` blocks in requests; returns the last time used."""
    t, b = 0.0, 0
    while b < n_blocks:
        k = min(int(rng.integers(1, 65)), n_blocks - b)
        blocks = list(range(b + k - 1, b - 1, -1))
        pol.free(blocks, range(k - 1, -1, -1), t, int(rng.integers(N_CATEGORIES)))
        b += k
        t += float(rng.exponential(0.01))
    return t


def time_lockstep(pols: list[Any], n: int, calls: int, t0: float) -> list[list[float]]:
    """Seconds per ``evict(n)`` of each policy, the policies called in turn (so load on
    the machine falls on them alike); the victims are released again, untimed."""
    out: list[list[float]] = [[] for _ in pols]
    t = t0
    for i in range(calls):
        t += 0.01
        for pol, samples in zip(pols, out, strict=True):
            start = time.perf_counter()
            victims = pol.evict(n)
            samples.append(time.perf_counter() - start)
            pol.free(victims, range(len(victims) - 1, -1, -1), t, i % N_CATEGORIES)
    return out


class LinkedFreeQueue:
    """vLLM's ``FreeKVCacheBlockQueue`` semantics (v0.32/v0.33 source): a doubly linked
    list of block objects with sentinel head and tail; ``popleft_n`` unlinks from the head,
    ``append_n`` links at the tail. Used only when vLLM is not importable."""

    class Block:
        __slots__ = ("block_id", "next_free_block", "prev_free_block")

        def __init__(self, block_id: int) -> None:
            self.block_id = block_id
            self.prev_free_block: LinkedFreeQueue.Block | None = None
            self.next_free_block: LinkedFreeQueue.Block | None = None

    def __init__(self, blocks: list[Block]) -> None:
        self.num_free_blocks = len(blocks)
        self.head = self.Block(-1)
        self.tail = self.Block(-1)
        prev = self.head
        for blk in blocks:
            prev.next_free_block, blk.prev_free_block = blk, prev
            prev = blk
        prev.next_free_block, self.tail.prev_free_block = self.tail, prev

    def popleft_n(self, n: int) -> list[Block]:
        out: list[LinkedFreeQueue.Block] = []
        cur = self.head.next_free_block
        for _ in range(n):
            assert cur is not None
            out.append(cur)
            nxt = cur.next_free_block
            cur.prev_free_block = cur.next_free_block = None
            cur = nxt
        self.head.next_free_block = cur
        assert cur is not None
        cur.prev_free_block = self.head
        self.num_free_blocks -= n
        return out

    def append_n(self, blocks: list[Block]) -> None:
        last = self.tail.prev_free_block
        assert last is not None
        for blk in blocks:
            blk.prev_free_block, last.next_free_block = last, blk
            last = blk
        last.next_free_block, self.tail.prev_free_block = self.tail, last
        self.num_free_blocks += len(blocks)


def stock_queue(n_blocks: int) -> tuple[Any, str]:
    try:
        from vllm.v1.core.kv_cache_utils import FreeKVCacheBlockQueue, KVCacheBlock
    except Exception:  # vLLM absent or broken here: the re-implementation
        blocks = [LinkedFreeQueue.Block(i) for i in range(n_blocks)]
        return LinkedFreeQueue(blocks), "re-implementation (vLLM not importable here)"
    import vllm

    return FreeKVCacheBlockQueue([KVCacheBlock(i) for i in range(n_blocks)]), (
        f"vLLM {vllm.__version__} FreeKVCacheBlockQueue"
    )


def time_stock(queue: Any, n: int, calls: int) -> list[float]:
    out: list[float] = []
    for _ in range(calls):
        start = time.perf_counter()
        blocks = queue.popleft_n(n)
        out.append(time.perf_counter() - start)
        queue.append_n(blocks)
    return out


def report(name: str, n: int, samples: list[float]) -> tuple[float, float]:
    """Prints and returns the median and the mean seconds per call."""
    med, mean = statistics.median(samples), statistics.fmean(samples)
    print(
        f"  {name:<22} evict({n:>3}): {med * 1e6:>9.1f} us/call median, {mean * 1e6:>9.1f} "
        f"mean {med / n * 1e9:>9.0f} ns/block"
    )
    return med, mean


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--blocks", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--n", type=int, nargs="+", default=[1, 16, 256])
    ap.add_argument("--device", default="cpu", help="torch device of the device evictor")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"python {platform.python_version()}, torch {torch.__version__}, "
        f"device {args.device}, {torch.get_num_threads()} threads, "
        f"{N_CATEGORIES} categories (synthetic)"
    )
    for n_blocks in args.blocks:
        rng = np.random.default_rng(args.seed)
        doc = document(rng)
        names = list(doc.categories)
        dev = DeviceEvictor(n_blocks, device=args.device, category_names=names, doc=doc)
        wa = WAPolicy(category_names=names, doc=doc)
        t_fill = fill(dev, n_blocks, np.random.default_rng(args.seed))
        fill(wa, n_blocks, np.random.default_rng(args.seed))
        queue, stock_name = stock_queue(n_blocks)
        print(f"{n_blocks:,} blocks; stock queue: {stock_name}")
        for n in args.n:
            gc.collect()
            warm = 10  # first calls untimed: torch's first kernels, the first bound pass
            dev_samples, wa_samples = (
                samples[warm:] for samples in time_lockstep([dev, wa], n, warm + args.calls, t_fill)
            )
            t_fill += 0.01 * (warm + args.calls)
            dev_s, dev_mean = report("device evictor", n, dev_samples)
            wa_s, wa_mean = report("wa (CPU)", n, wa_samples)
            stock_s, _ = report("vLLM free queue", n, time_stock(queue, n, args.calls))
            print(
                f"  ratios: device/wa {dev_s / wa_s:,.1f}x (mean {dev_mean / wa_mean:,.1f}x), "
                f"device/stock {dev_s / stock_s:,.1f}x, wa/stock {wa_s / stock_s:,.1f}x"
            )


if __name__ == "__main__":
    main()

"""Benchmark: what one ``discard`` call costs each evictor, by how many blocks it holds.

A KV connector's ``evict_blocks`` reaches the evictor as one ``discard`` call on the
engine thread (``KvwiseFreeQueue.drop_hashes``). Each policy is filled with ``--blocks``
cached, evictable blocks (requests of 16, freed one after another), then one call
discards ``--discarded`` blocks from the middle; the best of ``--repeat`` fresh fills is
printed, in milliseconds. The queue policies (fifo, sieve, s3fifo) pass over their queue
once per call; the others do O(1) work per block.

    python -m tests.bench.bench_discard [--blocks 100000] [--discarded 2] [--repeat 5]

Not collected by pytest.
"""

from __future__ import annotations

import time

from agent.policies import create, names
from agent.policies.base import Discards
from tests.bench.command_line import run_from_command_line

REQUEST_BLOCKS = 16


def discard_ms(name: str, blocks: int, discarded: int, repeat: int) -> float:
    """The fastest of ``repeat`` discards of ``discarded`` blocks from a fresh ``name``
    holding ``blocks``."""
    best = float("inf")
    offsets = range(REQUEST_BLOCKS)
    for _ in range(repeat):
        policy = create(name, blocks)
        assert isinstance(policy, Discards), name
        for first in range(0, blocks, REQUEST_BLOCKS):
            policy.free(list(range(first, first + REQUEST_BLOCKS)), offsets, float(first), 0)
        middle = list(range(blocks // 2, blocks // 2 + discarded))
        start = time.perf_counter()
        policy.discard(middle)
        best = min(best, time.perf_counter() - start)
        assert len(policy) == blocks - discarded, (name, len(policy))
    return best * 1e3


def run(blocks: int, discarded: int, repeat: int) -> None:
    print(f"one discard of {discarded} blocks among {blocks:,} cached, best of {repeat}")
    for name in names():
        print(f"{name:8s} {discard_ms(name, blocks, discarded, repeat):8.3f} ms")


def main() -> None:
    run_from_command_line(__doc__, run, blocks=100_000, discarded=2, repeat=5)


if __name__ == "__main__":
    main()

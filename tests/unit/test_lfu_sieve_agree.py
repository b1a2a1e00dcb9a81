"""Why ``lfu`` and ``sieve`` can score the same hits at every capacity of a trace.

Both evict only blocks never hit since their insertion as long as such blocks remain:
``lfu`` takes frequency-1 blocks, least recently released first, and a frequency-1 block
was released once, when it was inserted; ``sieve``'s hand takes unvisited blocks oldest
inserted first. So while neither ever evicts a block that was hit, the two caches hold
the same blocks after every request and are the same policy. That is what happens at the
larger capacities of the Mooncake sample; at the smaller ones ``sieve``'s hand clears the
bit of hit blocks and later evicts some of them, and the two part ways. ``lfu`` itself
matches libCacheSim's LFU exactly (``tests/integration/test_crosscheck_libcachesim.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

import agent.policies as agent_policies
from agent.policies.base import EvictionPolicy
from controlplane.replay.engine import replay_hits
from controlplane.traces.model import Trace
from controlplane.traces.reader import load_trace

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "mooncake_synthetic.jsonl.gz"


class VictimLog:
    """A policy wrapped to log its victims and how many had been hit since insertion."""

    def __init__(self, inner: EvictionPolicy) -> None:
        self.inner = inner
        self.victims: list[int] = []
        self.hit_victims = 0
        self._hit: set[int] = set()

    def touch(self, blocks: Sequence[int], now: float) -> None:
        self._hit.update(blocks)
        self.inner.touch(blocks, now)

    def free(
        self, blocks: Sequence[int], offsets: Sequence[int], now: float, category: int
    ) -> None:
        self.inner.free(blocks, offsets, now, category)

    def evict(self, n: int) -> list[int]:
        victims = self.inner.evict(n)
        self.victims += victims
        self.hit_victims += sum(1 for b in victims if b in self._hit)
        self._hit.difference_update(victims)
        return victims

    def __len__(self) -> int:
        return len(self.inner)

    def __contains__(self, block: object) -> bool:
        return block in self.inner


@pytest.fixture(scope="module")
def trace() -> Trace:
    return load_trace(SAMPLE)


def run(trace: Trace, name: str, capacity: int) -> tuple[int, VictimLog]:
    log = VictimLog(agent_policies.create(name, capacity))
    return int(replay_hits(trace, log, capacity).sum()), log


@pytest.mark.parametrize("share", [0.4, 0.6])
def test_same_policy_while_no_hit_block_is_evicted(trace: Trace, share: float) -> None:
    capacity = round(share * trace.n_unique)
    lfu_hits, lfu = run(trace, "lfu", capacity)
    sieve_hits, sieve = run(trace, "sieve", capacity)
    assert lfu.hit_victims == sieve.hit_victims == 0
    assert lfu.victims == sieve.victims and len(lfu.victims) > 10_000
    assert lfu_hits == sieve_hits


def test_they_part_ways_once_sieve_evicts_hit_blocks(trace: Trace) -> None:
    capacity = round(0.05 * trace.n_unique)
    lfu_hits, lfu = run(trace, "lfu", capacity)
    sieve_hits, sieve = run(trace, "sieve", capacity)
    assert lfu.hit_victims == 0 < sieve.hit_victims
    assert lfu_hits != sieve_hits

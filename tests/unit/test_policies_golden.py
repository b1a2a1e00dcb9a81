"""Golden hit counts: every replay policy on small hand-made traces, derived by hand.

Each trace is replayed with ``controlplane.replay.engine.replay_hits`` (prefix hits per
request, blocks freed tail first, eviction after each request down to the capacity), in
checked mode so a policy that breaks the Protocol fails here too. The comment above each
expectation is its derivation; ``Trace.from_requests`` renames blocks by first appearance,
which the comments ignore (the hit counts do not depend on names).

Queue notation in the comments: oldest (next victim) first.
"""

from __future__ import annotations

import pytest

import agent.policies as agent_policies
from controlplane.replay import catalog
from controlplane.replay.engine import replay_hits
from controlplane.traces.model import Trace

ALL = ("lru", "fifo", "lfu", "s3fifo", "sieve", "arc", "belady", "inf")
BASELINES = ("lru", "fifo", "lfu", "s3fifo", "sieve", "arc")


def hits(name: str, requests: list[list[int]], capacity: int) -> list[int]:
    trace = Trace.from_requests(requests)
    policy = catalog.create(name, capacity, trace)
    return replay_hits(trace, policy, capacity, check=True).tolist()


# -- traces every policy is derived on --------------------------------------------------

TAIL_FIRST = [[1, 2, 3, 4], [5, 6], [1, 2, 3]]
# Capacity 4. R0 inserts 4, 3, 2, 1 (freed tail first); R1 inserts 6, 5: six blocks, so two
# go. vLLM's order evicts the tail of R0 (4, then 3) and keeps its head, so R2 finds 1, 2.
# - lru, fifo: queue 4 3 2 1 6 5 -> evict 4, 3 -> R2 hits 1, 2, then misses 3.
# - lfu: all seen once; ties by least recent release, 4 first -> same as lru.
# - sieve: nothing visited; the hand starts at the oldest -> evicts 4, 3.
# - arc: all in t1 (6 > capacity, b1 empty) -> case IV evicts t1's LRU, 4 then 3.
# - s3fifo: small queue 1 slot. Before the first eviction a miss arriving while small is
#   full goes to main (libCacheSim's rule): small [4], main [3 2 1 6 5]. main holds more
#   than its 3 slots -> evicts 3, then 2 (count 0) -> R2 hits 1 only.
# - belady: 4, 5, 6 are never used again; ties go in release order -> evicts 4, 6 -> 3 hits.
# - inf: everything stays -> 3 hits.
TAIL_FIRST_HITS = {
    "lru": [0, 0, 2],
    "fifo": [0, 0, 2],
    "lfu": [0, 0, 2],
    "sieve": [0, 0, 2],
    "arc": [0, 0, 2],
    "s3fifo": [0, 0, 1],
    "belady": [0, 0, 3],
    "inf": [0, 0, 3],
}

PREFIX_BREAK = [[1, 2, 3], [1, 9, 3], [1, 9, 3]]
# Capacity 3. R1: 1 hits, 9 misses, so the prefix breaks: 3 is cached but recomputed, a miss
# (R1 scores 1). It is still accessed and stays cached, so R2 scores 3 wherever 3 was
# refreshed by the access, and 2 (untouched by R1) is the victim:
# - lru: touch 1, 3; queue 2 3 9 1 -> evicts 2.
# - lfu: 1, 3 counted twice, 2 and 9 once; 2 released longer ago -> evicts 2.
# - sieve: 1, 3 visited; the hand clears 3's bit and evicts 2.
# - arc: 1, 3 move to t2; 9 joins t1 after 2; |t1|=2 > p=0 -> evicts t1's LRU, 2.
# - s3fifo: small [3] (counted once), main [2 1 9] before the first eviction -> main is
#   over its 2 slots -> evicts its head 2 (count 0).
# - belady: 2 is never used again -> evicts 2. inf: keeps all.
# - fifo: a hit never moves a block: queue 3 2 1 9 -> evicts 3 -> R2 scores 2.
PREFIX_BREAK_HITS = {name: [0, 1, 3] for name in ALL} | {"fifo": [0, 1, 2]}

LONGER_THAN_CAPACITY = [[1, 2, 3, 4], [1, 2, 3, 4]]
# Capacity 2. R0 is served whole, then trimmed to 2 blocks: the tail goes (4, then 3),
# so R1 finds its head 1, 2 (lru, fifo, lfu, sieve: as in TAIL_FIRST; arc: case IV with an
# empty b1 evicts t1's LRU; belady: all four come back in R1, ties in release order).
# - s3fifo: small [4], main [3 2 1]; main over its 1 slot -> evicts 3, then 2 -> R1 finds
#   1 only.
# - inf: 4.
LONGER_THAN_CAPACITY_HITS = {name: [0, 2] for name in ALL} | {"s3fifo": [0, 1], "inf": [0, 4]}

RECENCY = [[1], [2], [1], [3], [1]]
# Capacity 2. R2 hits 1; R3 brings 3 and one block must go.
# - lru: 1 was just used -> evicts 2 -> R4 hits.
# - fifo: 1 is the oldest insert -> evicts 1 -> R4 misses.
# - lfu: 1 counted twice -> evicts 2. sieve: 1 visited, the hand clears it, evicts 2.
# - arc: 1 in t2, t1 [2 3]; |t1|+|b1|+1 > 2 with b1 empty -> evicts 2.
# - s3fifo: small [1] (count 1), main [2 3] -> main over 1 slot -> evicts 2.
# - belady: 2 is never used again. inf: keeps all.
RECENCY_HITS = {name: [0, 0, 1, 0, 1] for name in ALL} | {"fifo": [0, 0, 1, 0, 0]}

FREQUENCY = [[1], [1], [2], [3], [1]]
# Capacity 2. 1 is used twice, then 2 and 3 arrive: lru and fifo evict 1 (least recent,
# oldest insert); every policy that remembers the second use keeps it and evicts 2:
# lfu (count 2 vs 1), sieve (visited), arc (1 in t2, t1's LRU is 2), s3fifo (1 stays in
# small with count 1; main [2 3] is over its 1 slot and evicts 2), belady, inf.
FREQUENCY_HITS = {name: [0, 1, 0, 0, 1] for name in ALL} | {
    "lru": [0, 1, 0, 0, 0],
    "fifo": [0, 1, 0, 0, 0],
}


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize(
    ("requests", "capacity", "expected"),
    [
        pytest.param(TAIL_FIRST, 4, TAIL_FIRST_HITS, id="tail-first"),
        pytest.param(PREFIX_BREAK, 3, PREFIX_BREAK_HITS, id="prefix-break"),
        pytest.param(LONGER_THAN_CAPACITY, 2, LONGER_THAN_CAPACITY_HITS, id="too-long"),
        pytest.param(RECENCY, 2, RECENCY_HITS, id="recency"),
        pytest.param(FREQUENCY, 2, FREQUENCY_HITS, id="frequency"),
    ],
)
def test_every_policy_on_shared_traces(
    name: str, requests: list[list[int]], capacity: int, expected: dict[str, list[int]]
) -> None:
    assert hits(name, requests, capacity) == expected[name]


def test_golden_tables_cover_every_replay_policy() -> None:
    """A newly registered baseline must get golden numbers too (fitted policies have their
    own golden tests)."""
    assert set(ALL) <= set(catalog.names())
    for table in (TAIL_FIRST_HITS, PREFIX_BREAK_HITS, LONGER_THAN_CAPACITY_HITS):
        assert set(table) == set(ALL)


# -- one trace per policy, where the policy's own mechanism decides ----------------------


def test_s3fifo_ghost_hit_goes_to_main() -> None:
    # Capacity 3: small 1 slot, main 2, ghost 2.
    # R0-R2: small [1], main [2 3] (small full before the first eviction).
    # R3 4 -> main [2 3 4], over 2 slots -> evict 2 (count 0).
    # R4 5 -> small [1 5] -> evict from small: 1 (count 0) -> ghost [1].
    # R5 1 -> ghost hit -> main [3 4 1] -> evict main's head 3.
    # R6 1 hits. R7 6 -> small [5 6] -> evict 5 to the ghost. R8 4 is still in main: hit.
    requests = [[1], [2], [3], [4], [5], [1], [1], [6], [4]]
    assert hits("s3fifo", requests, 3) == [0, 0, 0, 0, 0, 0, 1, 0, 1]
    # lru evicts 4 at R7 (order 4 5 1 before 6 arrives) and misses it at R8.
    assert hits("lru", requests, 3) == [0, 0, 0, 0, 0, 0, 1, 0, 0]


def test_arc_keeps_t2_and_adapts_on_a_b1_ghost_hit() -> None:
    # Capacity 3. R0-R3: 1 and 2 are used twice -> t2 [1 2]. R4 3 -> t1 [3].
    # R5 4 -> t1 [3 4]: 4 blocks. Case IV: |t1|+|b1|+1 = 3 is not over 3, the lists hold
    # 4 < 6, so REPLACE: |t1| = 2 > p = 0 -> t1's LRU 3 goes to b1.
    # R6 3 is a miss found in b1: p += max(|b2|/|b1|, 1) = 1; 3 joins t2 [1 2 3]; REPLACE
    # with |t1| = 1 not above p = 1 -> t2's LRU 1 goes to b2.
    # R7 4 hits (t1). R8 1 misses (it was in b2).
    requests = [[1], [1], [2], [2], [3], [4], [3], [4], [1]]
    assert hits("arc", requests, 3) == [0, 1, 0, 1, 0, 0, 0, 1, 0]
    # lru instead evicts 1 at R5 (least recent), so it hits 3 at R6.
    assert hits("lru", requests, 3) == [0, 1, 0, 1, 0, 0, 1, 1, 0]


def test_sieve_hand_keeps_its_place() -> None:
    # Capacity 3. Queue 1 2 3; R3 hits 1 (visited). R4 4: the hand clears 1 and evicts 2,
    # stopping at 3. R5 5: the hand evicts 3 (unvisited). R6: 1 is still cached -> hit,
    # although its bit was cleared, because the hand has not come round again.
    requests = [[1], [2], [3], [1], [4], [5], [1]]
    assert hits("sieve", requests, 3) == [0, 0, 0, 1, 0, 0, 1]
    # fifo evicts 1 at R4 (a hit does not count) and misses at R6.
    assert hits("fifo", requests, 3) == [0, 0, 0, 1, 0, 0, 0]


def test_lfu_forgets_counts_on_eviction() -> None:
    # Capacity 2. 1 counted twice. R3 3: 2 and 3 counted once, 2 older -> evict 2.
    # R4 2 comes back counted once (its past use was forgotten): 3 is older -> evict 3.
    # R5 4: 2 is older than 4 -> evict 2. R6: 1 is still cached -> hit.
    requests = [[1], [1], [2], [3], [2], [4], [1]]
    assert hits("lfu", requests, 2) == [0, 1, 0, 0, 0, 0, 1]
    # lru drops 1 at R3 and hits 2 at R4 instead.
    assert hits("lru", requests, 2) == [0, 1, 0, 0, 1, 0, 0]


def test_belady_evicts_the_farthest_next_use() -> None:
    # Capacity 2. At R2 the next uses are 1 -> R3, 2 -> R4, 3 -> never: evict 3.
    requests = [[1], [2], [3], [1], [2]]
    assert hits("belady", requests, 2) == [0, 0, 0, 1, 1]
    assert hits("inf", requests, 2) == [0, 0, 0, 1, 1]
    # lru evicts exactly the block needed next, every time.
    assert hits("lru", requests, 2) == [0, 0, 0, 0, 0]


def test_belady_keys_a_block_repeated_in_one_request_by_its_next_request() -> None:
    # Capacity 1. R0 accesses 1, 2, 1 (two blocks cached, one goes); R1 needs 2, and 1 is
    # never used again: evict 1. Keyed by its repeat inside R0 (next use R0 itself, the
    # nearest there is), 1 was kept and 2 evicted.
    assert hits("belady", [[1, 2, 1], [2]], 1) == [0, 1]
    # The same with a later use of 1, farther than 2's: still evict 1.
    assert hits("belady", [[1, 2, 1], [2], [1]], 1) == [0, 1, 0]
    # And the repeat does not hide a nearer later use: 2 goes, 1 comes back at R1.
    assert hits("belady", [[1, 2, 1], [1], [2]], 1) == [0, 1, 0]


# -- live serving: blocks in use when eviction runs -------------------------------------


@pytest.mark.parametrize("name", BASELINES)
def test_block_in_use_is_skipped_then_evictable_again(name: str) -> None:
    # Three one-block requests insert 1, 2, 3; a fourth reuses 1 and is still running.
    # Every baseline would pick 1 first or keep it; in use, it must not be returned even
    # when everything is asked for. Once freed it is the only block left to evict.
    policy = agent_policies.create(name, 3)
    for b in (1, 2, 3):
        policy.free([b], [0], float(b), 0)
    policy.touch([1], 4.0)
    assert sorted(policy.evict(3)) == [2, 3]
    assert len(policy) == 1 and 1 in policy
    assert policy.evict(1) == []
    policy.free([1], [0], 5.0, 0)
    assert policy.evict(5) == [1]
    assert len(policy) == 0 and 1 not in policy


def test_fifo_returns_blocks_parked_in_use_to_their_places() -> None:
    # A request's misses 1 (head) and 2 (tail) go in tail first: 2, 1; then 3. A request
    # hits 1 and 2, so a scan parks them and evicts 3. Freed (tail first again), they are
    # back in insertion order, 2 before 1, as if the scan had stepped over them.
    policy = agent_policies.create("fifo", 3)
    policy.free([2, 1], [1, 0], 0.0, 0)
    policy.free([3], [0], 1.0, 0)
    policy.touch([1, 2], 2.0)
    assert policy.evict(1) == [3]
    policy.free([2, 1], [1, 0], 3.0, 0)
    assert policy.evict(2) == [2, 1]

"""Properties every registered policy must keep, on random traces and random Protocol calls.

- Replay (every name ``controlplane.replay.catalog`` knows, bounds included): after every
  request the cache holds at most ``capacity`` blocks and agrees, block by block, with
  what the replay inserted and evicted (``replay_hits(check=True)``); no policy scores
  more than the infinite cache on any request.
- Live serving (every agent policy, driven through the Protocol directly): with blocks in
  use by running requests, ``evict(n)`` returns at most ``n`` distinct blocks, every one
  cached and not in use, and as many as it can (all ``n`` when that many are evictable).
  ``fifo`` evicts exactly as a plain list in insertion order that skips the blocks in use.
- A touch of a block that is not cached (the contract forbids it; an engine bug or a race
  can do it) neither raises nor leaks: once freed, the block is evicted like any other.
  From the touch on, ``len`` and ``in`` count it as held, as they count what ``evict``
  will give back.
- A policy that ``Discards`` (``wa``, ``lru``) lets blocks go, evictable or in use, and
  takes one freed again as a new block.
- Unknown names fail with the list of known ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import agent.policies as agent_policies
from agent.policies.base import Discards
from agent.policies.registry import UnknownPolicyError
from agent.policies.wa import WAPolicy
from controlplane.replay import catalog
from controlplane.replay.engine import ReplayCheckError, replay_hits
from controlplane.traces.model import Trace

# -- random prefix-sharing traces -------------------------------------------------------


@st.composite
def prefix_traces(draw: st.DrawFn) -> list[list[int]]:
    """Requests that extend a few shared prefixes (system prompts, earlier turns) with
    fresh or recurring blocks, and sometimes repeat a block inside one request."""
    n_prefixes = draw(st.integers(1, 4))
    prefixes = [
        [1000 * (p + 1) + i for i in range(draw(st.integers(0, 5)))] for p in range(n_prefixes)
    ]
    requests = []
    for _ in range(draw(st.integers(1, 25))):
        base = prefixes[draw(st.integers(0, n_prefixes - 1))]
        cut = draw(st.integers(0, len(base)))
        tail = draw(st.lists(st.integers(0, 30), max_size=6))
        requests.append(base[:cut] + tail)
    return requests


@settings(max_examples=60, deadline=None)
@given(requests=prefix_traces(), capacity=st.integers(0, 24))
def test_replay_invariants_hold_for_every_policy(requests: list[list[int]], capacity: int) -> None:
    trace = Trace.from_requests(requests)
    ideal = replay_hits(trace, catalog.create("inf", capacity, trace), capacity, check=True)
    for name in catalog.names():
        policy = catalog.create(name, capacity, trace)
        # check=True: capacity, victims and membership after every request.
        try:
            got = replay_hits(trace, policy, capacity, check=True)
        except ReplayCheckError as e:
            raise AssertionError(f"{name}: {e}") from e
        assert (got >= 0).all() and (got <= trace.lengths).all(), name
        assert (got <= ideal).all(), f"{name} beats the infinite cache: {got} > {ideal}"
        if name != "inf":  # the infinite cache reports no size, so it is never asked to evict
            held = sum(b in policy for b in range(trace.n_unique))
            assert len(policy) == held <= capacity, name


# -- the Protocol with blocks in use ----------------------------------------------------


@dataclass
class Model:
    """What the caller knows: cached blocks, and how many running requests hold each."""

    cached: set[int] = field(default_factory=set)
    refs: dict[int, int] = field(default_factory=dict)
    running: list[list[int]] = field(default_factory=list)
    clock: float = 0.0

    def in_use(self, b: int) -> bool:
        return self.refs.get(b, 0) > 0


Op = tuple[str, int, list[int]]

ops = st.lists(
    st.one_of(
        st.tuples(st.just("start"), st.just(0), st.lists(st.integers(0, 15), max_size=5)),
        st.tuples(st.just("finish"), st.integers(0, 7), st.just([])),
        st.tuples(st.just("evict"), st.integers(0, 6), st.just([])),
    ),
    max_size=60,
)


def _start(policy: agent_policies.EvictionPolicy, m: Model, blocks: list[int]) -> None:
    # A block another running request is still computing cannot be shared yet: skip it,
    # as the engine would wait for it. Ref counts decide the calls, as in vLLM's pool:
    # touch on 0 -> 1 for cached blocks; the rest is computed and freed later.
    req = list(dict.fromkeys(b for b in blocks if b in m.cached or not m.in_use(b)))
    fresh = [b for b in req if b in m.cached and not m.in_use(b)]
    policy.touch(fresh, m.clock)
    for b in req:
        m.refs[b] = m.refs.get(b, 0) + 1
    m.running.append(req)


def _finish(policy: agent_policies.EvictionPolicy, m: Model, i: int) -> list[int]:
    """Request ``i`` (of those running) ends; returns the blocks it released, in order."""
    req = m.running.pop(i % len(m.running))
    released = []
    for b in reversed(req):
        m.refs[b] -= 1
        if m.refs[b] == 0:
            released.append(b)
    offsets = [req.index(b) for b in released]
    policy.free(released, offsets, m.clock, 0)
    m.cached.update(released)
    return released


def _evict(policy: agent_policies.EvictionPolicy, m: Model, n: int) -> None:
    evictable = {b for b in m.cached if not m.in_use(b)}
    victims = policy.evict(n)
    assert len(victims) == len(set(victims)) == min(n, len(evictable)), (n, victims)
    for v in victims:
        assert v in evictable, f"evicted {v}: in use={m.in_use(v)}, cached={v in m.cached}"
        assert v not in policy
    m.cached.difference_update(victims)


@pytest.mark.parametrize("name", agent_policies.names())
@settings(max_examples=80, deadline=None)
@given(script=ops, capacity=st.integers(1, 12))
def test_evict_never_returns_a_block_in_use(name: str, script: list[Op], capacity: int) -> None:
    policy = agent_policies.create(name, capacity)
    m = Model()
    for kind, arg, blocks in script:
        m.clock += 1.0
        if kind == "start":
            _start(policy, m, blocks)
        elif kind == "finish" and m.running:
            _finish(policy, m, arg)
        elif kind == "evict":
            _evict(policy, m, arg)
        assert len(policy) == len(m.cached)
        for b in range(16):
            assert (b in policy) == (b in m.cached), b
    # Drain: finish everything, then the whole cache must come out.
    while m.running:
        _finish(policy, m, 0)
    _evict(policy, m, len(m.cached) + 1)
    assert len(policy) == 0


class NaiveFIFO:
    """FIFO by definition: cached blocks in insertion order; a victim is the first one not
    in use, wherever a hit or an earlier scan left it."""

    def __init__(self) -> None:
        self.order: list[int] = []

    def evict(self, n: int, m: Model) -> list[int]:
        victims = [b for b in self.order if not m.in_use(b)][: max(n, 0)]
        self.order = [b for b in self.order if b not in victims]
        return victims


@settings(max_examples=200, deadline=None)
@given(script=ops)
def test_fifo_evicts_in_insertion_order_whatever_was_in_use(script: list[Op]) -> None:
    policy, naive, m = agent_policies.create("fifo", 8), NaiveFIFO(), Model()
    for kind, arg, blocks in script:
        m.clock += 1.0
        if kind == "start":
            _start(policy, m, blocks)
        elif kind == "finish" and m.running:
            before = set(m.cached)
            naive.order += [b for b in _finish(policy, m, arg) if b not in before]
        elif kind == "evict":
            assert policy.evict(arg) == naive.evict(arg, m)
            m.cached.intersection_update(naive.order)
    while m.running:
        naive.order += [b for b in _finish(policy, m, 0) if b not in naive.order]
    assert policy.evict(len(naive.order) + 1) == naive.evict(len(naive.order) + 1, m)


@pytest.mark.parametrize("name", agent_policies.names())
@settings(max_examples=40, deadline=None)
@given(
    cached=st.lists(st.integers(0, 7), max_size=6), touched=st.lists(st.integers(0, 15), max_size=6)
)
def test_a_touch_of_an_uncached_block_is_held_counted_and_let_go_whole(
    name: str, cached: list[int], touched: list[int]
) -> None:
    """A touched block the policy did not hold neither raises nor leaks, and counts from
    the touch on: ``fifo`` once held such a block without counting it (``len`` short,
    ``in`` saying no until its free)."""
    policy = agent_policies.create(name, 8)
    cached = list(dict.fromkeys(cached))
    policy.free(cached, range(len(cached)), 0.0, 0)
    touched = list(dict.fromkeys(touched))
    policy.touch(touched, 1.0)
    held = set(cached) | set(touched)
    assert len(policy) == len(held)
    assert all(b in policy for b in held)
    victims = policy.evict(len(held))
    assert not set(victims) & set(touched)
    policy.free(touched[::-1], range(len(touched)), 2.0, 0)
    assert len(policy) == len(held) - len(victims)
    rest = policy.evict(len(held) + 1)
    assert sorted(victims + rest) == sorted(held)
    assert len(policy) == 0
    assert not any(b in policy for b in held)


# -- names ------------------------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(name=st.text(min_size=1, max_size=12))
def test_unknown_names_list_the_known_ones(name: str) -> None:
    trace = Trace.from_requests([[1]])
    if name in catalog.names():
        return
    with pytest.raises(UnknownPolicyError) as agent_err:
        agent_policies.create(name, 4)
    with pytest.raises(UnknownPolicyError) as replay_err:
        catalog.create(name, 4, trace)
    for err, known in ((agent_err, agent_policies.names()), (replay_err, catalog.names())):
        assert err.value.known == known
        for k in known:
            assert repr(name) in str(err.value) and k in str(err.value)


def test_baselines_are_registered() -> None:
    assert {"lru", "fifo", "lfu", "s3fifo", "sieve", "arc"} <= set(agent_policies.names())
    assert {"belady", "inf"} <= set(catalog.names())


DISCARDS = [n for n in agent_policies.names() if isinstance(agent_policies.create(n, 8), Discards)]


def test_the_default_evictor_and_vllms_order_can_discard() -> None:
    assert {"wa", "lru"} <= set(DISCARDS)


@pytest.mark.parametrize("name", DISCARDS)
def test_a_discarded_block_is_held_no_more_and_freed_again_is_a_new_block(name: str) -> None:
    """``Discards`` (the engine dropped the blocks' content): an evictable block and one in
    use leave the policy, an unknown one is ignored; freed again, a block is evictable as
    any new one, and nothing discarded is ever a victim."""
    policy = agent_policies.create(name, 8)
    policy.free([1, 2, 3, 4], [3, 2, 1, 0], 1.0, 0)
    policy.touch([4], 2.0)
    policy.discard([2, 4, 9])
    assert 2 not in policy and 4 not in policy and 9 not in policy and len(policy) == 2
    policy.free([2], [0], 3.0, 0)
    assert 2 in policy and len(policy) == 3
    assert sorted(policy.evict(8)) == [1, 2, 3] and len(policy) == 0


def test_wa_by_creator_files_a_discarded_block_stored_again_by_its_new_creator() -> None:
    policy = WAPolicy(8, category_names=["x", "y"], attribution="creator")
    x, y = policy.add_category("x"), policy.add_category("y")
    policy.free([5], [0], 1.0, x)
    policy.discard([5])
    policy.free([5], [0], 2.0, y)
    policy.free([5], [0], 3.0, x)  # a hit by x: the creator, y, keeps it
    assert policy._creator == {5: y}

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
- A policy that ``Discards`` (every agent policy) lets blocks go, evictable or in use,
  and takes one freed again as a new block: with discards among the live calls, no
  discarded block is a victim or counted by ``len`` and ``in``, and the victims are those
  of a twin policy to which each discarded block, freed again, is a block never seen
  (so no ghost, count, frequency or stale queue entry of the old one is left).
- Unknown names fail with the list of known ones.
"""

from __future__ import annotations

from collections.abc import Sequence
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
    _play(agent_policies.create(name, capacity), script)


def _play(policy: agent_policies.EvictionPolicy, script: list[Op]) -> None:
    """``script``'s calls as vLLM's pool makes them (a discarded block is no longer cached;
    one in use stays in use until its request frees it, which caches it again), ``len``
    and ``in`` checked after each; then the drain: every request finishes, and the whole
    cache must come out."""
    m = Model()
    for kind, arg, blocks in script:
        m.clock += 1.0
        if kind == "start":
            _start(policy, m, blocks)
        elif kind == "finish" and m.running:
            _finish(policy, m, arg)
        elif kind == "evict":
            _evict(policy, m, arg)
        elif kind == "discard":
            assert isinstance(policy, Discards)
            if arg and m.cached:
                cached = sorted(m.cached)
                blocks = [cached[i % len(cached)] for i in blocks]
            policy.discard(blocks)
            m.cached.difference_update(blocks)
        assert len(policy) == len(m.cached)
        for b in range(16):
            assert (b in policy) == (b in m.cached), b
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


def test_every_agent_policy_can_discard() -> None:
    """The vLLM queue lets a block whose content the engine dropped go (``Discards``)
    instead of holding it as in use, whichever family the fleet selects."""
    assert agent_policies.names() == DISCARDS


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


discard_ops = st.lists(
    st.one_of(
        st.tuples(st.just("start"), st.just(0), st.lists(st.integers(0, 15), max_size=5)),
        st.tuples(st.just("finish"), st.integers(0, 7), st.just([])),
        st.tuples(st.just("evict"), st.integers(0, 6), st.just([])),
        # Blocks named by id (0: held or not), or by rank among the cached blocks (1).
        st.tuples(st.just("discard"), st.integers(0, 1), st.lists(st.integers(0, 15), max_size=4)),
    ),
    max_size=60,
)


class Twins:
    """One policy driven with the live calls' block ids, and a twin driven with the same
    calls, except that a block discarded while held is renamed from then on (a fresh id,
    never seen). Every call goes to both; their victims, ``len`` and ``in`` must agree
    under the renaming."""

    def __init__(self, name: str, capacity: int) -> None:
        self.policy = agent_policies.create(name, capacity)
        self.twin = agent_policies.create(name, capacity)
        self.alias: dict[int, int] = {}  # block id -> the twin's id for it now
        self.fresh = 1000

    def _ids(self, blocks: Sequence[int]) -> list[int]:
        return [self.alias.get(b, b) for b in blocks]

    def touch(self, blocks: Sequence[int], now: float) -> None:
        self.policy.touch(blocks, now)
        self.twin.touch(self._ids(blocks), now)

    def free(
        self, blocks: Sequence[int], offsets: Sequence[int], now: float, category: int
    ) -> None:
        self.policy.free(blocks, offsets, now, category)
        self.twin.free(self._ids(blocks), offsets, now, category)

    def discard(self, blocks: Sequence[int]) -> None:
        policy, twin = self.policy, self.twin
        assert isinstance(policy, Discards) and isinstance(twin, Discards)
        held = [b for b in blocks if b in policy]
        policy.discard(blocks)
        twin.discard(self._ids(blocks))
        for b in held:  # from now on, the twin knows this block by a new id
            self.fresh += 1
            self.alias[b] = self.fresh

    def evict(self, n: int) -> list[int]:
        victims = self.policy.evict(n)
        assert self.twin.evict(n) == self._ids(victims), "a discarded block left a trace"
        return victims

    def __len__(self) -> int:
        assert len(self.policy) == len(self.twin)
        return len(self.policy)

    def __contains__(self, block: object) -> bool:
        held = block in self.policy
        twin_id = self.alias.get(block, block) if isinstance(block, int) else block
        assert (twin_id in self.twin) == held, block
        return held


@pytest.mark.parametrize("name", DISCARDS)
@settings(max_examples=80, deadline=None)
@given(script=discard_ops, capacity=st.integers(1, 12))
def test_discarded_blocks_are_never_victims_and_come_back_as_new_ones(
    name: str, script: list[Op], capacity: int
) -> None:
    """Live calls with discards: no discarded block is a victim, ``len`` and ``in`` count
    none (``_play``), and a twin that knows each one, once discarded, by a new id evicts
    the same blocks."""
    _play(Twins(name, capacity), script)


PLACES: list[Op] = [
    ("start", 0, [5, 4, 3, 2, 1, 0]),
    ("finish", 0, []),
    ("start", 0, [0, 2]),
    ("start", 0, [3]),
    ("finish", 0, []),
    ("evict", 2, []),
    ("start", 0, [1, 4, 6]),
    ("finish", 0, []),
    ("evict", 1, []),
    ("start", 0, [0, 5, 7]),
    ("evict", 2, []),
    ("finish", 1, []),
    ("finish", 0, []),
    ("evict", 3, []),
    ("start", 0, [2, 6, 0, 8]),
    ("finish", 0, []),
    ("evict", 2, []),
]
"""Calls that leave blocks in each place a policy keeps them: ahead of and behind a hand,
parked in use, parked and freed again, in ``small`` and ``main``, in ``t1`` and ``t2``, in
several frequency buckets; random scripts rarely reach some of them."""


@pytest.mark.parametrize("name", DISCARDS)
def test_a_block_discarded_wherever_it_sits_leaves_no_trace(name: str) -> None:
    """Each block, discarded after each call of ``PLACES`` and named again by the calls
    after it: the same checks as for random scripts (``_play``, ``Twins``)."""
    for k in range(len(PLACES) + 1):
        for b in range(9):
            _play(Twins(name, 6), [*PLACES[:k], ("discard", 0, [b]), *PLACES[k:]])


def test_sieves_hand_wraps_when_the_newest_block_it_was_on_is_discarded() -> None:
    """As when it evicts the newest block, the hand goes back to the oldest: a block
    inserted after the discard is the newest, not the next one the hand looks at."""
    policy = agent_policies.create("sieve", 8)
    policy.free([1, 2, 3, 4], range(4), 0.0, 0)
    policy.touch([1, 2], 1.0)
    policy.free([1, 2], range(2), 2.0, 0)
    assert policy.evict(1) == [3]  # 1 and 2 lose their bits; the hand stops on 4
    policy.discard([4])
    policy.free([5], [0], 3.0, 0)
    assert policy.evict(3) == [1, 2, 5]


def test_wa_by_creator_files_a_discarded_block_stored_again_by_its_new_creator() -> None:
    policy = WAPolicy(8, category_names=["x", "y"], attribution="creator")
    x, y = policy.add_category("x"), policy.add_category("y")
    policy.free([5], [0], 1.0, x)
    policy.discard([5])
    policy.free([5], [0], 2.0, y)
    policy.free([5], [0], 3.0, x)  # a hit by x: the creator, y, keeps it
    assert policy._creator == {5: y}

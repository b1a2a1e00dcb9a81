"""Superseded branches on the live path: ``KvwiseFreeQueue`` (its ``SupersededBranches``)
over the real ``wa`` evictor, driven as vLLM drives it (``tests.superseded_engine``),
against the replay's ``BranchTracker`` (``controlplane.replay.superseded``) on the same
requests; the document's ``supersede`` switch."""

from __future__ import annotations

import random
from collections import OrderedDict

import pytest
from pydantic import ValidationError

from agent.policies import EvictionPolicy, create
from agent.policy_document import BUILTIN_POLICY, DEFAULT_SUPERSEDE, PolicyDocument
from agent.wire import decode_policy, encode_policy
from controlplane.replay.superseded import BranchTracker, LastAccess
from tests.superseded_engine import PrefixEngine
from tests.unit.test_replay_superseded import _replacing_trace, _trace


class ReplayedBranches:
    """The replay's rule on the same requests: ``BranchTracker`` marks, and the victims
    ``SupersedingReplayPolicy`` would take, told by the engine which content is cached.
    Marks of a request count from the next request's evictions on: vLLM allocates a
    request's blocks before it stores them, so that is when the queue learns of them."""

    def __init__(self, prompts: list[list[int]]) -> None:
        self.trace = _trace(prompts)  # content ids dense from 0: kept as they are
        self.last = LastAccess()
        self.tracker = BranchTracker(self.trace, self.last)
        self.superseded: OrderedDict[int, int] = OrderedDict()

    def arrive(self, request: int) -> list[int]:
        """Request ``request`` arrives: its blocks are accessed; returns what it
        supersedes (marked with ``mark``, after its evictions)."""
        blocks = self.trace.request_blocks(request).tolist()
        marked = list(self.tracker.arrive(request, blocks))
        self.last.accessed(request, blocks)
        return marked

    def mark(self, request: int, marked: list[int]) -> None:
        for block in reversed(marked):
            self.superseded.pop(block, None)
            self.superseded[block] = request

    def victims(self, n: int, cached: set[int]) -> list[int]:
        """As ``SupersedingReplayPolicy._superseded_victims``, ``cached`` standing for
        ``block in wa``."""
        victims: list[int] = []
        while self.superseded and len(victims) < n:
            block, by = self.superseded.popitem(last=False)
            if block in cached and self.last.untouched_since(block, by):
                victims.append(block)
        return victims


def forking_chats(seed: int, requests: int, *, retries: bool) -> list[list[int]]:
    """Synthetic conversations, eight open at a time, each on one of three two-block
    system prompts: a turn adds one or two blocks to the last prompt, or (one in three)
    regenerates, replacing the last turn's one to three blocks, or (with ``retries``, one
    in ten each) sends the last prompt again, or the one before it; a conversation ends
    after four to twelve turns. Content ids are dense from 0 (the trace keeps them as they are)."""
    rng = random.Random(seed)
    fresh = iter(range(1 << 30))
    systems = [[next(fresh), next(fresh)] for _ in range(3)]
    open_chats: list[tuple[list[int], int, int]] = []  # (last prompt, last turn's size, turns left)
    prompts: list[list[int]] = []
    while len(prompts) < requests:
        while len(open_chats) < 8:
            open_chats.append((list(rng.choice(systems)), 0, rng.randint(4, 12)))
        i = rng.randrange(len(open_chats))
        last, size, left = open_chats[i]
        if retries and size and rng.random() < 0.2:
            prompts.append(last if rng.random() < 0.5 else last[:-size])
            continue
        base = last[:-size] if size and rng.random() < 1 / 3 else last  # regenerate
        size = rng.randint(1, 3) if base is not last else rng.randint(1, 2)
        prompt = base + [next(fresh) for _ in range(size)]
        prompts.append(prompt)
        if left > 1:
            open_chats[i] = (prompt, size, left - 1)
        else:
            open_chats.pop(i)
    return dense(prompts)


def dense(prompts: list[list[int]]) -> list[list[int]]:
    """``prompts`` with content renumbered 0.. in order of first appearance (as the
    trace's own ids are)."""
    ids: dict[int, int] = {}
    return [[ids.setdefault(c, len(ids)) for c in p] for p in prompts]


def test_the_queue_marks_what_the_replay_tree_rule_supersedes() -> None:
    """The replay's tree examples, on the live queue: the blocks a request leaves behind
    at a first parting, nothing at a fan-out point or past a leaf."""
    prompts = [[1, 2, 3, 4], [1, 2, 5, 6], [1, 2, 7], [1, 2, 5, 6, 8], [1, 2, 5, 9]]
    engine = PrefixEngine(64, "tree")
    marked = []
    for prompt in prompts:
        before = set(pending(engine))
        engine.run(prompt)
        marked.append([c for c in pending(engine) if c not in before])
    assert marked == [[], [4, 3], [], [], [8, 6]]  # tail first: the oldest mark first


def pending(engine: PrefixEngine) -> list[int]:
    """The content the queue holds superseded, cached and untouched, oldest first."""
    branches = engine.queue.branches
    assert branches is not None
    return [c for b in branches.pending() if (c := engine.content(b)) is not None]


@pytest.mark.parametrize("partial_tails", [False, True])
@pytest.mark.parametrize("seed", [7, 2028])
def test_live_superseded_victims_equal_the_replay_rules(seed: int, partial_tails: bool) -> None:
    """Request by request, the queue evicts first exactly the superseded blocks the
    replay's rule would, in its order, then ``wa``'s own; and where the queue has no
    eviction to make, it holds the same marks. The cache is large enough that no prefix
    a request follows was evicted (then the engine sees fewer blocks than the replay:
    ``test_what_left_the_cache_is_forgotten``). With ``partial_tails``, a prompt's last
    block may be a hit (its partial tail is never stored), as in the replay, and prompts
    are sent again; without, a prompt's last block is always computed, so none is sent
    again (that makes a copy: ``test_a_copy_is_new_content``)."""
    prompts = forking_chats(seed, 1500, retries=partial_tails)
    engine = PrefixEngine(160, "tree", partial_tails=partial_tails)
    replay = ReplayedBranches(prompts)
    demoted = 0
    for request, prompt in enumerate(prompts):
        cached, seen = set(engine.holders), replay.last.seen(prompt)
        marked = replay.arrive(request)
        most = len(prompt) if partial_tails else len(prompt) - 1
        assert engine.run(prompt) == min(seen, most), request  # nothing lost
        expected = replay.victims(len(engine.evicted), cached)
        assert engine.evicted[: len(expected)] == expected, request
        replay.mark(request, marked)
        demoted += len(expected)
        untouched = [c for c, by in replay.superseded.items() if replay.last.untouched_since(c, by)]
        assert pending(engine) == [c for c in untouched if c in engine.holders], request
    assert demoted > 300, demoted  # the comparison covered many demotions


def test_a_branch_ends_where_its_last_request_ended() -> None:
    """The branch superseded is the last request's through the child left, as far as that
    request went: a shorter prompt on an older path ends it there (prompts ending in a
    partial block, so every full block may be a hit)."""
    prompts = [[0, 1, 2, 3], [0, 1, 2], [0, 4]]
    engine, replay = PrefixEngine(16, "tree", partial_tails=True), ReplayedBranches(prompts)
    for request, prompt in enumerate(prompts):
        replay.mark(request, replay.arrive(request))
        engine.run(prompt)
    assert list(replay.superseded) == [2, 1]  # not 3: request 1 ended at 2
    assert pending(engine) == [2, 1]


def test_a_branch_superseded_again_keeps_its_first_place() -> None:
    """Where the queue differs from the replay by choice: a parting whose old branch is
    still marked (superseded before, untouched since) marks nothing again, so those
    blocks keep the place of their first supersession; the replay moves them behind the
    marks made since. Each block is walked once per access, whatever the branch's depth
    (O(1) per block, amortized), where re-marking would walk a deep branch again at each
    fork above it."""
    prompts = [[0, 1, 2, 3, 4], [0, 5], [6, 7, 8], [6, 9], [0, 1, 2, 10]]
    engine, replay = PrefixEngine(32, "tree"), ReplayedBranches(prompts)
    for request, prompt in enumerate(prompts):
        replay.mark(request, replay.arrive(request))
        engine.run(prompt)
    assert pending(engine) == [4, 3, 8, 7]  # 3 and 4 where request 1 marked them
    untouched = [c for c, by in replay.superseded.items() if replay.last.untouched_since(c, by)]
    assert untouched == [8, 7, 4, 3]  # request 4 moved them behind request 3's marks


def test_what_left_the_cache_is_forgotten() -> None:
    """Where the live path knows less than the replay: a block evicted takes its links and
    marks along. A branch evicted before a parting is not marked (the replay marks it,
    cached or not), and a fork evicted and computed again is a new block that no branch
    has left yet (the replay, which never forgets, knows it as a fan-out point)."""
    engine = PrefixEngine(7, "tree")  # six usable blocks
    engine.run([1, 2, 3])
    engine.run([4, 5, 6])
    engine.run([7, 8])  # evicts 3 then 2: wa's order, oldest first, tail first
    assert engine.evicted == [3, 2]
    engine.run([1, 2, 9])  # 1 then a new 2: the replay marks 3 and has parted at 2
    assert pending(engine) == []
    engine.run([1, 2, 10])  # leaves the new 2's child 9: the first parting at the new 2
    assert pending(engine) == [9]


@pytest.mark.parametrize("evictor", ["wa", "device"])
def test_the_live_queue_keeps_the_replays_gain(evictor: str) -> None:
    """The replay test's conversations that replace part of each prompt (synthetic,
    ``test_wa_superseded_keeps_slow_conversations_over_quick_ones_dead_branches``) on a
    150-block queue over ``wa``, or the torch ``wa`` on the CPU: 432 hits of 2,146
    accesses without the rule (the replay's ``wa``: 432), 718 with it (the replay's
    ``wa-superseded``: 768; the queue learns a request's marks only once its blocks are
    allocated)."""
    trace = _replacing_trace()
    prompts = [trace.request_blocks(r).tolist() for r in range(trace.n_requests)]
    hits = {}
    for rule in ("off", "tree"):
        engine = PrefixEngine(151, rule, evictor_of(evictor, 151))  # and the null block
        for prompt in prompts:
            engine.run(prompt)
        hits[rule] = engine.hits
    assert hits == {"off": 432, "tree": 718}


def evictor_of(name: str, n: int) -> EvictionPolicy:
    """A registered evictor of ``n`` blocks, or ``device``: the torch ``wa`` on the CPU
    (the test skipped without torch)."""
    if name != "device":
        return create(name, n)
    device_evictor = pytest.importorskip("agent.device_evictor")
    return device_evictor.DeviceEvictor(n, device="cpu")


def test_a_copy_is_new_content() -> None:
    """vLLM computes a block-aligned prompt's last block again, cached or not, into a
    second block. The copy is new content to the queue: a mark on the older copy stays
    (the replay, by content, counts the copy as an access of it), and the copy, the
    latest child, holds the branch on. Demoting the marked copy loses nothing: another
    block holds the same content."""
    engine = PrefixEngine(16, "tree")
    engine.run([0, 1, 2])
    engine.run([0, 5])
    assert pending(engine) == [2, 1]
    engine.run([0, 1, 2])  # 1 a hit, 2 a copy: both accessed again, as in the replay
    assert len(engine.holders[2]) == 2 and pending(engine) == []
    engine.run([0, 1, 11])  # parts at 1: the latest child, the copy, is superseded
    engine.run([0, 1, 2])  # a third copy; the replay would unmark 2 here
    assert pending(engine) == [2] and len(engine.holders[2]) == 3


def test_turned_off_or_under_a_baseline_the_queue_evicts_in_the_evictors_order() -> None:
    prompts = [[10, 11], [1, 2, 3, 4], [1, 2, 5, 6]]  # 4, 3 superseded; 11 the oldest
    for rule, evictor, first in (("tree", "wa", 4), ("off", "wa", 11), ("tree", "lru", 11)):
        engine = PrefixEngine(9, rule, evictor)  # eight usable blocks, all used
        for prompt in prompts:
            engine.run(prompt)
        engine.run([7])
        assert engine.evicted == [first], (rule, evictor)
        assert (engine.queue.branches is not None) == (first == 4)


def test_a_family_switch_takes_the_rule_along_only_under_wa() -> None:
    engine = PrefixEngine(9, "tree")
    queue = engine.queue
    queue.switch_evictor(create("lru", 9))
    assert queue.branches is None  # a baseline runs its own order
    queue.switch_evictor(create("wa", 9))
    engine.run([1, 2, 3])
    engine.run([1, 4])  # tracked again from the switch on
    assert pending(engine) == [3, 2]


def test_the_rule_switches_with_the_document_in_force() -> None:
    engine = PrefixEngine(9, "tree")
    engine.run([1, 2, 3, 4])
    engine.queue.set_supersede("off")
    engine.queue.set_supersede("tree")  # on again: tracking starts afresh
    engine.run([1, 2, 5, 6])  # nothing known of 2's child: nothing superseded
    assert pending(engine) == []
    engine.queue.set_supersede("tree")  # a document that leaves it on keeps the marks
    engine.run([1, 7])
    assert pending(engine) == [6, 5, 2]


def test_the_document_names_the_rule_and_refuses_others_by_name() -> None:
    assert BUILTIN_POLICY.supersede == DEFAULT_SUPERSEDE
    with pytest.raises(ValidationError, match=r"supersede\n.*'tree' or 'off'"):
        PolicyDocument(version=1, supersede="chat")  # type: ignore[arg-type]
    other = "off" if DEFAULT_SUPERSEDE == "tree" else "tree"
    doc = PolicyDocument(version=2, supersede=other)
    assert decode_policy(encode_policy(doc)).supersede == other
    assert b"supersede" in encode_policy(doc)
    assert b"supersede" not in encode_policy(PolicyDocument(version=3))  # older agents read it

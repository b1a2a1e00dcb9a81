"""Superseded branches in SGLang's real ``RadixCache`` (sglang 0.5.23, CPU), through the
``kvwise`` backend: the document's ``supersede`` rule (``tree``) on the tree's own nodes
(``RadixOrder``), against the replay's ``BranchTracker`` on the same requests, and its
switch (``off``: ``wa``'s own order). Runs where tests/integration/test_sglang_radix.py
runs (``KVWISE_TEST_SGLANG=1``, the SGLang virtualenv)."""

from __future__ import annotations

from typing import Any

import pytest

from controlplane.replay.superseded import BranchTracker
from tests.integration import test_sglang_radix as radix
from tests.integration.test_sglang_radix import SIZE, Tree, check_tree, evict_checked, serve
from tests.unit.test_superseded_branches import ReplayedBranches, forking_chats

sg, tree = radix.sg, radix.tree  # the real-SGLang fixtures

pytestmark = radix.pytestmark

B = 4
"""Tokens per block of the replay's content: block ``c`` is tokens ``c*B+1 .. c*B+B``."""


def tokens_of(blocks: list[int]) -> list[int]:
    return [c * B + 1 + i for c in blocks for i in range(B)]


def blocks_of(t: Tree, nodes: list[Any]) -> list[int]:
    """The replay blocks the nodes hold, each node's tail first (whole blocks only)."""
    out: list[int] = []
    for node in nodes:
        ids = node.key.raw_token_ids()
        assert len(ids) % B == 0 and ids[0] % B == 1, "a node cut inside a block"
        out += [(tok - 1) // B for tok in ids[::B]][::-1]
    return out


def doc_with(t: Tree, rule: str) -> None:
    """Put in force the document in force with ``supersede`` at ``rule``, as the agent does
    (its order's ``set_policy``)."""
    order = t.hooks.order
    t.hooks.engine.order.set_policy(order.policy.model_copy(update={"supersede": rule}))
    assert order.supersede == rule


@pytest.mark.parametrize("rule", ["tree", "off"])
def test_a_parting_s_old_branch_is_evicted_first_only_under_tree(tree: Tree, rule: str) -> None:
    """A request that hits a cached system prompt and leaves the branch after it
    supersedes that branch: the next eviction takes it before an older leaf (``tree``);
    with the rule off, ``wa``'s own order takes the older leaf first."""
    doc_with(tree, rule)
    system = list(range(1, 33))
    old = system + list(range(100, 132))
    new = system + list(range(200, 232))
    other = list(range(300, 332))
    serve(tree, other, "chat")  # the oldest leaf
    serve(tree, old, "chat")
    assert serve(tree, new, "chat")[0] == len(system)  # hits the prompt, parts there
    marked = tree.hooks.order.superseded()
    assert [len(n.key) for n in marked] == ([32] if rule == "tree" else [])
    victims = evict_checked(tree, 32)
    first = list(victims[0].key.raw_token_ids())
    assert first == (old[32:] if rule == "tree" else other)
    check_tree(tree, [])


def test_a_fan_out_point_and_a_leaf_extended_supersede_nothing(tree: Tree) -> None:
    """Only the first parting at a node supersedes (a shared prompt many conversations
    leave is a fan-out point), and a request that extends a leaf leaves nothing behind;
    a node hit again is no longer superseded ("untouched since")."""
    order = tree.hooks.order
    serve(tree, tokens_of([0, 1, 2]), None)
    serve(tree, tokens_of([0, 1, 3]), None)  # first parting at 1: 2 superseded
    assert blocks_of(tree, order.superseded()) == [2]
    serve(tree, tokens_of([0, 1, 4]), None)  # 1 parted before: a fan-out point
    assert blocks_of(tree, order.superseded()) == [2]
    serve(tree, tokens_of([0, 1, 3, 5]), None)  # extends the leaf 3
    assert blocks_of(tree, order.superseded()) == [2]
    serve(tree, tokens_of([0, 1, 2]), None)  # 2 hit again
    assert order.superseded() == []


def test_a_branch_ends_where_its_last_request_ended(tree: Tree) -> None:
    """The branch superseded is the last request's path from the child left, as far as
    that request went (the replay's example: 2 and 1, not 3; the tree splits the first
    node where the second request's prompt ends, and again where the third parts)."""
    prompts = [[0, 1, 2, 3], [0, 1, 2], [0, 4]]
    replay = ReplayedBranches(prompts)
    for request, prompt in enumerate(prompts):
        replay.mark(request, replay.arrive(request))
        serve(tree, tokens_of(prompt), None)
    assert list(replay.superseded) == [2, 1]
    assert blocks_of(tree, tree.hooks.order.superseded()) == [2, 1]


def test_a_superseded_node_waits_for_its_children(tree: Tree) -> None:
    """Where the tree differs from the replay and from vLLM: it evicts leaves only, so a
    superseded node whose older child the branch did not go through waits until that
    child is evicted in ``wa``'s order; the replay (and vLLM's queue) takes it at once."""
    prompts = [[0, 1, 2, 3], [0, 1, 2, 4], [0, 1, 2, 3], [0, 1, 5]]
    replay = ReplayedBranches(prompts)
    for request, prompt in enumerate(prompts):
        replay.mark(request, replay.arrive(request))
        serve(tree, tokens_of(prompt), None)
    assert blocks_of(tree, tree.hooks.order.superseded()) == [3, 2]
    assert replay.victims(3, {c for p in prompts for c in p}) == [3, 2]
    victims = evict_checked(tree, 3 * B)
    assert blocks_of(tree, victims) == [3, 4, 2]  # 4, an older child of 2, first


@pytest.mark.parametrize("seed", [7, 2028])
def test_superseded_nodes_equal_the_replay_tree_rule(tree: Tree, seed: int) -> None:
    """Request by request, on synthetic forking conversations (blocks of ``B`` tokens,
    nothing evicted), the nodes marked superseded and untouched hold exactly the blocks
    the replay's ``BranchTracker`` marks and has not seen accessed since; then one pass
    evicting that much takes exactly the replay's victims, in its order. The tree parts
    exactly at block boundaries here (each block's tokens are its own), so node
    granularity loses nothing. Where they may differ (not met on these two traces): a
    branch superseded again while still marked keeps its first place (the replay moves
    it back), and a superseded node waits for its children, which the replay's blocks
    do not (the tree evicts leaves only)."""
    prompts = forking_chats(seed, 300, retries=True)
    assert len({c for p in prompts for c in p}) * B <= SIZE  # no eviction
    assert isinstance(ReplayedBranches(prompts[:1]).tracker, BranchTracker)
    replay = ReplayedBranches(prompts)
    order = tree.hooks.order
    marks = 0
    for request, prompt in enumerate(prompts):
        marked = replay.arrive(request)
        replay.mark(request, marked)
        marks += bool(marked)
        serve(tree, tokens_of(prompt), None)
        live = blocks_of(tree, order.superseded())
        untouched = [c for c, by in replay.superseded.items() if replay.last.untouched_since(c, by)]
        assert sorted(live) == sorted(untouched), request
        assert len(live) == len(set(live)), request
    assert marks > 30, marks  # the comparison covered many partings
    # Then one eviction pass of as many tokens: the victims, in order, are the replay's
    # (``SupersedingReplayPolicy``'s first victims, everything being cached).
    expected = replay.victims(len(live), {c for p in prompts for c in p})
    assert blocks_of(tree, evict_checked(tree, len(live) * B)) == expected
    check_tree(tree, [])


def test_the_rule_follows_the_document_in_force(tree: Tree) -> None:
    """``off`` drops every mark and link at once; ``tree`` again starts afresh (the links
    and partings walked before are not known); a document that leaves it on keeps the
    marks."""
    order = tree.hooks.order
    serve(tree, tokens_of([0, 1, 2, 3]), None)
    serve(tree, tokens_of([0, 1, 4]), None)
    assert blocks_of(tree, order.superseded()) == [3, 2]
    doc_with(tree, "off")
    assert order.superseded() == []
    serve(tree, tokens_of([0, 1, 9]), None)  # not tracked
    doc_with(tree, "tree")
    serve(tree, tokens_of([0, 1, 5]), None)  # [0, 1]'s latest child unknown: nothing
    assert order.superseded() == []
    serve(tree, tokens_of([0, 1, 6]), None)  # the first parting there since: 5
    doc_with(tree, "tree")
    assert blocks_of(tree, order.superseded()) == [5]
    check_tree(tree, [])

"""``RadixOrder`` against the CPU ``wa`` evictor on the same state, its side table, and the
content ids of radix-tree nodes. ``Node`` stands for SGLang's ``TreeNode`` (the real tree
runs in tests/integration/test_sglang_radix.py)."""

from __future__ import annotations

import math
import random

import pytest

from agent.integrations.radix_order import RadixOrder, path_ids, prompt_block_hashes
from agent.policy_document import BUILTIN_POLICY, CategoryParams, PolicyDocument
from tests.policy_samples import unchecked
from tests.radix_reference import Leaf, wa_first

NAMES = ("chat", "doc", "code", "agent")


class Node:
    def __init__(self, t: float) -> None:
        self.last_access_time = t


def random_doc(rng: random.Random, version: int) -> PolicyDocument:
    cats = {
        name: CategoryParams(
            rate=rng.choice([0.01, 0.1, 1.0, 5.0]),
            p_reuse=rng.choice([0.0, 0.2, 0.5, 0.9, 1.0]),
            life_s=rng.choice([1.0, 30.0, 600.0]),
        )
        for name in rng.sample(NAMES, 3)
    }
    return PolicyDocument(version=version, categories=cats)


def test_the_first_victim_is_always_wa_s() -> None:
    rng = random.Random(7)
    for trial in range(300):
        order = RadixOrder()
        for name in NAMES:
            order.add_category(name)
        doc = BUILTIN_POLICY if trial % 5 == 0 else random_doc(rng, trial + 1)
        order.set_policy(doc)
        leaves = []
        for _ in range(rng.randint(1, 30)):
            # Few distinct times and depths: ties on every element of the key happen.
            node = Node(rng.choice([1.0, 2.0, 2.5, 10.0, 40.0]))
            code, depth = rng.randrange(len(NAMES)), rng.randrange(4)
            order.mark(node, code, depth, block=rng.getrandbits(63))
            mark = order.mark_of(node)
            assert mark is not None
            leaves.append(Leaf(node, code, node.last_access_time, depth, mark.seq))
        now = 50.0 + rng.random() * 100
        order.begin(now)
        ours = min(leaves, key=lambda leaf: order.get_priority(leaf.node))
        assert ours == wa_first(leaves, NAMES, doc, now), trial


def test_a_new_policy_changes_the_order_without_remarking_nodes() -> None:
    order = RadixOrder()
    chat, doc = order.add_category("chat"), order.add_category("doc")
    old_chat, new_doc = Node(1.0), Node(5.0)
    order.mark(old_chat, chat, 0, 11)
    order.mark(new_doc, doc, 0, 12)
    order.begin(10.0)
    assert order.get_priority(old_chat) < order.get_priority(new_doc)  # LRU: older first
    order.set_policy(
        PolicyDocument(version=3, categories={"doc": CategoryParams(rate=1, p_reuse=0, life_s=9)})
    )
    assert order.policy.version == 3
    assert order.get_priority(new_doc)[0] == -math.inf
    assert order.get_priority(new_doc) < order.get_priority(old_chat)
    assert len(order) == 2


@pytest.mark.parametrize(
    "refused",
    [
        {"categories": {"chat": unchecked(rate=-1.0, life_s=1000.0)}},
        {"categories": {"doc": unchecked(p_reuse=math.nan)}},
        {"categories": {"code": unchecked(rate=-1.0, life_s=1000.0)}},
        {"default": unchecked(rate=math.inf)},
    ],
    ids=["named-overflows", "named-nan", "not-yet-named", "default"],
)
def test_a_document_refused_by_set_policy_leaves_the_order_as_it_was(
    refused: dict[str, object],
) -> None:
    """``set_policy`` replaced the document before working out its constants: one that
    failed partway left the new document in force on the old constants (or ordered by
    NaN, or raised later, in ``add_category`` or ``get_priority`` on the engine's thread).
    Every constant is now worked out first: a refusal changes nothing."""
    good = PolicyDocument(
        version=2, categories={"chat": CategoryParams(rate=1, p_reuse=1, life_s=9)}
    )
    order = RadixOrder(good)
    nodes = [Node(1.0), Node(2.0), Node(3.0)]
    for code, node in enumerate(nodes[:2]):
        order.mark(node, order.add_category(("chat", "doc")[code]), 0, code + 1)
    order.begin(10.0)
    before = [order.get_priority(node) for node in nodes]
    with pytest.raises(ValueError, match=r"category|default curve"):
        order.set_policy(PolicyDocument.model_construct(version=3, **refused))
    assert order.policy is good
    assert [order.get_priority(node) for node in nodes] == before
    order.mark(nodes[2], order.add_category("code"), 0, 3)
    assert order.get_priority(nodes[2])[0] == before[2][0]  # the default curve of ``good``


def test_ties_go_to_the_deeper_node_then_the_first_marked() -> None:
    order = RadixOrder()
    code = order.add_category("chat")
    top, deep, twin = Node(3.0), Node(3.0), Node(3.0)
    order.mark(top, code, 0, 1)
    order.mark(deep, code, 4, 2)
    order.mark(twin, code, 4, 3)
    order.begin(9.0)
    ranked = sorted([top, twin, deep], key=order.get_priority)
    assert ranked == [deep, twin, top]


def test_split_and_forget_keep_the_side_table_exact() -> None:
    order = RadixOrder()
    code = order.add_category("doc")
    lower, upper = Node(1.0), Node(1.0)
    order.mark(lower, code, 2, 99)
    order.split(upper, lower, 3)
    up, low = order.mark_of(upper), order.mark_of(lower)
    assert up is not None and low is not None
    assert (up.code, up.depth, up.block) == (code, 2, 0)  # id computed on demand
    assert (low.code, low.depth, low.block) == (code, 5, 99) and low.seq > up.seq
    assert order.blocks() == [99]
    assert order.forget(lower) is low and order.forget(lower) is None
    order.clear()
    assert len(order) == 0
    order.split(upper, Node(2.0), 1)  # a node never seen: nothing to inherit
    assert order.mark_of(upper) is None


def test_an_unmarked_node_ranks_on_the_default_curve() -> None:
    order = RadixOrder()
    stray, marked = Node(1.0), Node(1.0)
    order.mark(marked, order.add_category("chat"), 0, 5)
    order.begin(2.0)
    assert order.get_priority(stray)[:2] == order.get_priority(marked)[:2]
    with pytest.raises(TypeError):
        order.set_policy({"version": 2})  # type: ignore[arg-type]


def test_content_ids_follow_the_tokens_not_the_node_boundaries() -> None:
    a, b, c = (bytes([i]) * 16 for i in (1, 2, 3))
    whole = path_ids(b"", [a + b, c])
    split = path_ids(b"", [a, b, c])
    assert split[1] == whole[0] and split[2] == whole[1]  # a split keeps the lower id
    assert len(set(split)) == 3
    assert path_ids(b"", [a, b, c], last=2) == split[1:]
    assert path_ids(b"lora-x", [a + b]) != path_ids(b"", [a + b])  # namespaces differ
    hashes = prompt_block_hashes(a + b + c[:8], 16)
    assert len(hashes) == 2 and hashes[0] == prompt_block_hashes(a, 16)[0]
    assert prompt_block_hashes(b + b, 16)[1] != prompt_block_hashes(a + b, 16)[1]  # chained


class TreeNode(Node):
    """A node with its parent, as the superseded-branch rule reads it."""

    def __init__(self, t: float, parent: TreeNode | None) -> None:
        super().__init__(t)
        self.parent = parent


def test_a_superseded_node_keys_before_every_wa_key_until_accessed() -> None:
    """The tree rule's key: before a node of a category never reused (``-inf``), the
    oldest parting first; a hit ends it; under ``off`` nothing is superseded."""
    doc = PolicyDocument(
        version=2, categories={"doc": CategoryParams(rate=1.0, p_reuse=0.0, life_s=1.0)}
    )
    for rule in ("tree", "off"):
        order = RadixOrder(doc.model_copy(update={"supersede": rule}))
        never = order.add_category("doc")
        root_child = TreeNode(1.0, None)
        old, new, dead = TreeNode(2.0, root_child), TreeNode(3.0, root_child), TreeNode(0.5, None)
        order.mark(dead, never, 0, block=1)
        for node in (root_child, old):
            order.mark(node, 0, 0, block=2)
        order.walked([root_child, old])
        order.mark(new, 0, 1, block=3)
        assert order.stored(new, parting=True) == (1 if rule == "tree" else 0)
        order.begin(10.0)
        assert order.get_priority(dead)[0] == -math.inf
        first = min((dead, old, new), key=order.get_priority)
        assert first is (old if rule == "tree" else dead), rule
        assert order.superseded() == ([old] if rule == "tree" else [])
        order.mark(old, 0, 1, block=2)  # hit again
        assert order.superseded() == []

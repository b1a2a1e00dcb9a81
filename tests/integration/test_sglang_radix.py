"""kvwise inside SGLang's real ``RadixCache`` (sglang 0.5.23, CPU), built through the
``kvwise`` radix-cache backend the plugin registers, with a real token allocator, a real
Redis and a real controller.

Shows: (a) every eviction pass takes the victims the CPU ``wa`` evictor picks on the same
state (leaves, then parents left childless), after the superseded ones the document's
``supersede`` rule marked (oldest first), locked nodes are never evicted, and the
tree's own bookkeeping (sizes, evictable leaves, allocator slots) stays exact; (b) the
cache's hits, inserts and evictions reach the controller, which fits the requests'
categories; (c) a policy version pushed through the controller's REST API applies to the
same cache, without rebuilding it, and changes what it evicts.

Runs in the SGLang virtualenv (``.ci/stage_sglang.sh`` builds it and runs this module);
the README's plain ``pytest`` skips it unless ``KVWISE_TEST_SGLANG=1``.
"""

from __future__ import annotations

import logging
import os
import random
import re
import time
import uuid
from array import array
from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from agent.policy_document import BUILTIN_POLICY, CategoryParams, PolicyDocument
from tests.radix_reference import Leaf, wa_victims
from tests.waiting import wait_until

pytestmark = [
    pytest.mark.sglang,
    pytest.mark.integration,
    pytest.mark.skipif(
        os.environ.get("KVWISE_TEST_SGLANG") != "1",
        reason="real sglang: set KVWISE_TEST_SGLANG=1 (.ci/stage_sglang.sh does)",
    ),
]

SIZE = 2048
TOKEN = "sglang-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@dataclass(eq=False)
class Request:
    """The part of SGLang's ``Req`` the plugin reads: sampling params and prompt."""

    sampling_params: Any
    origin_input_ids: list[int]


@dataclass
class Tree:
    """A kvwise-backed ``RadixCache``, its allocator and the plugin's hooks."""

    cache: Any
    allocator: Any
    hooks: Any
    sg: Any
    victims: list[Any] = field(default_factory=list)


class SG:
    """The sglang names the tests use (imported only here: the module collects without)."""

    def __init__(self) -> None:
        import torch
        from sglang.srt.mem_cache import registry
        from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
        from sglang.srt.mem_cache.base_prefix_cache import (
            EvictParams,
            InsertParams,
            MatchPrefixParams,
        )
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey
        from sglang.srt.sampling.sampling_params import SamplingParams

        self.torch, self.registry = torch, registry
        self.Allocator, self.CacheInitParams = TokenToKVPoolAllocator, CacheInitParams
        self.EvictParams, self.InsertParams = EvictParams, InsertParams
        self.MatchPrefixParams, self.RadixKey = MatchPrefixParams, RadixKey
        self.RadixCache, self.SamplingParams = RadixCache, SamplingParams


@pytest.fixture(scope="module")
def sg() -> SG:
    return SG()


@pytest.fixture
def tree(
    sg: SG, redis_url: str, key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Tree]:
    from agent.integrations import sglang as plugin

    worker = f"sglang-{uuid.uuid4().hex[:6]}"
    for name, value in {
        "KVWISE_ENABLE": "1",
        "KVWISE_REDIS_URL": redis_url,
        "KVWISE_KEY_PREFIX": key_prefix,
        "KVWISE_WORKER_ID": worker,
        "KVWISE_POLL_INTERVAL_S": "0.2",
        "KVWISE_HEARTBEAT_INTERVAL_S": "0.2",
        "KVWISE_FLUSH_INTERVAL_S": "0.05",
    }.items():
        monkeypatch.setenv(name, value)
    cache = build_through_backend(sg)
    assert type(cache) is sg.RadixCache
    hooks = plugin.attached()
    assert hooks is not None and hooks.cache is cache
    assert cache.eviction_strategy is hooks.order
    t = Tree(cache, cache.token_to_kv_pool_allocator, hooks, sg)
    spy_on_victims(t)
    try:
        yield t
    finally:
        plugin.detach()


def build_through_backend(sg: SG) -> Any:
    """A radix cache as SGLang's ``create_tree_cache`` builds it for
    ``--radix-cache-backend kvwise`` (after its plugin loader ran ``register``)."""
    from agent.integrations import sglang as plugin

    plugin.register()  # idempotent
    factory = sg.registry.get_radix_cache_factory(plugin.BACKEND)
    assert factory is not None
    allocator = sg.Allocator(SIZE, sg.torch.int64, "cpu", None, False)
    params = sg.CacheInitParams(
        disable=False, req_to_token_pool=None, token_to_kv_pool_allocator=allocator, page_size=1
    )
    ctx = sg.registry.TreeCacheBuildContext(
        server_args=None,
        params=params,
        is_hybrid_swa=False,
        is_hybrid_ssm=False,
        enable_hierarchical_cache=False,
        disable_radix_cache=False,
        tp_worker=None,
        model_config=None,
        tp_size=1,
        tp_rank=0,
        tp_group=None,
    )
    return factory(ctx)


def spy_on_victims(t: Tree) -> None:
    """Record each node the tree deletes, in order, checking it was not locked."""
    inner = t.cache._delete_leaf

    def _delete_leaf(node: Any) -> Any:
        assert node.lock_ref == 0, "a locked node was evicted"
        t.victims.append(node)
        return inner(node)

    t.cache._delete_leaf = _delete_leaf


def test_off_switch_and_version_gate_keep_sglang_s_own_tree(
    sg: SG, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import sglang

    from agent.integrations import sglang as plugin

    monkeypatch.setenv("KVWISE_ENABLE", "0")
    monkeypatch.setenv("KVWISE_BUFFER_EVENTS", "lots")  # read only when kvwise is on
    cache = build_through_backend(sg)
    assert type(cache.eviction_strategy).__name__ == "LRUStrategy"
    assert plugin.attached() is None and "match_prefix" not in vars(cache)  # no wrapper
    monkeypatch.delenv("KVWISE_BUFFER_EVENTS")
    monkeypatch.setenv("KVWISE_ENABLE", "1")
    monkeypatch.setenv("KVWISE_REDIS_URL", "redis://127.0.0.1:1/0")
    monkeypatch.setattr(sglang, "__version__", "0.5.22")
    with caplog.at_level(logging.WARNING, logger="sglang.kvwise"):
        cache = build_through_backend(sg)
    assert "SGLang 0.5.22 is outside the tested range 0.5.23-0.5.24" in caplog.text
    assert type(cache.eviction_strategy).__name__ == "LRUStrategy"
    assert plugin.attached() is None and "match_prefix" not in vars(cache)


def request(t: Tree, tokens: list[int], category: str | None) -> Request:
    custom = {"kv_category": category} if category else None
    return Request(t.sg.SamplingParams(custom_params=custom), list(tokens))


def key(t: Tree, tokens: list[int]) -> Any:
    return t.sg.RadixKey(array("q", tokens))


def serve(t: Tree, tokens: list[int], category: str | None, *, hold: bool = False) -> Any:
    """One request as SGLang's scheduler drives the tree: match its prefix (lock it),
    allocate the rest (evicting when short), insert the whole sequence, free duplicates,
    unlock. Returns ``(matched tokens, lock held or None)``."""
    sg, cache = t.sg, t.cache
    req = request(t, tokens, category)
    m = cache.match_prefix(sg.MatchPrefixParams(key=key(t, tokens), req=req))
    last, matched = m.last_device_node, m.device_prefix_len
    cache.inc_lock_ref(last)
    new = allocate(t, len(tokens) - matched)
    value = sg.torch.cat([cache.path_device_indices(last), new])
    with t.hooks.serving(req):
        res = cache.insert(sg.InsertParams(key=key(t, tokens), value=value))
    if res.prefix_len > matched:  # inserted meanwhile: our copies are duplicates
        t.allocator.free(new[: res.prefix_len - matched])
    cache.dec_lock_ref(last)
    held = None
    if hold:
        held = cache.match_prefix(sg.MatchPrefixParams(key=key(t, tokens))).last_device_node
        cache.inc_lock_ref(held)
    return matched, held


def allocate(t: Tree, n: int) -> Any:
    short = n - t.allocator.available_size()
    if short > 0:
        evict_checked(t, short)
    got = t.allocator.alloc(n)
    assert got is not None, f"{n} slots wanted, {t.allocator.available_size()} free"
    return got


@dataclass(frozen=True)
class Snap:
    parent: Any
    children: tuple[Any, ...]
    lock_ref: int
    tokens: int
    leaf: Leaf | None


def snapshot(t: Tree) -> dict[Hashable, Snap]:
    """Every node of the tree with what the reference needs of it."""
    out: dict[Hashable, Snap] = {}
    order = t.hooks.order
    stack = list(t.cache.root_node.children.values())
    while stack:
        node = stack.pop()
        stack.extend(node.children.values())
        mark = order.mark_of(node)
        leaf = None
        if mark is not None:
            leaf = Leaf(node, mark.code, node.last_access_time, mark.depth, mark.seq)
        children = tuple(node.children.values())
        out[node] = Snap(node.parent, children, node.lock_ref, len(node.value), leaf)
    return out


def evict_checked(t: Tree, n: int) -> list[Any]:
    """Evict ``n`` tokens and check the victims against ``wa`` on the state before."""
    before = snapshot(t)
    candidates = []
    for node in t.cache.evictable_leaves:
        leaf = before[node].leaf
        assert leaf is not None, "an evictable node has no side-table row"
        candidates.append(leaf)
    order = t.hooks.order
    demoted = {}
    for node in order.superseded():
        mark = order.mark_of(node)
        assert mark is not None
        demoted[node] = (mark.by, mark.seq)
    t.victims.clear()
    t.cache.evict(t.sg.EvictParams(num_tokens=n))

    def parent_joins(victim: Hashable, gone: set[Hashable]) -> Leaf | None:
        parent = before[victim].parent
        snap = before.get(parent)
        if snap is None or snap.lock_ref or not set(snap.children) <= gone:
            return None
        return snap.leaf

    expected = wa_victims(
        candidates,
        n,
        names=order.category_names,
        doc=order.policy,
        now=order.now,
        size=lambda node: before[node].tokens,
        parent_joins=parent_joins,
        demoted=demoted,
    )
    assert t.victims == expected
    return list(t.victims)


def check_tree(t: Tree, held: list[Any]) -> None:
    """The tree's own invariants, the allocator's conservation, the side table's size."""
    cache, root = t.cache, t.cache.root_node
    evictable = protected = cached = 0
    leaves = set()
    values = []
    stack = list(root.children.items())
    count = 0
    while stack:
        child_key, node = stack.pop()
        count += 1
        assert node.parent.children[child_key] is node
        assert child_key == node.key.child_key(cache.page_size)
        assert len(node.value) == len(node.key) > 0 and node.lock_ref >= 0
        if node.lock_ref:
            protected += len(node.key)
        else:
            evictable += len(node.key)
            if not node.children:
                leaves.add(node)
        cached += len(node.value)
        values.append(node.value)
        stack.extend(node.children.items())
    assert (cache.evictable_size(), cache.protected_size()) == (evictable, protected)
    assert set(cache.evictable_leaves) == leaves
    assert t.allocator.available_size() + cached == SIZE  # no slot lost or freed twice
    if values:
        slots = t.sg.torch.cat(values)
        assert len(set(slots.tolist())) == cached and 0 not in set(slots.tolist())
    assert len(t.hooks.order) == count  # one row per cached node, none for evicted ones
    for node in held:  # a locked path is still cached
        while node is not root:
            assert (
                node.value is not None
                and node.parent.children[node.key.child_key(cache.page_size)] is node
            )
            node = node.parent


def random_doc(rng: random.Random) -> PolicyDocument:
    return PolicyDocument(
        version=2,
        categories={
            "chat": CategoryParams(rate=0.5, p_reuse=0.9, life_s=60),
            "doc": CategoryParams(rate=rng.choice([0.1, 5.0]), p_reuse=0.1, life_s=10),
            "code": CategoryParams(rate=0.05, p_reuse=rng.choice([0.0, 0.6]), life_s=600),
        },
    )


@pytest.mark.parametrize(("seed", "rule"), [(1, "tree"), (2, "tree"), (1, "off")])
def test_victims_follow_wa_and_the_tree_stays_consistent(tree: Tree, seed: int, rule: str) -> None:
    rng = random.Random(seed)
    order = tree.hooks.order
    if seed == 2:
        order.set_policy(random_doc(rng))
    else:
        assert order.policy == BUILTIN_POLICY and order.supersede == "tree"  # the default
    if rule == "off":
        order.set_policy(order.policy.model_copy(update={"supersede": "off"}))
    demoted = 0
    prefixes = [[rng.randrange(1, 5000) for _ in range(rng.choice([8, 40, 96]))] for _ in range(6)]
    held: list[Any] = []
    evictions = 0
    for _ in range(400):
        roll = rng.random()
        if roll < 0.7:
            base = rng.choice(prefixes)[: rng.randrange(1, 97)] if rng.random() < 0.7 else []
            tokens = base + [rng.randrange(1, 5000) for _ in range(rng.randrange(1, 120))]
            category = rng.choice(["chat", "doc", "code", None])
            _, lock = serve(tree, tokens, category, hold=rng.random() < 0.1 and len(held) < 4)
            if lock is not None:
                held.append(lock)
        elif roll < 0.85 and held:
            tree.cache.dec_lock_ref(held.pop(rng.randrange(len(held))))
        else:
            marked = set(order.superseded())
            victims = evict_checked(tree, rng.randrange(1, 300))
            evictions += len(victims)
            demoted += sum(v in marked for v in victims)
        check_tree(tree, held)
        time.sleep(0.0005)  # distinct access times (exact ties: tests/unit/test_radix_order.py)
    assert evictions > 100, evictions  # the run exercised eviction passes
    if rule == "tree":
        assert demoted > 20, demoted  # and superseded victims
    else:
        assert demoted == 0 and not order.superseded()
    assert tree.hooks.engine.agent.hits > 0
    # Named categories as sent; unnamed requests got an inferred one (turn, new tokens).
    names = set(tree.hooks.engine.agent.categories.names)
    assert {"chat", "doc", "code"} <= names
    assert any(re.fullmatch(r"t\d_n\d", n) for n in names), names


def test_events_reach_the_controller_and_a_pushed_version_applies_live(
    tree: Tree, redis_url: str, key_prefix: str
) -> None:
    from tests.integration.controller_fixtures import live_settings, running_controller

    settings = live_settings(
        redis_url=redis_url,
        key_prefix=key_prefix,
        api_token=TOKEN,
        min_samples=10,
    )
    rng = random.Random(5)
    system = [rng.randrange(1, 5000) for _ in range(64)]

    def chat() -> int:
        tokens = system + [rng.randrange(1, 5000) for _ in range(16)]
        return int(serve(tree, tokens, "chat")[0])

    def flood() -> None:  # more than the cache holds: stock LRU loses the system prompt
        for _ in range(5):
            serve(tree, [rng.randrange(1, 5000) for _ in range(400)], "doc")

    def rounds(n: int) -> list[int]:
        out = []
        for _ in range(n):
            chat()
            flood()
            out.append(chat())
        return out

    with running_controller(settings) as ctl:
        before = rounds(8)
        assert before == [0] * 8  # the built-in curve ranks by age alone, like LRU
        r = ctl.client.put("/v1/policy/overrides/doc", json={"p_reuse": 0.0}, headers=AUTH)
        assert r.status_code == 200, r.text
        version = int(r.json()["version"])
        cache = tree.cache
        deadline = time.monotonic() + 20
        while tree.hooks.order.policy.version < version:  # applied at the next match
            assert time.monotonic() < deadline, "the pushed version never applied"
            serve(tree, [rng.randrange(1, 5000) for _ in range(4)], "poke")
            time.sleep(0.1)
        assert tree.cache is cache and tree.cache.eviction_strategy is tree.hooks.order
        after = rounds(8)
        assert after == [len(system)] * 8, after  # doc goes first: the prompt stays
        check_tree(tree, [])

        def agent() -> dict[str, Any] | None:
            rows = {a["id"]: a for a in ctl.client.get("/v1/agents").json()}
            got = rows.get(tree.hooks.engine.agent.worker_id)
            return got if got and got["applied_version"] >= version else None

        row = wait_until(agent, timeout=30, what="the agent's heartbeat with the pushed version")
        assert row["engine"] == "sglang" and row["hits"] > 0 and row["events_sent"] > 0
        assert row["whole_requests"] is False  # radix nodes: the shadow leaves it out
        assert row["supersedes_branches"] is True  # its radix order runs the rule

        def fitted() -> dict[str, Any] | None:
            r = ctl.client.post("/v1/policy/refit", headers=AUTH, timeout=30)
            assert r.status_code == 200, r.text
            cats = {c["name"]: c for c in ctl.client.get("/v1/categories").json()}
            ok = all(cats.get(n, {}).get("fitted") for n in ("chat", "doc"))
            return cats if ok else None

        cats = wait_until(fitted, timeout=30, what="fitted chat and doc categories")
        assert cats["chat"]["samples"] > 0 and cats["doc"]["samples"] > 0
        assert cats["doc"]["published"]["p_reuse"] == 0.0  # the override survives a refit
        assert cats["chat"]["fitted"]["p_reuse"] > cats["doc"]["fitted"]["p_reuse"]

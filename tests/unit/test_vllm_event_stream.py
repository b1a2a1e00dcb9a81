"""The vLLM plugin's event stream against a stand-in block pool, over random workloads.

``Pool`` plays vLLM's part around the plugin's wrappers (``cache_full_blocks``, ``touch``,
``allocate_slots``, ``free``, ``evict_blocks``, ``cache_partial_block``) the way vLLM's
block pool does: prefix hits by block hash, several blocks per hash when two requests
computed one prompt, chunked prefill, preemption, hash-less blocks prepended when freed,
hashes dropped by a prefix-cache reset or a connector's eviction, blocks written over in
place (a hybrid model's checkpoint). Whatever the interleaving, the agent's events must
tell the cache vLLM holds: a block is inserted before it is hit or evicted, never
inserted while held; once every request is done the events leave cached exactly what
vLLM holds, and once every free block is reused nothing. The real engine runs in
tests/e2e/test_vllm.py.
"""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

import pytest

from agent.integrations import vllm as plugin
from agent.integrations.block_queue import KvwiseFreeQueue, hash64
from agent.integrations.engine_agent import EngineAgent
from agent.policies import create
from agent.settings import AgentSettings
from agent.wire import EventKind
from tests.vllm_block import Blk

BLOCKS = 16


class Pool:
    """vLLM's block pool and KV-cache manager, reduced to what the plugin sees."""

    def __init__(self, queue: KvwiseFreeQueue, rng: random.Random) -> None:
        self.queue, self.rng = queue, rng
        self.block_pool = SimpleNamespace(free_block_queue=queue)
        self.by_hash: dict[bytes, list[int]] = {}
        self.refs = [0] * BLOCKS
        self.refs[queue.popleft().block_id] = 1  # the null block
        self.cache_full_blocks = plugin._wrap_cache_full_blocks(self._give_hashes)
        self.touch = plugin._wrap_touch(self._take_free)
        self.free = plugin._wrap_free(self._release)
        self.evict_blocks = plugin._wrap_evict_blocks(self._drop_ids)
        self.cache_partial_block = plugin._wrap_cache_partial_block(self._write_over)
        self.checkpoints = 0
        self.partial_keys: set[bytes] = set()

    def _give_hashes(self, pool: Any, request: Any, blocks: list[Blk], lo: int, hi: int) -> None:
        for i in range(lo, hi):
            blocks[i].block_hash = request.keys[i]
            self.by_hash.setdefault(request.keys[i], []).append(blocks[i].block_id)

    def _take_free(self, pool: Any, blocks: list[Blk]) -> None:
        for block in blocks:
            if self.refs[block.block_id] == 0:
                self.queue.remove(block)
            self.refs[block.block_id] += 1

    def _release(self, manager: Any, request: Any) -> None:
        hashed, hashless = [], []
        for block in request.blocks[::-1]:
            self.refs[block.block_id] -= 1
            if self.refs[block.block_id] == 0:
                (hashless if block.block_hash is None else hashed).append(block)
        self.queue.prepend_n(hashless)
        self.queue.append_n(hashed)

    def _pop(self, n: int) -> list[Blk]:
        """``get_new_blocks``: a popped block that was cached leaves the cache."""
        got: list[Blk] = self.queue.popleft_n(n)
        for block in got:
            if block.block_hash is not None:
                self._forget(block)
                block.block_hash = None
            self.refs[block.block_id] += 1
        return got

    def allocate(self, request: Any, chunk: int) -> None:
        """One ``allocate_slots``: prefix hits first (now and then they stop short: the
        request computed blocks another had not cached yet), then up to ``chunk`` new
        blocks."""
        plugin._state.request = request
        if not request.blocks:
            hits = []
            for key in request.keys:
                if key not in self.by_hash or self.rng.random() < 0.05:
                    break
                hits.append(self.queue.blocks[self.by_hash[key][0]])
            if hits:
                self.touch(self.block_pool, hits)
            request.blocks = hits
        have = len(request.blocks)
        request.blocks += self._pop(min(chunk, len(request.keys) - have, len(self.queue)))
        self.cache_full_blocks(self.block_pool, request, request.blocks, have, len(request.blocks))
        plugin._state.request = None
        plugin._record_held(request, only_whole=True)

    def drop_hashes(self, keys: list[bytes]) -> None:
        """A connector's ``evict_blocks`` (all of them, every block free: a prefix-cache
        reset's drop): the blocks holding ``keys`` lose them, free or in use."""
        ids = {block_id for key in keys for block_id in self.by_hash.get(key, [])}
        self.evict_blocks(self.block_pool, ids)

    def _drop_ids(self, pool: Any, block_ids: set[int]) -> None:
        for block_id in block_ids:
            block = self.queue.blocks[block_id]
            self.by_hash.pop(block.block_hash, None)
            block.block_hash = None

    def checkpoint(self, request: Any) -> None:
        """A hybrid model's state checkpoint written over the request's last block that
        holds a hash (``cache_partial_block`` replacing its entries)."""
        hashed = [i for i, block in enumerate(request.blocks) if block.block_hash is not None]
        if hashed:
            i = hashed[-1]
            self.cache_partial_block(
                self.block_pool, request, request.blocks[i], i + 1, 0, 1,
                replace_existing_hashes=True,
            )  # fmt: skip

    def _write_over(self, pool: Any, request: Any, block: Blk, *args: Any, **kwargs: Any) -> bytes:
        """Its entries dropped, a partial entry of its own (never a prompt's key)."""
        self._forget(block)
        self.checkpoints += 1
        block.block_hash = (10**6 + self.checkpoints).to_bytes(32, "big") + bytes(4)
        self.partial_keys.add(block.block_hash)
        self.by_hash[block.block_hash] = [block.block_id]
        return block.block_hash

    def _forget(self, block: Blk) -> None:
        assert block.block_hash is not None
        self.by_hash[block.block_hash].remove(block.block_id)
        if not self.by_hash[block.block_hash]:
            del self.by_hash[block.block_hash]

    def drain(self) -> None:
        """Every free block reused: what was cached and free is evicted."""
        self._pop(len(self.queue))

    def cached(self) -> set[int]:
        """The contents cached, but partial entries (never reported)."""
        return {hash64(key) for key in self.by_hash if key not in self.partial_keys}


def run_workload(pool: Pool, rng: random.Random, steps: int) -> None:
    """New requests on four shared prefixes, chunks, finishes and preemptions."""
    running: list[Any] = []
    preempted: list[Any] = []
    for _ in range(steps):
        x = rng.random()
        partial = [r for r in running if len(r.blocks) < len(r.keys)]
        if x < 0.03 and pool.by_hash:
            keys = sorted(pool.by_hash)
            pool.drop_hashes(keys if not running else [rng.choice(keys)])
        elif running and (len(running) >= 3 or x < 0.3):
            request = running.pop(rng.randrange(len(running)))
            pool.free(None, request)
            if len(request.blocks) < len(request.keys):
                request.blocks = []
                preempted.append(request)
        elif running and x < 0.34:
            pool.checkpoint(rng.choice(running))
        elif preempted and x < 0.45:
            running.append(preempted.pop(0))
            pool.allocate(running[-1], rng.randint(1, 3))
        elif partial and x < 0.7:
            pool.allocate(rng.choice(partial), rng.randint(1, 3))
        else:
            root, length = rng.randrange(4), rng.randint(1, 5)
            keys = [(root * 100 + j).to_bytes(32, "big") + bytes(4) for j in range(length)]
            extra = {"kv_category": f"c{root % 2}"}
            params = SimpleNamespace(extra_args=extra)
            request = SimpleNamespace(
                sampling_params=params, num_prompt_tokens=length, keys=keys, blocks=[]
            )
            running.append(request)
            pool.allocate(request, rng.randint(1, 3))
    for request in running:
        pool.free(None, request)


def cache_told(events: list[tuple[str, int]]) -> set[int]:
    """What the events leave cached; each event checked against the cache they tell."""
    cached: set[int] = set()
    for position, (kind, block) in enumerate(events):
        assert (block in cached) == (kind != "INSERT"), (position, kind, block)
        if kind == "INSERT":
            cached.add(block)
        elif kind == "EVICT":
            cached.remove(block)
    return cached


@pytest.mark.parametrize("evictor", ["wa", "lru"])
@pytest.mark.parametrize("seed", range(16))
def test_the_events_tell_the_cache_vllm_holds(
    monkeypatch: pytest.MonkeyPatch, redis_url: str, key_prefix: str, evictor: str, seed: int
) -> None:
    settings = AgentSettings(
        enable=True, redis_url=redis_url, key_prefix=key_prefix, reuse_classes=seed % 2 == 1
    )
    policy = create(evictor, BLOCKS)
    engine = EngineAgent(
        settings, policy, capacity=BLOCKS, engine="vllm", infer=False, block_tokens=1
    )
    queue = KvwiseFreeQueue([Blk(i) for i in range(BLOCKS)], policy, hooks=engine)
    monkeypatch.setattr(plugin, "_state", plugin._State())
    plugin._state.engine, plugin._state.queue = engine, queue
    rng = random.Random(seed)
    pool = Pool(queue, rng)
    run_workload(pool, rng, 1500)
    events = told(engine)  # every request is done: all of it recorded
    assert cache_told(events) == pool.cached()
    pool.drain()
    events += told(engine)
    engine.close()
    assert pool.cached() == set()
    assert cache_told(events) == set()


def told(engine: EngineAgent) -> list[tuple[str, int]]:
    """The events recorded since last asked: (kind, block)."""
    return [
        (EventKind(int(kind)).name, int(block))
        for batch in engine.agent.publisher.collect()
        for kind, block in zip(batch.kind, batch.block, strict=True)
    ]

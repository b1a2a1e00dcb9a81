"""The vLLM plugin's parts that need no vLLM: the off switch and the routing of the
agent's log lines into vLLM's logger tree (the version gate is in
test_plugin_version_gates.py).
The plugin inside a real engine is tested in tests/e2e/test_vllm.py."""

from __future__ import annotations

import functools
import logging
import sys
from types import SimpleNamespace
from typing import Any

import pytest

from agent.integrations import vllm as plugin
from agent.integrations.block_queue import KvwiseFreeQueue
from agent.integrations.engine_agent import EngineAgent
from agent.policies.wa import WAPolicy
from agent.settings import AgentSettings, agent_enabled
from agent.wire import EventKind
from tests.vllm_block import Blk


def test_disabled_plugin_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVWISE_ENABLE", "0")
    before = set(sys.modules)
    plugin.register()
    assert not plugin._state.registered
    assert not any(m == "vllm" or m.startswith("vllm.") for m in set(sys.modules) - before)


def test_a_disabled_plugin_ignores_bad_values_of_other_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An engine run without kvwise starts whatever other ``KVWISE_*`` values hold."""
    monkeypatch.delenv("KVWISE_ENABLE", raising=False)
    monkeypatch.setenv("KVWISE_KEY_PREFIX", "{bad}")
    monkeypatch.setenv("KVWISE_BUFFER_EVENTS", "lots")
    plugin.register()
    assert not plugin._state.registered
    with pytest.raises(ValueError, match="buffer_events"):
        AgentSettings()


@pytest.mark.parametrize(
    ("raw", "enabled"), [("0", False), ("off", False), ("1", True), ("True", True)]
)
def test_the_off_switch_reads_as_the_settings_do(
    raw: str, enabled: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KVWISE_ENABLE", raising=False)
    monkeypatch.setenv("kvwise_enable", raw)  # names are read case-blind, as pydantic does
    assert agent_enabled() is enabled is AgentSettings().enable


def test_an_enabled_plugin_names_the_variable_of_a_bad_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An operator sets ``KVWISE_*`` variables, not fields: the engine's start-up error
    names the variable and why, in one line, and not the value (it may be a password)."""
    monkeypatch.setenv("KVWISE_ENABLE", "1")
    monkeypatch.setenv("KVWISE_BUFFER_EVENTS", "lots")
    with pytest.raises(ValueError) as raised:
        plugin.register()
    message = str(raised.value)
    assert message.startswith("kvwise: bad agent setting KVWISE_BUFFER_EVENTS: Input should be")
    assert "\n" not in message and "lots" not in message
    assert not plugin._state.registered


@pytest.mark.parametrize(
    ("variable", "value", "reason"),
    [
        ("KVWISE_EVICTOR", "lur", "unknown policy 'lur'; known: arc, fifo, lfu, lru"),
        ("KVWISE_REDIS_URL", "http://redis:6379/0", "Redis URL 'http://redis:6379/0' must start"),
        ("KVWISE_REDIS_URL", "redis://:hunter2@redis:port/0", "Redis URL 'redis://:***@redis:"),
    ],
)
def test_an_enabled_plugin_refuses_as_it_loads_what_the_engines_cache_build_would(
    variable: str, value: str, reason: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM builds the block pool, where the agent is made, only after loading the model: an
    evictor or a Redis URL the agent refuses stops the engine as the plugin loads, in one
    line naming the variable (a URL's password masked), not minutes into its start."""
    monkeypatch.setattr(plugin, "_state", plugin._State())
    monkeypatch.setenv("KVWISE_ENABLE", "1")
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValueError) as raised:
        plugin.register()
    message = str(raised.value)
    assert message.startswith(f"kvwise: bad agent setting {variable}: {reason}"), message
    assert "\n" not in message and "hunter2" not in message
    assert not plugin._state.registered


def test_a_bad_off_switch_is_an_error_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVWISE_ENABLE", "maybe")
    with pytest.raises(ValueError, match="KVWISE_ENABLE: 'maybe' is not a boolean"):
        plugin.register()


def test_agent_log_lines_reach_vllms_logger_tree() -> None:
    """vLLM configures the ``vllm`` logger tree only; the agent's records are handed to
    it, at its level, and not repeated through the root logger."""

    class Keep(logging.Handler):
        def __init__(self) -> None:
            super().__init__()
            self.records: list[logging.LogRecord] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.records.append(record)

    vllm_log, agent_log, root = (logging.getLogger(n) for n in ("vllm", "agent", ""))
    saved = (vllm_log.level, vllm_log.propagate, agent_log.level, agent_log.propagate)
    saved_handlers = list(agent_log.handlers)
    in_vllm, at_root = Keep(), Keep()
    vllm_log.addHandler(in_vllm)
    vllm_log.setLevel(logging.INFO)
    vllm_log.propagate = False
    root.addHandler(at_root)
    try:
        plugin.route_agent_logs()
        plugin.route_agent_logs()  # idempotent: one handler, each line once
        logging.getLogger("agent.runtime.agent").info("kvwise agent w: policy v%d in force", 7)
        logging.getLogger("agent.runtime.subscriber").debug("below vLLM's level")
        logging.getLogger("agent.runtime.heartbeat").warning("kvwise heartbeat: cannot reach Redis")
    finally:
        vllm_log.removeHandler(in_vllm)
        root.removeHandler(at_root)
        agent_log.handlers[:] = saved_handlers
        vllm_log.level, vllm_log.propagate, agent_log.level, agent_log.propagate = saved
    assert [r.getMessage() for r in in_vllm.records] == [
        "kvwise agent w: policy v7 in force",
        "kvwise heartbeat: cannot reach Redis",
    ]
    assert [r.name for r in in_vllm.records] == ["agent.runtime.agent", "agent.runtime.heartbeat"]
    assert at_root.records == []


class PluginEngine:
    """The plugin's wrappers around stand-ins for vLLM's ``BlockPool`` and
    ``KVCacheManager`` calls (the real ones run in tests/e2e/test_vllm.py), with its
    ``EngineAgent`` (not started: events stay in its buffer) and a settable clock."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, redis_url: str, key_prefix: str) -> None:
        settings = AgentSettings(enable=True, redis_url=redis_url, key_prefix=key_prefix)
        evictor = WAPolicy()
        self.engine = EngineAgent(
            settings, evictor, capacity=6, engine="vllm", infer=False, block_tokens=1
        )
        self.queue = KvwiseFreeQueue([Blk(i) for i in range(6)], evictor, hooks=self.engine)
        monkeypatch.setattr(plugin, "_state", plugin._State())
        plugin._state.engine, plugin._state.queue = self.engine, self.queue
        self.now = 100.0
        monkeypatch.setattr(plugin, "time", SimpleNamespace(time=lambda: self.now))
        self.pool = SimpleNamespace(free_block_queue=self.queue)
        self._store = plugin._wrap_cache_full_blocks(self._give_hashes)
        self._touch = plugin._wrap_touch(self._remove_free)
        self._free = plugin._wrap_free(lambda manager, request: None)
        self.reset = functools.partial(
            plugin._wrap_reset_prefix_cache(self._drop_hashes), self.pool
        )
        self.evict_blocks = functools.partial(
            plugin._wrap_evict_blocks(self._evict_blocks), self.pool
        )
        self.queue.clock = lambda: self.now

    @staticmethod
    def request(prompt_blocks: int) -> Any:
        return SimpleNamespace(
            sampling_params=SimpleNamespace(extra_args={}), num_prompt_tokens=prompt_blocks
        )

    @staticmethod
    def _give_hashes(pool: Any, request: Any, blocks: list[Blk], cached: int, full: int) -> None:
        for block in blocks[cached:full]:  # vLLM's cache_full_blocks
            block.block_hash = (500 + block.block_id).to_bytes(32, "big") + bytes(4)

    def _drop_hashes(self, pool: Any, blocks_in_use: bool) -> bool:
        if blocks_in_use:  # vLLM's reset_prefix_cache refuses, changing nothing
            return False
        for block in self.queue.blocks:
            block.block_hash = None
        return True

    def _evict_blocks(self, pool: Any, block_ids: Any) -> None:
        for block_id in block_ids:  # vLLM's evict_blocks: the hashes go, free or in use
            self.queue.blocks[block_id].block_hash = None

    def _remove_free(self, pool: Any, blocks: list[Blk]) -> None:
        free = self.queue.get_all_free_blocks()
        for block in blocks:  # vLLM's touch: a block no request holds leaves the queue
            if block in free:
                self.queue.remove(block)

    def allocate(self, request: Any, blocks: list[Blk], hits: list[Blk], cached: int) -> None:
        """One ``allocate_slots``: ``hits`` found cached, ``blocks[cached:]`` stored."""
        plugin._state.request = request
        if hits:
            self._touch(self.pool, hits)
        self._store(self.pool, request, blocks, cached, len(blocks))
        plugin._state.request = None
        plugin._record_held(request, only_whole=True)

    def free(self, request: Any, blocks: list[Blk]) -> None:
        """``KVCacheManager.free``: ``blocks`` are the ones no other request holds."""
        self.queue.append_n(blocks[::-1])
        self._free(None, request)

    def events(self) -> list[tuple[str, int, float]]:
        """What the agent recorded: kind, block (less 500) and time of each event."""
        batches = self.engine.agent.publisher.collect()
        self.engine.close()
        return [
            (EventKind(int(kind)).name, int(block) - 500, float(ts))
            for batch in batches
            for kind, block, ts in zip(batch.kind, batch.block, batch.ts, strict=True)
        ]


def test_a_preempted_request_resumed_later_is_recorded_at_its_resumption(
    monkeypatch: pytest.MonkeyPatch, redis_url: str, key_prefix: str
) -> None:
    """vLLM frees a preempted request's blocks (its prompt so far is recorded then) and
    schedules it again later: what it finds cached and stores then is a new access, at
    that time, not one more at the time it first arrived."""
    vllm = PluginEngine(monkeypatch, redis_url, key_prefix)
    request = vllm.request(2)
    held = vllm.queue.popleft_n(2)
    vllm.allocate(request, held[:1], [], 0)  # its first prompt block
    vllm.now = 150.0
    vllm.free(request, held[:1])  # preempted
    vllm.queue.append_n(held[1:])
    vllm.now = 300.0
    held = [held[0], *vllm.queue.popleft_n(1)]  # resumed: finds its first block cached
    vllm.allocate(request, held, held[:1], 1)
    times = [(kind, ts) for kind, _, ts in vllm.events()]
    assert times == [("INSERT", 100.0), ("HIT", 300.0), ("INSERT", 300.0)]


def test_a_request_freed_while_waiting_is_recorded_before_its_blocks_can_be_evicted(
    monkeypatch: pytest.MonkeyPatch, redis_url: str, key_prefix: str
) -> None:
    """A request whose prompt is whole but that hit a block another request still holds
    waits for it (chunked prefill). Freed meanwhile (preempted, aborted), the blocks it
    stored may be evicted at once: their insertion must be recorded before that."""
    vllm = PluginEngine(monkeypatch, redis_url, key_prefix)
    first, second = vllm.request(3), vllm.request(2)
    held = vllm.queue.popleft_n(2)  # blocks 0 and 1
    vllm.allocate(first, held[:1], [], 0)  # its first chunk: block 0 of 3
    vllm.allocate(second, held, held[:1], 1)  # hits block 0, stores block 1: whole, waits
    vllm.free(second, held[1:])  # aborted: block 1 is free, block 0 still the first's
    vllm.queue.popleft_n(vllm.queue.num_free_blocks)  # block 1 evicted for reuse
    order = [(kind, block) for kind, block, _ in vllm.events()]
    assert ("EVICT", 1) in order
    assert order.index(("INSERT", 1)) < order.index(("EVICT", 1))


def test_a_prefix_cache_reset_reports_the_stored_content_evicted_at_once(
    monkeypatch: pytest.MonkeyPatch, redis_url: str, key_prefix: str
) -> None:
    """vLLM's ``reset_prefix_cache`` drops every cached block's hash: the agent reports
    that content evicted then (the controller and its shadow would otherwise count it
    cached until each block happens to be reused); a refused reset reports nothing."""
    vllm = PluginEngine(monkeypatch, redis_url, key_prefix)
    request = vllm.request(2)
    held = vllm.queue.popleft_n(2)
    vllm.allocate(request, held, [], 0)
    assert vllm.reset(True) is False  # blocks in use: refused
    vllm.free(request, held)
    assert vllm.reset(False) is True
    order = [(kind, block) for kind, block, _ in vllm.events()]
    assert sorted(order[:2]) == [("INSERT", 0), ("INSERT", 1)]
    assert sorted(order[2:]) == [("EVICT", 0), ("EVICT", 1)]


def test_a_connectors_eviction_reports_free_blocks_at_the_drop_and_in_use_ones_when_freed(
    monkeypatch: pytest.MonkeyPatch, redis_url: str, key_prefix: str
) -> None:
    """``BlockPool.evict_blocks`` (a KV connector) drops blocks' hashes: a free cached
    block's content is reported evicted at the drop, and the block is reused first; one a
    request holds is reported when it is freed, as before."""
    vllm = PluginEngine(monkeypatch, redis_url, key_prefix)
    first, second = vllm.request(2), vllm.request(1)
    held = vllm.queue.popleft_n(3)
    vllm.allocate(first, held[:2], [], 0)
    vllm.allocate(second, held[2:], [], 0)
    vllm.free(first, held[:2])
    vllm.now = 200.0
    vllm.evict_blocks(iter([0, 2]))  # an iterator: read by vLLM, then by the wrapper
    assert [b.block_id for b in vllm.queue.popleft_n(1)] == [0]
    vllm.now = 300.0
    vllm.queue.prepend_n(held[2:])  # the second request done: its block comes back hash-less
    vllm._free(None, second)
    evictions = [(block, ts) for kind, block, ts in vllm.events() if kind == "EVICT"]
    assert evictions == [(0, 200.0), (2, 300.0)]

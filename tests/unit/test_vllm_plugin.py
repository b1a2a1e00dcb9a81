"""The vLLM plugin's parts that need no vLLM: the off switch and the routing of the
agent's log lines into vLLM's logger tree (the version gate is in
test_plugin_version_gates.py).
The plugin inside a real engine is tested in tests/e2e/test_vllm.py."""

from __future__ import annotations

import logging
import sys
from types import SimpleNamespace
from typing import Any

import pytest

from agent.integrations import vllm as plugin
from agent.integrations.block_queue import KvwiseFreeQueue
from agent.integrations.engine_agent import EngineAgent
from agent.policies.wa import WAPolicy
from agent.settings import AgentSettings
from agent.wire import EventKind
from tests.vllm_block import Blk


def test_disabled_plugin_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVWISE_ENABLE", "0")
    before = set(sys.modules)
    plugin.register()
    assert not plugin._state.registered
    assert not any(m == "vllm" or m.startswith("vllm.") for m in set(sys.modules) - before)


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


def test_a_preempted_request_resumed_later_is_recorded_at_its_resumption(
    monkeypatch: pytest.MonkeyPatch, redis_url: str, key_prefix: str
) -> None:
    """vLLM frees a preempted request's blocks (its prompt so far is recorded then) and
    schedules it again later: what it finds cached and stores then is a new access, at
    that time, not one more at the time it first arrived."""
    settings = AgentSettings(enable=True, redis_url=redis_url, key_prefix=key_prefix)
    evictor = WAPolicy()
    engine = EngineAgent(settings, evictor, capacity=6, engine="vllm", infer=False, block_tokens=1)
    queue = KvwiseFreeQueue([Blk(i) for i in range(6)], evictor, hooks=engine)
    monkeypatch.setattr(plugin, "_state", plugin._State())
    plugin._state.engine, plugin._state.queue = engine, queue
    clock = [100.0]
    monkeypatch.setattr(plugin, "time", SimpleNamespace(time=lambda: clock[0]))
    pool = SimpleNamespace(free_block_queue=queue)

    def store(pool: Any, request: Any, blocks: list[Blk], cached: int, full: int) -> None:
        for block in blocks[cached:full]:  # vLLM's cache_full_blocks: the blocks get hashes
            block.block_hash = (500 + block.block_id).to_bytes(32, "big") + bytes(4)

    def hit(pool: Any, blocks: list[Blk]) -> None:
        for block in blocks:  # vLLM's touch
            queue.remove(block)

    cache_full_blocks = plugin._wrap_cache_full_blocks(store)
    touch = plugin._wrap_touch(hit)
    free = plugin._wrap_free(lambda manager, request: queue.append_n(held[::-1]))
    request = SimpleNamespace(sampling_params=SimpleNamespace(extra_args={}), num_prompt_tokens=2)
    held = queue.popleft_n(2)
    plugin._state.request = request  # inside allocate_slots: its first prompt block
    cache_full_blocks(pool, request, held, 0, 1)
    plugin._state.request = None
    clock[0] = 150.0
    free(None, request)  # preempted: blocks freed, what it held recorded
    clock[0] = 300.0
    held = [held[0], *queue.popleft_n(1)]  # resumed: finds its first block cached
    plugin._state.request = request
    touch(pool, held[:1])
    cache_full_blocks(pool, request, held, 1, 2)
    plugin._state.request = None
    plugin._record_held(request, only_whole=True)  # what the allocate_slots wrapper does
    events = engine.agent.publisher.collect()
    engine.close()
    kinds_and_times = [
        (EventKind(int(kind)).name, float(ts))
        for batch in events
        for kind, ts in zip(batch.kind, batch.ts, strict=True)
    ]
    assert kinds_and_times == [("INSERT", 100.0), ("HIT", 300.0), ("INSERT", 300.0)]

"""The vLLM plugin's parts that need no vLLM: the off switch and the routing of the
agent's log lines into vLLM's logger tree (the version gate is in
test_plugin_version_gates.py).
The plugin inside a real engine is tested in tests/e2e/test_vllm.py."""

from __future__ import annotations

import logging
import sys

import pytest

from agent.integrations import vllm as plugin


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

"""The SGLang plugin's parts that need no SGLang: ``register`` where SGLang is absent and
the agent's settings (the version gate is in test_plugin_version_gates.py). The plugin in
SGLang's real radix cache is tested in tests/integration/test_sglang_radix.py."""

from __future__ import annotations

import importlib.util
import logging
import sys

import pytest
import redis

from agent.integrations import sglang as plugin
from agent.integrations.engine_agent import EngineAgent
from agent.integrations.radix_order import RadixOrder
from agent.policy_document import BUILTIN_POLICY
from agent.wire import Keys, encode_policy


@pytest.mark.skipif(importlib.util.find_spec("sglang") is not None, reason="sglang installed")
def test_register_without_sglang_warns_and_loads_nothing(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(plugin, "_state", plugin._State())
    with caplog.at_level(logging.WARNING, logger="sglang.kvwise"):
        plugin.register()
    assert "no radix-cache registry" in caplog.text
    assert plugin.attached() is None
    assert not any(m == "sglang" or m.startswith("sglang.") for m in sys.modules)


def test_the_agent_in_sglang_runs_reports_and_follows_wa_whatever_kvwise_evictor_says(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    redis_url: str,
    key_prefix: str,
    r: redis.Redis,
) -> None:
    """SGLang's tree runs ``wa``'s order (``KVWISE_EVICTOR`` does not apply there): the
    agent says so once, reports ``wa`` in its heartbeat, not the family configured, and
    refuses a document naming a baseline it cannot run, rather than applying it."""
    monkeypatch.setenv("KVWISE_EVICTOR", "lru")
    monkeypatch.setenv("KVWISE_REDIS_URL", redis_url)
    monkeypatch.setenv("KVWISE_KEY_PREFIX", key_prefix)
    with caplog.at_level(logging.WARNING, logger="sglang.kvwise"):
        settings = plugin.engine_settings()
    assert "KVWISE_EVICTOR=lru does not apply in SGLang" in caplog.text
    engine = EngineAgent(settings, RadixOrder(), capacity=8, engine="sglang", whole_requests=False)
    assert engine.agent.status().evictor == "wa"
    keys = Keys(key_prefix)
    baseline = BUILTIN_POLICY.model_copy(update={"version": 1, "evictor": "lru"})
    r.set(keys.policy_doc(1), encode_policy(baseline))
    r.set(keys.policy_current, 1)
    assert engine.agent.subscriber.check() is not None
    assert not engine.agent.apply_pending()
    status = engine.agent.status()
    assert (status.applied_version, status.evictor, status.rejected) == (0, "wa", 1)
    assert "cannot switch evictor family" in status.last_rejection
    engine.close()

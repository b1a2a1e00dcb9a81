"""The SGLang plugin's parts that need no SGLang: ``register`` where SGLang is absent
(the version gate is in test_plugin_version_gates.py). The plugin in SGLang's real radix
cache is tested in tests/integration/test_sglang_radix.py."""

from __future__ import annotations

import importlib.util
import logging
import sys

import pytest

from agent.integrations import sglang as plugin


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

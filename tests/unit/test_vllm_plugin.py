"""The vLLM plugin's parts that need no vLLM: the version gate and the off switch.
The plugin inside a real engine is tested in tests/e2e/test_vllm.py."""

from __future__ import annotations

import sys

import pytest

from agent.integrations import vllm as plugin


@pytest.mark.parametrize(
    ("version", "ok"),
    [
        ("0.32.0", True),
        ("0.32.0+cpu", True),
        ("0.33.1", True),
        ("0.31.9", False),
        ("0.34.0", False),
        ("1.0.0", False),
        ("dev", False),
    ],
)
def test_version_gate(version: str, ok: bool) -> None:
    assert plugin.version_ok(version) is ok


def test_disabled_plugin_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVWISE_ENABLE", "0")
    before = set(sys.modules)
    plugin.register()
    assert not plugin._state.registered
    assert not any(m == "vllm" or m.startswith("vllm.") for m in set(sys.modules) - before)

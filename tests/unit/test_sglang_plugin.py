"""The SGLang plugin's parts that need no SGLang: the version gate, and ``register`` where
SGLang is absent. The plugin in SGLang's real radix cache is tested in
tests/integration/test_sglang_radix.py."""

from __future__ import annotations

import importlib.util
import logging
import sys

import pytest

from agent.integrations import sglang as plugin


@pytest.mark.parametrize(
    ("version", "ok"),
    [
        ("0.5.23", True),
        ("0.5.23.post1", True),
        ("0.5.22", False),
        ("0.5.24", False),
        ("0.6.0", False),
        ("0.5", False),
        ("dev", False),
    ],
)
def test_version_gate(version: str, ok: bool) -> None:
    assert plugin.version_ok(version) is ok


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

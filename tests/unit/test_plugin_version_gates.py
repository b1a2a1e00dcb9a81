"""Each engine plugin's version gate: the engine versions it loads into, and the ones it
refuses."""

from __future__ import annotations

from types import ModuleType

import pytest

from agent.integrations import sglang, vllm

GATES: list[tuple[ModuleType, str, bool]] = [
    (sglang, "0.5.23", True),
    (sglang, "0.5.23.post1", True),
    (sglang, "0.5.22", False),
    (sglang, "0.5.24", False),
    (sglang, "0.6.0", False),
    (sglang, "0.5", False),
    (sglang, "dev", False),
    (vllm, "0.32.0", True),
    (vllm, "0.32.0+cpu", True),
    (vllm, "0.33.1", True),
    (vllm, "0.31.9", False),
    (vllm, "0.34.0", False),
    (vllm, "1.0.0", False),
    (vllm, "dev", False),
]


@pytest.mark.parametrize(
    ("plugin", "version", "ok"),
    GATES,
    ids=[f"{plugin.__name__.rsplit('.', 1)[-1]}-{version}" for plugin, version, _ in GATES],
)
def test_version_gate(plugin: ModuleType, version: str, ok: bool) -> None:
    assert plugin.version_ok(version) is ok

"""Building the configured evictor (``agent.runtime.family.build_evictor``): ``device``
is the torch evictor on ``KVWISE_DEVICE`` or a clear error naming it, never a CPU ``wa``
in its place; and the agent runs every other evictor without torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

from agent.policies.lru import LRUPolicy
from agent.policies.wa import WAPolicy
from agent.runtime.family import EvictorUnavailable, build_evictor
from agent.settings import AgentSettings
from tests.conftest import REPO


def configured(evictor: str, device: str = "cpu") -> AgentSettings:
    return AgentSettings(redis_url="redis://127.0.0.1:9/0", evictor=evictor, device=device)


def test_device_builds_the_torch_evictor_for_wa_and_the_cpu_policy_for_a_baseline() -> None:
    torch_evictor = pytest.importorskip("agent.device_evictor").DeviceEvictor
    settings = configured("device")
    assert type(build_evictor(settings, 8)) is torch_evictor
    assert type(build_evictor(settings, 8, "wa")) is torch_evictor  # a switch back to wa
    assert type(build_evictor(settings, 8, "lru")) is LRUPolicy  # no device baseline
    assert type(build_evictor(configured("wa"), 8)) is WAPolicy


def test_a_device_this_torch_cannot_use_is_an_error_naming_the_variable_and_device() -> None:
    """Not a CPU ``wa`` run quietly in its place. No machine has a 100th GPU: the error
    holds with or without CUDA."""
    pytest.importorskip("torch")
    with pytest.raises(EvictorUnavailable) as err:
        build_evictor(configured("device", "cuda:99"), 8)
    assert str(err.value).startswith("KVWISE_DEVICE=cuda:99: device 'cuda:99' cannot be used")


AGENT_WITHOUT_TORCH = """
import sys
sys.modules["torch"] = None  # importing torch fails, as where it is not installed
from agent.runtime.agent import Agent
from agent.runtime.family import EvictorUnavailable
from agent.settings import AgentSettings
settings = AgentSettings(redis_url="redis://127.0.0.1:9/0")
Agent(settings, capacity=8).close()
try:
    Agent(settings.model_copy(update={"evictor": "device"}), capacity=8)
except EvictorUnavailable as exc:
    print(exc)
"""


def test_without_torch_the_agent_runs_wa_and_device_is_an_error_naming_the_variable() -> None:
    command = [sys.executable, "-c", AGENT_WITHOUT_TORCH]
    said = subprocess.check_output(command, cwd=REPO, text=True, timeout=60).strip()
    assert said.startswith("KVWISE_DEVICE=cpu: the device evictor needs torch, "), said
    assert said.endswith("install kvwise[torch], or configure another evictor"), said

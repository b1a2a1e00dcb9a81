"""A ``KVWISE_*`` variable that nothing reads, inside an engine: the agent the vLLM or the
SGLang plugin makes warns of it in the engine's log, naming the setting it was meant as,
and never of a setting of the controller's (one environment may serve both). The CLI's
warning of the same variables is tested in test_cli_errors.py."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from agent.integrations import vllm as plugin
from agent.integrations.engine_agent import EngineAgent
from agent.integrations.radix_order import RadixOrder
from agent.setting_names import CONTROLLER_SETTINGS, NOT_SETTINGS, unread_variables
from agent.settings import AgentSettings, RedisSettings, read_agent_settings
from agent.unknown_names import meant, unknown_name
from controlplane.service.settings import ControllerSettings
from tests.vllm_block import Blk

ENGINE_ENV = {
    "KVWISE_EVICTER": "lru",  # for KVWISE_EVICTOR: the engine ran wa without a word
    "KVWISE_REDIS_HOST": "redis.example",  # no such setting, none close
    "kvwise_poll_interval_s": "1",  # read: the settings ignore case
    "KVWISE_SHADOW_ENABLED": "0",  # the controller's, in a shared environment
    "KVWISE_MAX_CATEGORIES_PER_WORKER": "4096",  # the controller's too
    "KVWISE_TEST_SOMETHING": "1",  # the test suite's own
}
WARNED = [
    "kvwise: KVWISE_EVICTER is not a kvwise setting: nothing reads it "
    "(did you mean KVWISE_EVICTOR?)",
    "kvwise: KVWISE_REDIS_HOST is not a kvwise setting: nothing reads it "
    "(kvwise config lists them)",
]


@pytest.fixture
def engine_env(monkeypatch: pytest.MonkeyPatch, redis_url: str, key_prefix: str) -> None:
    """An engine's environment: kvwise on, its Redis, and ``ENGINE_ENV``; no other
    ``KVWISE_*`` setting of the machine's own environment."""
    for name in os.environ:
        if name.upper().startswith("KVWISE_") and not name.upper().startswith(NOT_SETTINGS):
            monkeypatch.delenv(name)
    monkeypatch.setenv("KVWISE_ENABLE", "1")
    monkeypatch.setenv("KVWISE_REDIS_URL", redis_url)
    monkeypatch.setenv("KVWISE_KEY_PREFIX", key_prefix)
    for name, value in ENGINE_ENV.items():
        monkeypatch.setenv(name, value)


@pytest.fixture
def vllm_state(monkeypatch: pytest.MonkeyPatch) -> Iterator[plugin._State]:
    """The vLLM plugin's state as ``register`` leaves it (settings read from the
    environment, the stock queue kept for any other pool); the agent closed afterwards."""
    state = plugin._State()
    monkeypatch.setattr(plugin, "_state", state)
    state.settings = read_agent_settings()
    state.stock_queue = lambda blocks: ("stock queue", len(blocks))
    yield state
    if state.engine is not None:
        state.engine.close()


def gpu_blocks(n: int) -> list[Blk]:
    """``n`` blocks of a GPU pool of 16-token hashes, as ``BlockPool`` hands its queue."""
    pool = SimpleNamespace(medium="GPU", hash_block_size=16)
    blocks = [Blk(i) for i in range(n)]
    for block in blocks:
        block.pool = pool  # type: ignore[attr-defined]
    return blocks


@pytest.mark.usefixtures("engine_env")
def test_the_vllm_agent_warns_once_of_each_variable_nothing_reads(
    vllm_state: plugin._State, caplog: pytest.LogCaptureFixture
) -> None:
    """Built as vLLM builds its first GPU pool; a second pool keeps the stock queue, and
    nothing is said again."""
    with caplog.at_level(logging.WARNING, logger="agent"):
        plugin._make_queue(gpu_blocks(8))
        assert plugin._make_queue(gpu_blocks(4)) == ("stock queue", 4)
    assert vllm_state.engine is not None
    assert [r.getMessage() for r in caplog.records if r.name.startswith("agent.")] == WARNED
    settings = vllm_state.engine.agent.settings
    assert settings.evictor == "wa" and settings.poll_interval_s == 1.0  # what it said


@pytest.mark.usefixtures("engine_env")
def test_the_sglang_agent_warns_of_each_variable_nothing_reads(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Built as the SGLang plugin's ``attach`` builds it, on a radix order."""
    with caplog.at_level(logging.WARNING, logger="agent"):
        engine = EngineAgent(
            read_agent_settings(), RadixOrder(), capacity=8, engine="sglang", whole_requests=False
        )
    engine.close()
    assert [r.getMessage() for r in caplog.records if r.name.startswith("agent.")] == WARNED


def test_an_engine_environment_the_chart_would_set_warns_of_nothing() -> None:
    """Every agent setting and every controller setting, in any case: all read."""
    fields = set(AgentSettings.model_fields) | set(ControllerSettings.model_fields)
    environ = {f"KVWISE_{field.upper()}": "x" for field in fields}
    environ |= {f"kvwise_{field}": "x" for field in fields}
    assert unread_variables(environ) == []


def test_the_agents_list_of_controller_settings_is_the_controllers() -> None:
    """The agent may not import the controller, so it names the controller's settings
    itself: a setting added to the controller and not there would be warned of in every
    engine that shares the controller's environment."""
    controller = set(ControllerSettings.model_fields) - set(RedisSettings.model_fields)
    missing, gone = controller - CONTROLLER_SETTINGS, CONTROLLER_SETTINGS - controller
    assert not missing and not gone, (
        f"agent.setting_names.CONTROLLER_SETTINGS: add {sorted(missing)}, remove {sorted(gone)}"
    )


@pytest.mark.parametrize(
    ("name", "known", "guess"),
    [
        ("LRU", ["lru", "fifo"], "lru"),  # case aside
        ("to-x", ["to-c", "to-b"], None),  # two as close: neither
        ("sfifo", ["s3fifo", "fifo"], "s3fifo"),  # both close, one closer (0.91 to 0.89)
        ("evict", ["lru", "fifo"], None),  # none close
    ],
)
def test_a_slip_is_taken_for_the_one_closest_known_name(
    name: str, known: list[str], guess: str | None
) -> None:
    assert meant(name, known) == guess
    hint = "" if guess is None else f" (did you mean {guess!r}?)"
    assert unknown_name("policy", name, known).startswith(f"unknown policy {name!r}{hint}; known:")

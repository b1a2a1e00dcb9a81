"""kvwise's engine-thread time, sampled (``agent.engine_time``): zero before any call,
plausible after (timed calls take no longer than the loop that made them; one call in 64
or so is timed), counted once per engine call when the integration's queue times the
agent's work inside it, and carried by the heartbeat (an older heartbeat reads zero)."""

from __future__ import annotations

import itertools
import json
import time

import pytest

from agent.engine_time import SAMPLE_EVERY, EngineTime
from agent.integrations.block_queue import KvwiseFreeQueue
from agent.integrations.engine_agent import EngineAgent
from agent.policies.wa import WAPolicy
from agent.runtime.agent import Agent
from agent.settings import AgentSettings
from agent.wire import AgentStatus
from tests.vllm_block import Blk
from tests.wire_samples import agent_status

OFFLINE = AgentSettings(redis_url="redis://127.0.0.1:1", evictor="lru")
"""Never started: the hooks work, nothing touches the network."""


def _requests(agent: Agent, n: int, width: int = 8) -> tuple[int, int]:
    """``n`` requests of ``width`` new blocks, the first found cached again, each evicting
    down to capacity: the hook calls made and the blocks passed or evicted."""
    calls = blocks_handled = 0
    for r in range(n):
        blocks = list(range(r * width, (r + 1) * width))
        agent.free(blocks[::-1], range(width - 1, -1, -1), float(r), "chat")
        agent.touch(blocks[:1], float(r), "chat")
        calls, blocks_handled = calls + 2, blocks_handled + width + 1
        if len(agent.policy) > agent.capacity:
            victims = agent.evict(len(agent.policy) - agent.capacity, float(r))
            calls, blocks_handled = calls + 1, blocks_handled + len(victims)
    return calls, blocks_handled


def test_the_hooks_report_nothing_before_a_call_and_their_time_after() -> None:
    agent = Agent(OFFLINE, capacity=64)
    agent.engine_time = EngineTime(every=1)  # every call timed: exact bounds
    before = agent.status()
    assert before.engine_time.calls == before.engine_sampled_ns == 0
    assert before.engine_time.seconds_per_call == before.engine_time.seconds_per_block == 0.0
    started = time.perf_counter_ns()
    calls, blocks = _requests(agent, 200)
    elapsed_ns = time.perf_counter_ns() - started
    after = agent.status().engine_time
    assert after.calls == after.sampled_calls == calls > 2 * 200
    assert after.sampled_blocks == blocks
    assert 0 < after.sampled_ns < elapsed_ns  # the loop's own work is not counted
    assert 0 < after.seconds_per_block < after.seconds_per_call < 1e-3
    assert after.seconds * 1e9 == pytest.approx(after.sampled_ns)  # all timed: exact


def test_about_one_call_in_64_is_timed_at_random_gaps() -> None:
    meter = EngineTime(seed=7)
    timed = []
    for call in range(64 * 200):
        started = meter.begin()
        if started:
            timed.append(call)
            meter.end(started, 3)
    assert meter.calls == 64 * 200
    assert 150 <= meter.sampled_calls == len(timed) <= 250
    assert meter.sampled_blocks == 3 * meter.sampled_calls
    gaps = {b - a for a, b in itertools.pairwise(timed)}
    assert len(gaps) > 20 and max(gaps) < 2 * SAMPLE_EVERY  # not one fixed stride
    assert meter.snapshot().seconds > 0


def test_an_engine_call_is_counted_once_with_the_agents_work_inside_it() -> None:
    """The queue times ``popleft_n`` and ``append_n``; the EVICT events and the stored
    blocks the agent records inside or beside them (``EngineAgent``) add no call."""
    evictor = WAPolicy()
    ea = EngineAgent(OFFLINE, evictor, capacity=16, engine="vllm", infer=False)
    queue = KvwiseFreeQueue(
        [Blk(i) for i in range(16)], evictor, hooks=ea, engine_time=ea.engine_time
    )
    assert ea.agent.status().engine_calls == 0
    name, code = ea.category("chat", (), 0)
    for r in range(100):
        blocks = queue.popleft_n(4)
        for b in blocks:
            b.block_hash = (r * 16 + b.block_id).to_bytes(32, "big") + bytes(4)
        hashes, offsets, _ = queue.note_stored(blocks, 0, code)
        ea.cached(hashes, offsets, float(r), name)
        queue.append_n(blocks[::-1])
    status = ea.agent.status()
    assert status.engine_calls == 200
    assert 0 < status.engine_sampled_calls < 20
    assert status.engine_sampled_blocks == 4 * status.engine_sampled_calls
    assert status.engine_sampled_ns > 0


def test_the_heartbeat_carries_the_counts_and_an_older_one_reads_zero() -> None:
    counts = {"calls": 6400, "sampled_calls": 100, "sampled_blocks": 400, "sampled_ns": 200_000}
    status = agent_status(**{f"engine_{name}": n for name, n in counts.items()})
    read = AgentStatus.from_json(status.to_json())
    assert read == status
    assert read.engine_time.seconds_per_call == 2e-6
    assert read.engine_time.seconds_per_block == 5e-7
    assert read.engine_time.seconds == pytest.approx(6400 * 2e-6)
    old = {k: v for k, v in json.loads(status.to_json()).items() if not k.startswith("engine_")}
    assert AgentStatus.from_json(json.dumps(old)).engine_time.calls == 0

"""The device (torch) evictor against the CPU ``wa``: same operations, same parameters, same
victims in the same order (invariant 6 of docs/architecture.md). Runs on the CPU
(``simulated``).

The differential tests draw operation scripts with the cases where orders can diverge:
several categories (named, unnamed and negative codes), exact score ties (equal times,
``p_reuse = 0`` giving ``-inf``), offsets in any order, a block named twice in one
release, blocks in use, late timestamps, and parameter swaps between evictions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.device_evictor import DeviceEvictor
from agent.policies.base import EvictionPolicy
from agent.policies.wa import WAPolicy
from agent.policy_document import BUILTIN_POLICY, CategoryParams, PolicyDocument

NAMES = ["chat", "code", "rag"]


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread() -> Any:
    """Tiny tensors: intra-op threads only wait on each other on a shared CPU."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def cp(rate: float, p: float, life: float) -> CategoryParams:
    return CategoryParams(rate=rate, p_reuse=p, life_s=life, source="fit")


params = st.builds(
    cp,
    rate=st.sampled_from([0.01, 0.1, 1.0, 1.0, 7.5]),
    p=st.sampled_from([0.0, 0.2, 0.5, 0.5, 1.0]),
    life=st.sampled_from([0.5, 1.0, 60.0]),
)
docs = st.builds(
    lambda version, cats, default: PolicyDocument(
        version=version, created_at=0.0, categories=cats, default=default
    ),
    version=st.integers(1, 100),
    cats=st.dictionaries(st.sampled_from(NAMES), params, max_size=3),
    default=st.one_of(st.just(BUILTIN_POLICY.default), params),
)
blocks = st.integers(0, 24)
times = st.sampled_from([0.0, 0.0, 0.5, 1.0, 1.0, 2.0, 3.25, 10.0])
codes = st.sampled_from([0, 0, 1, 2, 3, 5, -1])
op = st.one_of(
    st.tuples(st.just("free"), st.lists(blocks, max_size=8), times, codes, st.booleans()),
    st.tuples(st.just("touch"), st.lists(blocks, max_size=5), times),
    st.tuples(st.just("evict"), st.integers(0, 9)),
    st.tuples(st.just("policy"), docs),
    st.tuples(st.just("category"), st.sampled_from([*NAMES, "late"])),
    st.tuples(st.just("flush")),
)


def apply(pol: Any, step: tuple[Any, ...], clock: float) -> Any:
    kind = step[0]
    if kind == "free":
        _, bs, t, code, tail_first = step
        offs: Sequence[int] = range(len(bs) - 1, -1, -1) if tail_first else list(range(len(bs)))
        # Times mostly increase; a smaller one is a late release (stamped with the clock).
        pol.free(bs, offs, clock + t, code)
    elif kind == "touch":
        pol.touch(step[1], clock + step[2])
    elif kind == "evict":
        return pol.evict(step[1])
    elif kind == "policy":
        pol.set_policy(step[1])
    elif kind == "category":
        return pol.add_category(step[1])
    elif kind == "flush" and isinstance(pol, DeviceEvictor):
        pol.flush()
    return None


def run_both(
    script: list[tuple[Any, ...]], attribution: str, initial: int, device: str = "cpu"
) -> None:
    names = NAMES[:initial]
    cpu = WAPolicy(category_names=names, attribution=attribution)  # type: ignore[arg-type]
    dev = DeviceEvictor(8, device=device, category_names=names, attribution=attribution)  # type: ignore[arg-type]
    clock = 0.0
    for i, step in enumerate(script):
        if step[0] in ("free", "touch") and step[2] > 0.0:
            clock += 1.0  # time moves on now and then; repeated times make exact ties
        got_cpu = apply(cpu, step, clock)
        got_dev = apply(dev, step, clock)
        assert got_dev == got_cpu, f"step {i} {step[0]}: device {got_dev} != wa {got_cpu}"
        assert len(dev) == len(cpu)
    assert all((b in dev) == (b in cpu) for b in range(26))
    # Drain: the whole remaining order agrees.
    assert dev.evict(100) == cpu.evict(100)
    assert len(dev) == len(cpu)


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(script=st.lists(op, max_size=40), initial=st.integers(0, 3))
def test_same_victims_as_wa_last_attribution(script: list[tuple[Any, ...]], initial: int) -> None:
    run_both(script, "last", initial)


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(script=st.lists(op, max_size=40), initial=st.integers(0, 3))
def test_same_victims_as_wa_creator_attribution(
    script: list[tuple[Any, ...]], initial: int
) -> None:
    run_both(script, "creator", initial)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(script=st.lists(op, max_size=40), initial=st.integers(0, 3))
def test_same_victims_as_wa_on_cuda(script: list[tuple[Any, ...]], initial: int) -> None:
    """The same differential test with the tensors on the GPU (no fused multiply-add may
    change a score)."""
    run_both(script, "last", initial, device="cuda")


@settings(max_examples=40, deadline=None)
@given(
    n_req=st.integers(1, 40),
    seed=st.integers(0, 2**32 - 1),
    evict_n=st.sampled_from([1, 16, 256]),
)
def test_same_victims_on_a_larger_prefix_workload(n_req: int, seed: int, evict_n: int) -> None:
    """Requests sharing prefixes, released tail first, evicting in big batches."""
    import random

    rng = random.Random(seed)
    d = PolicyDocument(
        version=1,
        created_at=0.0,
        categories={"chat": cp(0.05, 0.6, 30.0), "code": cp(1.0, 0.3, 5.0)},
    )
    cpu = WAPolicy(category_names=["chat", "code"], doc=d)
    dev = DeviceEvictor.simulated(64, category_names=["chat", "code"], doc=d)
    now = 0.0
    for r in range(n_req):
        now += rng.choice([0.0, 0.1, 1.0])
        base = rng.randrange(4) * 1000
        req = [base + i for i in range(rng.randrange(1, 30))]
        req += [10_000 + r * 100 + i for i in range(rng.randrange(0, 30))]
        code = rng.randrange(3)
        for pol in (cpu, dev):
            pol.touch([b for b in req if b in pol], now)
            pol.free(req[::-1], range(len(req) - 1, -1, -1), now, code)
        if r % 3 == 2:
            assert dev.evict(evict_n) == cpu.evict(evict_n)
    assert dev.evict(10_000) == cpu.evict(10_000)


def test_is_an_eviction_policy_and_grows_past_its_capacity() -> None:
    dev = DeviceEvictor.simulated(2)
    assert isinstance(dev, EvictionPolicy)
    dev.free([5, 6, 7, 8], range(3, -1, -1), 1.0, 0)
    dev.touch([9], 1.0)
    assert len(dev) == 5 and dev.capacity >= 5
    assert 9 in dev and 4 not in dev
    # Tail first among equal times; the block in use never goes.
    assert dev.evict(10) == [5, 6, 7, 8]
    assert len(dev) == 1 and dev.evict(1) == []


def test_set_policy_changes_the_next_eviction_and_rejects_non_documents() -> None:
    slow_first = PolicyDocument(
        version=1, categories={"a": cp(0.01, 0.5, 10.0), "b": cp(1.0, 0.5, 10.0)}
    )
    dev = DeviceEvictor.simulated(4, category_names=["a", "b"])
    dev.free([1], [0], 0.0, 0)  # a, older
    dev.free([2], [0], 5.0, 1)  # b, newer
    dev.touch([], 10.0)
    dev.set_policy(slow_first)
    # b decays 100x faster: its newer block is the less likely to be reused.
    assert dev.evict(1) == [2]
    assert dev.policy is slow_first
    with pytest.raises(TypeError):
        dev.set_policy({"version": 2})  # type: ignore[arg-type]


def test_zero_reuse_probability_ties_break_by_age_then_offset() -> None:
    never = PolicyDocument(version=1, default=cp(1.0, 0.0, 1.0))
    dev = DeviceEvictor.simulated(8, doc=never)
    dev.free([1, 2], [0, 1], 1.0, 0)
    dev.free([3, 4], [1, 0], 0.0, 0)  # late: stamped with the clock (1.0)
    # All scores -inf, all t = 1.0: larger offset first, then release order.
    assert dev.evict(4) == [2, 3, 1, 4]


def test_an_empty_release_still_moves_the_clock() -> None:
    """Found by the differential test: ``wa`` ticks its clock on ``free([])`` too."""
    run_both(
        [
            ("free", [], 2.0, 0, False),
            ("free", [2], 0.0, 0, False),
            ("free", [0, 1], 0.5, 0, False),
        ],
        "last",
        0,
    )
    run_both(
        [
            ("free", [1], 2.0, 0, False),
            ("free", [], 0.5, 0, False),
            ("free", [0, 0], 0.0, 0, False),
        ],
        "last",
        0,
    )


def test_agent_with_reuse_classes_evicts_the_same_on_the_device_evictor() -> None:
    """Reuse classes reach the device evictor as category codes: an agent driving it
    evicts exactly what an agent driving ``wa`` does (same document, same requests)."""
    from agent.runtime.agent import Agent
    from agent.settings import AgentSettings

    settings = AgentSettings(
        redis_url="redis://127.0.0.1:9/0", worker_id="t", reuse_classes=True, buffer_events=4096
    )
    doc = PolicyDocument(
        version=1,
        categories={"a": cp(0.5, 0.9, 0.1), "a/re": cp(0.5, 0.05, 0.1), "b/re": cp(0.05, 0.9, 0.1)},
    )
    agents = [
        Agent(settings, capacity=12, policy=WAPolicy(doc=doc)),
        Agent(settings, capacity=12, policy=DeviceEvictor.simulated(12, doc=doc)),
    ]
    victims = drive(agents, requests=300)
    assert victims[0] == victims[1] and len(victims[0]) > 200
    assert agents[1].policy.category_names == agents[0].policy.category_names
    assert {"a/re", "b/re"} <= set(agents[0].policy.category_names)
    for agent in agents:
        agent.close()


def drive(agents: Sequence[Any], requests: int) -> list[list[int]]:
    """The same requests through each agent (two categories, blocks shared across
    requests), evicting down to capacity after each: each agent's victims in order."""
    victims: list[list[int]] = [[] for _ in agents]
    for r in range(requests):
        blocks = [(r * 7 + i * 3) % 41 for i in range(1 + r % 5)]
        for agent, out in zip(agents, victims, strict=True):
            found = [b for b in blocks if b in agent.policy]
            agent.touch(found, float(r), "ab"[r % 2])
            agent.free(blocks[::-1], range(len(blocks) - 1, -1, -1), float(r), "ab"[r % 2])
            out += agent.evict(len(agent.policy) - agent.capacity, float(r))
    return victims


def test_an_agent_configured_with_device_runs_the_device_evictor_and_evicts_as_wa() -> None:
    """``KVWISE_EVICTOR=device`` (``kvwise worker --policy device``) built the CPU ``wa``:
    only the vLLM integration built the torch evictor. The agent builds it too, on
    ``KVWISE_DEVICE``, and its victims are ``wa``'s."""
    from agent.runtime.agent import Agent
    from agent.settings import AgentSettings

    settings = AgentSettings(redis_url="redis://127.0.0.1:9/0", worker_id="t", device="cpu")
    agents = [
        Agent(settings.model_copy(update={"evictor": evictor}), capacity=12)
        for evictor in ("wa", "device")
    ]
    assert type(agents[0].policy) is WAPolicy
    assert type(agents[1].policy) is DeviceEvictor
    assert agents[1].policy.device == torch.device("cpu")
    assert agents[1].family == "wa"  # the family it reports: the torch one is wa's order
    victims = drive(agents, requests=300)
    assert victims[0] == victims[1] and len(victims[0]) > 200
    for agent in agents:
        agent.close()

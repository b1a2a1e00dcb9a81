"""The to-B generative model: applications calling an OpenAI-compatible API (trace B).

Owns ``ToBKnobs``, with its app classes, and ``generate_to_b``. Programs, not people, send
these requests, so nearly all of them are single-turn (a stateless API call carries its
whole context, so an agent's tenth call is still ``turn 1``). Each part of the model is
there to reproduce a finding of the paper; in brackets, the finding it answers to, as
docs/traces.md ("What the paper found") lists them ("Synthetic traces" there gives
targets, tolerances and measured values):

- *Plain* apps (most traffic, Zipf popularity): a short per-app system prompt, or none,
  and a unique user input. A hot app reuses its system prompt every few hundred
  milliseconds or faster [hits from single-turn requests: shared system prompts,
  > 10 QPS; a hot app passes 10 QPS once ``qps`` is about 70 or more].
- *Templated* apps: a long per-app prompt (few-shot examples, a knowledge base) sent with
  every call: a few percent of the requests, most of the hits [skew: 4 % of requests give
  90 % of hits; ideal hit ratio 54 %].
- *Batch* apps fan one long document out to several calls (one per question) submitted
  within tens of milliseconds: reused at once, then never again [lifespan: 90 % by
  0.3 s; reuse 80 % within 10 s].
- *Agent* apps chain calls, each the previous prompt plus the previous answer plus a tool
  result, seconds apart [the reuse times between the burst and the system prompt].
- A few chat apps (type ``text``) see a rare second turn [multi-turn < 0.1 %].

It must never build a ``Trace`` itself (``TraceBuilder`` does) or use global randomness.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from controlplane.traces.arrays import F64, I64
from controlplane.traces.synth_build import TraceBuilder
from controlplane.traces.synth_knobs import ProfileKnobs, lognormal_tokens


@dataclass(frozen=True)
class AppClass:
    """One kind of application in the to-B model."""

    task_share: float
    """Share of tasks (one call, a fan-out, or an agent chain) from this class."""
    apps: int
    """Number of apps of the class; their popularity is Zipf (rank^-zipf)."""
    system_prompt: tuple[float, float]
    """(mean, sigma) lognormal tokens of an app's system prompt."""
    system_prompt_share: float
    """Share of the class's apps that have a system prompt."""
    user_input: tuple[float, float]
    """(mean, sigma) of the unique tokens each call adds."""


@dataclass(frozen=True)
class PlainApps(AppClass):
    """The plain apps; some are chat apps, whose calls may get a second turn."""

    text_share: float = 0.15
    """Share of the apps whose calls are typed ``text`` (the rest ``api``)."""
    p_next_text: float = 0.001
    """Probability that a ``text`` call gets a second turn."""
    next_delay_s: float = 60.0
    """Mean (exponential) delay of that second turn."""


@dataclass(frozen=True)
class BatchApps(AppClass):
    """The batch apps: each task fans one long document out to several calls."""

    document: tuple[float, float] = (20_000.0, 0.4)
    """(mean, sigma) tokens of a fanned-out document."""
    extra_calls: float = 2.0
    """A fan-out sends 2 + Poisson(this) calls."""
    spread_s: float = 0.05
    """Mean (exponential) offset of each fanned-out call from the task's start."""


@dataclass(frozen=True)
class AgentApps(AppClass):
    """The agent apps: each task is a chain of calls, each extending the previous one."""

    steps: float = 4.0
    """Mean calls per chain (geometric)."""
    gap_s: float = 2.0
    """Mean (exponential) time between a chain's calls."""


@dataclass(frozen=True)
class ToBKnobs(ProfileKnobs):
    """Every number of the to-B model, beside the ones every profile has (``ProfileKnobs``);
    defaults are the calibrated ones."""

    output: tuple[float, float] = (250.0, 1.0)
    warmup_s: float = 120.0
    plain: PlainApps = PlainApps(0.968, 300, (100.0, 0.7), 0.6, (500.0, 1.1))
    templated: AppClass = AppClass(0.015, 3, (14_000.0, 0.3), 1.0, (400.0, 1.0))
    batch: BatchApps = BatchApps(0.011, 20, (300.0, 1.0), 1.0, (80.0, 0.8))
    agent: AgentApps = AgentApps(0.006, 30, (800.0, 0.8), 1.0, (300.0, 1.0))
    zipf: float = 1.0
    """Exponent of the apps' Zipf popularity within a class."""


def generate_to_b(
    builder: TraceBuilder, rng: np.random.Generator, duration_s: float, qps: float, k: ToBKnobs
) -> None:
    """Add a to-B workload of about ``qps`` requests per second to ``builder``."""
    per_task = (
        k.plain.task_share * (1 + k.plain.text_share * k.plain.p_next_text)
        + k.templated.task_share
        + k.batch.task_share * (2 + k.batch.extra_calls)
        + k.agent.task_share * k.agent.steps
    )
    span = duration_s + k.warmup_s
    task_rate = qps / per_task
    api, text = builder.type_names.index("api"), builder.type_names.index("text")

    def tasks(c: AppClass, text_share: float = 0.0) -> tuple[I64, F64, I64]:
        """(system prompt node of each task's app or -1, start times, type codes)."""
        sys_nodes = _system_prompts(builder, rng, k, c)
        app_type = np.where(rng.random(c.apps) < text_share, text, api)
        n = int(rng.poisson(c.task_share * task_rate * span))
        weight = 1.0 / np.arange(1, c.apps + 1) ** k.zipf
        app = rng.choice(c.apps, size=n, p=weight / weight.sum())
        start = rng.uniform(-k.warmup_s, duration_s, n)
        return sys_nodes[app], start, app_type[app].astype(np.int64)

    parent, start, ty = tasks(k.plain, k.plain.text_share)
    first = _single_calls(builder, rng, k, k.plain, parent, start, ty)
    _second_turns(builder, rng, k, first, ty == text, duration_s)
    _single_calls(builder, rng, k, k.templated, *tasks(k.templated))
    _fan_outs(builder, rng, k, *tasks(k.batch))
    _agent_chains(builder, rng, k, *tasks(k.agent))


def _system_prompts(
    builder: TraceBuilder, rng: np.random.Generator, k: ToBKnobs, c: AppClass
) -> I64:
    """One template per app with a system prompt; -1 for apps without one."""
    has = rng.random(c.apps) < c.system_prompt_share
    length = lognormal_tokens(rng, *c.system_prompt, c.apps, k.max_context // 2)
    nodes = np.full(c.apps, -1, dtype=np.int64)
    m = int(has.sum())
    nodes[has] = builder.templates(
        parent=np.full(m, -1), shared=np.zeros(m, dtype=np.int64), length=length[has]
    )
    return nodes


def _prefix(builder: TraceBuilder, parent: I64) -> I64:
    return np.where(parent >= 0, builder.forest.lengths[np.maximum(parent, 0)], 0)


def _single_calls(
    builder: TraceBuilder,
    rng: np.random.Generator,
    k: ToBKnobs,
    c: AppClass,
    parent: I64,
    start: F64,
    ty: I64,
) -> tuple[I64, I64, F64, I64]:
    """One call per task: system prompt + unique input. Returns (nodes, length, time,
    output) for follow-ups."""
    n = len(parent)
    prefix = _prefix(builder, parent)
    length = prefix + lognormal_tokens(rng, *c.user_input, n, k.max_context // 2)
    out = k.output_tokens(rng, n)
    nodes = builder.requests(
        parent=parent,
        shared=prefix,
        length=length,
        time=start,
        type_code=ty,
        output=out,
    )
    return nodes, length, start, out


def _second_turns(
    builder: TraceBuilder,
    rng: np.random.Generator,
    k: ToBKnobs,
    first: tuple[I64, I64, F64, I64],
    is_text: NDArray[np.bool_],
    duration_s: float,
) -> None:
    nodes, length, time, out = first
    go = is_text & (rng.random(len(nodes)) < k.plain.p_next_text)
    t2 = time + rng.exponential(k.plain.next_delay_s, len(nodes))
    new = lognormal_tokens(rng, *k.plain.user_input, len(nodes), k.max_context // 2)
    live = go & (t2 < duration_s)
    m = int(live.sum())
    builder.requests(
        parent=nodes[live],
        shared=length[live],
        length=(length + out + new)[live],
        time=t2[live],
        type_code=np.full(m, builder.type_names.index("text")),
        turn=2,
        output=k.output_tokens(rng, m),
        prev_turn=nodes[live],
    )


def _fan_outs(
    builder: TraceBuilder, rng: np.random.Generator, k: ToBKnobs, parent: I64, start: F64, ty: I64
) -> None:
    """Each task: a document template under the app's prompt, then 2+ calls on it."""
    n = len(parent)
    prefix = _prefix(builder, parent)
    doc = prefix + lognormal_tokens(rng, *k.batch.document, n, k.max_context // 2)
    docs = builder.templates(parent=parent, shared=prefix, length=doc)
    calls = 2 + rng.poisson(k.batch.extra_calls, n)
    task = np.repeat(np.arange(n), calls)
    m = len(task)
    length = doc[task] + lognormal_tokens(rng, *k.batch.user_input, m, 4096)
    builder.requests(
        parent=docs[task],
        shared=doc[task],
        length=length,
        time=start[task] + rng.exponential(k.batch.spread_s, m),
        type_code=ty[task],
        output=k.output_tokens(rng, m),
    )


def _agent_chains(
    builder: TraceBuilder, rng: np.random.Generator, k: ToBKnobs, parent: I64, start: F64, ty: I64
) -> None:
    """Each task: calls that each extend the previous prompt with its answer and a tool
    result; every call is a fresh single-turn API request."""
    nodes, length, time, out = _single_calls(builder, rng, k, k.agent, parent, start, ty)
    steps = rng.geometric(1.0 / k.agent.steps, len(nodes))
    step = 1
    while len(nodes):
        n = len(nodes)
        new_time = time + rng.exponential(k.agent.gap_s, n)
        new_len = length + out + lognormal_tokens(rng, *k.agent.user_input, n, 8192)
        new_out = k.output_tokens(rng, n)
        live = (steps > step) & (new_len <= k.max_context)
        nodes = builder.requests(
            parent=nodes[live],
            shared=length[live],
            length=new_len[live],
            time=new_time[live],
            type_code=ty[live],
            output=new_out[live],
        )
        length, time, out, ty, steps = (
            new_len[live],
            new_time[live],
            new_out[live],
            ty[live],
            steps[live],
        )
        step += 1

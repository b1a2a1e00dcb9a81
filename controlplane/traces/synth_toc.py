"""The to-C generative model: people chatting with a consumer assistant (paper's trace A).

Owns ``ToCKnobs`` and ``generate_to_c``. Each part of the model is there to reproduce a
finding of the paper; in brackets, the finding it answers to, as docs/traces.md ("What the
paper found") lists them ("Synthetic traces" there gives every target, its tolerance and
the measured value; the paper's figure numbers were not checked against the PDF, so
findings are named instead):

- Conversations start as a Poisson process; each belongs to a user drawn with a Pareto
  activity weight, so a few heavy users start many [skew; "reuse is mostly within one
  user", the paper's Fig. 6 heat map].
- A conversation's type is drawn from ``share`` [multi-turn share: text 78 % of
  requests]. Its next turn follows with probability ``p_next_first`` after turn 1 and
  ``p_next_later`` after later turns [next-turn probability 0.5 / 0.8], after an
  exponential delay whose mean depends on type and turn [reuse time; "per category the
  reuse time follows an exponential distribution"]: text within a minute, image a little
  later, file and search slower.
- A next turn's prompt is the previous prompt, the previous answer and the new input, so
  it inherits every full block of the previous prompt. Search and file turns are the
  exception: fresh search results, or the document passages retrieved for the new
  question, replace the previous ones, so the follow-up shares only the conversation
  history before them ["file and search requests show almost none" of the reuse].
- The app keeps at most ``history_limit`` tokens of conversation: past it, the oldest
  turns go and the prompt shares only its system prompt with the previous one [ideal hit
  ratio 62 %; without it long conversations push it past 0.7].
- Every first turn starts with its type's short platform system prompt (the only
  cross-user sharing); some users' text chats start with their own persona prompt,
  reused across their conversations. A few answers are regenerated: the same prompt is
  sent again seconds later [single-turn reuse].
- Token lengths are lognormal around the paper's means [public trace A: input 2,338,
  output 430 tokens]; a conversation whose prompt would pass ``max_context`` ends.

It must never build a ``Trace`` itself (``TraceBuilder`` does) or use global randomness.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from controlplane.traces.arrays import F64, I64
from controlplane.traces.synth_build import TraceBuilder
from controlplane.traces.synth_knobs import ProfileKnobs, lognormal_tokens


@dataclass(frozen=True)
class TypeKnobs:
    """One request type of the to-C model."""

    share: float
    """Share of conversations of this type."""
    platform_prompt: int
    """Tokens of the type's platform system prompt, shared by every user."""
    first_input: tuple[float, float]
    """(mean, sigma) of the lognormal new tokens of a first turn (question + attachment)."""
    followup_input: tuple[float, float]
    """(mean, sigma) of the lognormal new tokens of a later turn."""
    delay_first_s: float
    """Mean of the exponential delay from turn 1 to turn 2."""
    delay_later_s: float
    """Mean of the exponential delay between later turns."""
    volatile: bool = False
    """New content (search results, retrieved passages) is replaced next turn; only the
    question stays in the history."""


@dataclass(frozen=True)
class UserKnobs:
    """The users of the to-C model: who starts each conversation, and with which prompt."""

    sessions: float = 4.0
    """Mean conversations per user; sets the number of users."""
    pareto_alpha: float = 1.2
    """Shape of the users' Pareto activity weights (smaller: a few heavier users)."""
    persona_share: float = 0.3
    """Share of users with a persona prompt."""
    persona_use: float = 0.8
    """Probability that such a user's text conversation starts with the persona."""
    persona_tokens: tuple[float, float] = (500.0, 0.8)
    """(mean, sigma) of the lognormal tokens of a persona prompt."""


@dataclass(frozen=True)
class ToCKnobs(ProfileKnobs):
    """Every number of the to-C model, beside the ones every profile has (``ProfileKnobs``);
    defaults are the calibrated ones."""

    output: tuple[float, float] = (430.0, 0.9)
    warmup_s: float = 1800.0
    types: dict[str, TypeKnobs] = field(
        default_factory=lambda: {
            "text": TypeKnobs(0.78, 32, (500.0, 1.6), (60.0, 1.2), 40.0, 60.0),
            "search": TypeKnobs(0.08, 64, (2000.0, 0.5), (2000.0, 0.5), 120.0, 150.0, True),
            "image": TypeKnobs(0.07, 32, (1300.0, 0.4), (80.0, 1.0), 60.0, 90.0),
            "file": TypeKnobs(0.07, 48, (3000.0, 0.8), (3000.0, 0.8), 150.0, 200.0, True),
        }
    )
    p_next_first: float = 0.5
    p_next_later: float = 0.8
    history_limit: int = 8192
    """Tokens of conversation an app keeps; past it, it keeps the newest half."""
    users: UserKnobs = UserKnobs()
    regenerate: float = 0.03
    """Probability that a request is sent again (regenerated answer)."""
    regenerate_delay_s: float = 20.0
    kept_question: int = 40
    """Tokens of a volatile (search) turn's new content that stay in the history."""


@dataclass
class _Turn:
    """The last request of every live conversation."""

    session: I64
    type_code: I64
    time: F64
    length: I64
    head: I64
    prefix: I64
    new: I64
    output: I64
    node: I64


def generate_to_c(
    builder: TraceBuilder, rng: np.random.Generator, duration_s: float, qps: float, k: ToCKnobs
) -> None:
    """Add a to-C workload of about ``qps`` requests per second to ``builder``."""
    names = builder.type_names
    tk = [k.types[t] for t in names]
    share = np.array([t.share for t in tk])
    turns_per_session = 1 + k.p_next_first / (1 - k.p_next_later)
    rate = qps / (turns_per_session * (1 + k.regenerate))
    span = duration_s + k.warmup_s
    n_sessions = int(rng.poisson(rate * span))
    start = np.sort(rng.uniform(-k.warmup_s, duration_s, n_sessions))
    stype = rng.choice(len(names), size=n_sessions, p=share / share.sum()).astype(np.int64)

    parent = _first_turn_parents(builder, rng, k, stype)
    prefix = builder.forest.lengths[parent]
    fin = np.array([t.first_input for t in tk])
    new = lognormal_tokens(rng, fin[stype, 0], fin[stype, 1], n_sessions, k.max_context // 2)
    out = k.output_tokens(rng, n_sessions)
    length = prefix + new
    volatile = np.array([t.volatile for t in tk])
    first = np.full(1, -1, dtype=np.int64)  # no previous turn
    nodes = _add(builder, rng, k, parent, prefix, length, start, stype, 1, out, first)
    turn = _Turn(
        session=np.arange(n_sessions, dtype=np.int64),
        type_code=stype,
        time=start,
        length=length,
        head=np.where(volatile[stype], prefix, length),
        prefix=prefix,
        new=new,
        output=out,
        node=nodes,
    )
    _later_turns(builder, rng, k, turn, duration_s)


def _first_turn_parents(
    builder: TraceBuilder, rng: np.random.Generator, k: ToCKnobs, stype: I64
) -> I64:
    """Templates (platform prompts, personas) and the one each conversation starts from."""
    names, u = builder.type_names, k.users
    n_sessions = len(stype)
    n_users = max(1, round(n_sessions / u.sessions))
    weight = rng.pareto(u.pareto_alpha, n_users) + 1
    user = rng.choice(n_users, size=n_sessions, p=weight / weight.sum())
    has_persona = rng.random(n_users) < u.persona_share
    persona_len = lognormal_tokens(rng, *u.persona_tokens, n_users, k.max_context // 4)

    platform_len = np.array([k.types[t].platform_prompt for t in names], dtype=np.int64)
    none = np.full(len(names), -1, dtype=np.int64)
    platform = builder.templates(parent=none, shared=none * 0, length=platform_len)
    text = names.index("text")
    persona_users = np.flatnonzero(has_persona)
    persona_node = np.full(n_users, -1, dtype=np.int64)
    persona_node[persona_users] = builder.templates(
        parent=np.full(len(persona_users), platform[text]),
        shared=np.full(len(persona_users), platform_len[text]),
        length=platform_len[text] + persona_len[persona_users],
    )

    use_persona = (stype == text) & has_persona[user] & (rng.random(n_sessions) < u.persona_use)
    return np.where(use_persona, persona_node[user], platform[stype])


def _later_turns(
    builder: TraceBuilder, rng: np.random.Generator, k: ToCKnobs, turn: _Turn, duration_s: float
) -> None:
    tk = [k.types[t] for t in builder.type_names]
    volatile = np.array([t.volatile for t in tk])
    delay = np.array([[t.delay_first_s, t.delay_later_s] for t in tk])
    fin = np.array([t.followup_input for t in tk])
    number = 2
    while len(turn.session):
        n = len(turn.session)
        p = k.p_next_first if number == 2 else k.p_next_later
        go = rng.random(n) < p
        ty = turn.type_code
        time = turn.time + rng.exponential(1.0, n) * delay[ty, 0 if number == 2 else 1]
        new = lognormal_tokens(rng, fin[ty, 0], fin[ty, 1], n, k.max_context // 2)
        out = k.output_tokens(rng, n)
        vol = volatile[ty]
        # A volatile turn keeps only its question; otherwise the head is the whole prompt.
        kept = np.where(vol, np.minimum(turn.new, k.kept_question), 0)
        head = turn.head + kept + turn.output
        shared = np.where(vol, turn.head, turn.length)
        # Past the history limit the app drops the oldest turns: the prompt then shares
        # only its system prompt with the previous one.
        cut = head > k.history_limit
        head = np.where(cut, turn.prefix + k.history_limit // 2, head)
        shared = np.where(cut, turn.prefix, shared)
        length = head + new
        live = go & (time < duration_s) & (length <= k.max_context)
        nodes = _add(
            builder,
            rng,
            k,
            turn.node[live],
            shared[live],
            length[live],
            time[live],
            ty[live],
            number,
            out[live],
            turn.node[live],
        )
        turn = _Turn(
            session=turn.session[live],
            type_code=ty[live],
            time=time[live],
            length=length[live],
            head=np.where(vol, head, length)[live],
            prefix=turn.prefix[live],
            new=new[live],
            output=out[live],
            node=nodes,
        )
        number += 1


def _add(
    builder: TraceBuilder,
    rng: np.random.Generator,
    k: ToCKnobs,
    parent: I64,
    shared: I64,
    length: I64,
    time: F64,
    type_code: I64,
    number: int,
    output: I64,
    prev_turn: I64,
) -> I64:
    """Add one turn's requests and their regenerations; return the requests' nodes."""
    n = len(parent)
    prev = np.broadcast_to(prev_turn, (n,)) if number == 1 else prev_turn
    nodes = builder.requests(
        parent=parent,
        shared=shared,
        length=length,
        time=time,
        type_code=type_code,
        turn=number,
        output=output,
        prev_turn=prev,
    )
    again = rng.random(n) < k.regenerate
    m = int(again.sum())
    builder.requests(
        parent=nodes[again],
        shared=length[again],
        length=length[again],
        time=time[again] + rng.exponential(k.regenerate_delay_s, m),
        type_code=type_code[again],
        turn=number,
        output=k.output_tokens(rng, m),
        prev_turn=prev[again],
        copy=np.ones(m, dtype=bool),
    )
    return nodes

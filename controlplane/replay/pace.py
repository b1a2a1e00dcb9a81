"""``wa-pace``, replay only: a conversation's own pace scales its category's reuse rate.

Owns ``ConversationPace`` (per conversation: its turns' time gaps so far, each in units of
the mean gap of the category it closed), the pace class rule (``pace_class``),
``PacedWA`` (``wa``'s evictor over pace classes) and ``fitted_wa_pace``.

The model: a conversation's reuse rate is its category's fitted rate ``a_w`` times a
factor ``lambda`` of its own, drawn once per conversation from a gamma law of mean 1
and shape ``prior_gaps`` (worth that many gaps of the category's mean). After ``m`` gaps
``g_i`` (time from one of its requests to its next), each closing a request of category
``w_i`` whose gaps (over every conversation, so far) average ``G_{w_i}``, the posterior
mean of ``lambda`` is ``(prior_gaps + m) / (prior_gaps + sum(g_i / G_{w_i}))``: a
conversation whose turns came faster than its categories' usual gets a larger rate
(reused sooner, or likelier not at all once idle), a slow one a smaller. Gaps are scaled
by the categories' mean turn gaps, not by the fitted block reuse rates: those also count
reuses across conversations (a shared system prompt), which made every scaled gap too
long in a first try on seed 7 (mean 1.5 where 1 was due). The factor is rounded to a half octave
(``2^(j/2)``, ``j`` within ``+-PACE_STEPS``) and the request's blocks are filed under
category ``w@pJ`` (``J = j + PACE_STEPS``), whose constants are ``w``'s curve with its rate
times ``2^(j/2)`` (``p_w`` and ``L_w`` unchanged). Each class is one time-ordered queue
with one ``(lc, a)``, so the key of ``agent.policies.wa_core`` and its per-queue
monotonicity hold as they are; only the base categories are fitted.

A conversation is a chain of requests through the trace's ``parent_chat_id`` (a request
whose parent is not in the trace starts one; a regenerated answer belongs to its
original's conversation). A trace without parents (Mooncake) gives every request class
``j = 0``: ``wa``'s victims. It files by no reuse or depth class. The agent does not run
this: docs/policy.md ("A better wa") says what it measured. It must never do I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import cached_property

from agent.policies.wa import WAPolicy
from agent.policies.wa_core import Const, log_weight
from agent.policy_document import BUILTIN_POLICY
from controlplane.replay.online import FittedReplayPolicy, FittedSetup, Refits, Refitter
from controlplane.replay.options import ReplayOptions
from controlplane.traces.model import Trace

PACE_STEPS = 6
"""Half octaves a conversation's rate factor may move either way (``2^-3`` to ``2^3``)."""
PACE_MARK = "@p"
"""Separates a category's name from its pace class: ``text_2@p6``."""
PRIOR_GAPS = 16.0
"""The gamma prior's weight, in gaps of the category's mean: the best of 1, 4 and 16 on seed
7 (docs/policy.md, "A better wa"), where every one of them was below ``wa``."""


def pace_class(gaps: int, scaled_sum: float, prior_gaps: float) -> int:
    """The pace class (``0 .. 2 PACE_STEPS``) of a conversation that has shown ``gaps``
    gaps summing ``scaled_sum`` category mean gaps."""
    if prior_gaps <= 0:
        raise ValueError(f"prior_gaps must be positive, got {prior_gaps}")
    factor = (prior_gaps + gaps) / (prior_gaps + scaled_sum)
    step = round(2.0 * math.log2(factor))
    return min(max(step, -PACE_STEPS), PACE_STEPS) + PACE_STEPS


def class_factor(pace: int) -> float:
    """The rate factor of pace class ``pace``."""
    return math.pow(2.0, (pace - PACE_STEPS) / 2.0)


def pace_names(names: Sequence[str]) -> tuple[str, ...]:
    """Every category of ``names`` in every pace class: code ``w + K * class``."""
    classes = range(2 * PACE_STEPS + 1)
    return tuple(f"{n}{PACE_MARK}{c}" for c in classes for n in names)


def conversations(trace: Trace) -> list[int]:
    """Per request, its conversation: the index of the conversation's first request in
    the trace (its own when its parent is not an earlier request of the trace)."""
    first_of_chat: dict[int, int] = {}
    out: list[int] = []
    for r, (chat, parent) in enumerate(
        zip(trace.chat_ids.tolist(), trace.parent_chat_ids.tolist(), strict=True)
    ):
        root = first_of_chat.get(parent, r) if parent >= 0 else r
        out.append(root)
        if chat >= 0:
            first_of_chat.setdefault(chat, root)
    return out


class ConversationPace:
    """Each conversation's last request (its time and category) and its gaps so far, in
    units of the mean gap that closed a request of the same category (over every
    conversation, the gaps seen so far, this one included)."""

    def __init__(self, prior_gaps: float) -> None:
        pace_class(0, 0.0, prior_gaps)  # refuses a prior that is not positive
        self.prior_gaps = prior_gaps
        self._last: dict[int, tuple[float, int]] = {}
        self._gaps: dict[int, tuple[int, float]] = {}
        self._category_gaps: dict[int, tuple[int, float]] = {}

    def scaled_gap(self, gap: float, category: int) -> float:
        """``gap``, closing a request of ``category``, over that category's mean gap."""
        count, total = self._category_gaps.get(category, (0, 0.0))
        count, total = count + 1, total + gap
        self._category_gaps[category] = (count, total)
        return gap * count / total if total > 0 else 1.0

    def arrive(self, conversation: int, t: float, category: int) -> int:
        """A request of ``conversation`` at ``t``, of ``category``: the gap since its
        last request is seen; returns the request's pace class."""
        gaps, scaled = self._gaps.get(conversation, (0, 0.0))
        last = self._last.get(conversation)
        if last is not None:
            last_t, last_category = last
            gaps += 1
            scaled += self.scaled_gap(max(t - last_t, 0.0), last_category)
            self._gaps[conversation] = (gaps, scaled)
        self._last[conversation] = (t, category)
        return pace_class(gaps, scaled, self.prior_gaps)


class PacedWA(WAPolicy):
    """``wa`` over pace classes: ``w@pJ`` takes ``w``'s curve with its rate times
    ``class_factor(J)``; a name without a pace mark is its own category."""

    __slots__ = ()

    def _const_of(self, name: str | None) -> Const:
        if name is None:
            return log_weight(self._doc.default)
        base, mark, pace = name.rpartition(PACE_MARK)
        if not (mark and pace.isdigit()):
            return log_weight(self._doc.params_for(name))
        params = self._doc.params_for(base)
        return log_weight(params.model_copy(update={"rate": params.rate * class_factor(int(pace))}))


class PacedReplayPolicy(FittedReplayPolicy):
    """``wa``'s fitted replay whose requests are filed by category and pace class: the
    class is decided when the request arrives, from its conversation's gaps so far."""

    def __init__(self, inner: PacedWA, setup: PaceSetup, refits: Refits) -> None:
        super().__init__(inner, setup, refits)
        self._conversation = setup.conversation
        self._base = setup.names
        self._pace = ConversationPace(setup.prior_gaps)
        self._paced_code = [0] * setup.trace.n_requests

    def arrive(self, request: int) -> None:
        super().arrive(request)
        code = self.request_code(request)
        t = self.setup.times[request]
        pace = self._pace.arrive(self._conversation[request], t, code)
        self._paced_code[request] = code + len(self._base) * pace if code >= 0 else code

    def free_request(
        self, request: int, blocks: Sequence[int], offsets: Sequence[int], now: float
    ) -> None:
        self.in_force.free(blocks, offsets, now, self._paced_code[request])


@dataclass(frozen=True, eq=False)
class PaceSetup(FittedSetup):
    """``wa``'s setup with ``wa-pace``'s evictor (pace classes of the fitted categories)
    and its conversations; the refitter fits the base categories, as ``wa``'s does."""

    prior_gaps: float = PRIOR_GAPS

    @cached_property
    def conversation(self) -> list[int]:
        return conversations(self.trace)

    def evictor(self, names: Sequence[str], refitter: Refitter) -> PacedWA:
        return PacedWA(
            category_names=pace_names(names), doc=BUILTIN_POLICY, attribution=self.attribution
        )

    def policy(self, shared: Refits | None = None) -> PacedReplayPolicy:
        refits = shared if shared is not None else Refits(self.refitter(self.names), self.cols)
        inner = self.evictor(self.names, refits.refitter)
        return PacedReplayPolicy(inner, self, refits)


PacedFactory = Callable[[int, Trace, ReplayOptions], PacedReplayPolicy]
"""A replay factory (``controlplane.replay.catalog``) of ``wa-pace``."""


def paced_wa(prior_gaps: float = PRIOR_GAPS) -> PacedFactory:
    """``wa-pace`` with the gamma prior worth ``prior_gaps`` gaps."""

    def factory(capacity: int, trace: Trace, options: ReplayOptions) -> PacedReplayPolicy:
        plain = replace(options, reuse_class="off", depth="off")
        setup = PaceSetup.of("wa", trace, plain, None, capacity)
        return replace(setup, prior_gaps=prior_gaps).policy()

    return factory


fitted_wa_pace = paced_wa()
"""``wa-pace`` with the prior chosen on seed 7 (``PRIOR_GAPS``)."""

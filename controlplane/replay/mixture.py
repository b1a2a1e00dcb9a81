"""``wa-mix``, replay only: a two-phase reuse-time model where one exponential fits badly.

Owns the fit of ``F(t) = p (pi (1 - e^{-a1 t}) + (1 - pi) (1 - e^{-a2 t}))`` (an access
is reused with probability ``p``, after a fast phase of rate ``a1`` with weight ``pi`` or a
slow one of rate ``a2``) on a category's binned, censored reuse statistics, the rule that
adopts it (the category's own exposures reach ``MIN_EXPOSURES``, the one-exponential
fit in force is off by at least ``KS_MIN`` in Kolmogorov-Smirnov distance, and the
mixture's log-likelihood beats the one-exponential maximum by more than its two extra
parameters, Akaike's criterion), and ``MixtureWA``, ``wa``'s evictor whose score for a
mixture category is the log of ``F(d + L) - F(d)``:
``log p + log(pi (1 - e^{-a1 L}) e^{-a1 d} + (1 - pi) (1 - e^{-a2 L}) e^{-a2 d})``, still
falling with idle time ``d``, so each category's time-ordered queue keeps its head as
its minimum. Eviction compares the category heads one victim at a time (the agent's
bounds on ``lc - a d`` do not hold for a mixture). Other categories keep ``wa``'s score.
``fitted_wa_mix`` is ``wa``'s fitted replay (``controlplane.replay.online.FittedSetup``)
with this evictor and refitter, so a fleet shares its columns and refits as ``wa``'s
does: each evictor takes the shared refitter's mixtures with each document it applies.
It files by no reuse or depth class (``ReplayOptions.reuse_class`` and ``depth`` are
not used). The agent and the device evictor do not run this: docs/policy.md ("A better wa") says
whether it earned a place there. It must never do I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from heapq import heappop, heappush

import numpy as np
from scipy.optimize import minimize
from scipy.special import expit

from agent.policies.wa import WAPolicy
from agent.policies.wa_core import Attribution
from agent.policies.wa_queue import Entry, Key
from agent.policy_document import BUILTIN_POLICY, PolicyDocument
from controlplane.fit.mle import DEFAULT_RATE_BOUNDS, MixtureFit, censored_ages, clipped_logit
from controlplane.fit.per_category import FitResult
from controlplane.fit.reuse_window import StatsSnapshot
from controlplane.fit.settings import FitSettings
from controlplane.replay.online import CensoredRefitter, FittedReplayPolicy, FittedSetup, Refitter
from controlplane.replay.options import ReplayOptions
from controlplane.traces.arrays import F64
from controlplane.traces.model import Trace

KS_MIN = 0.15
"""A category whose one-exponential fit is off by less is left as it is."""
MIN_EXPOSURES = 1000
"""Exposures a category needs for a mixture of its own (four parameters)."""
MIX_EVERY = 5
"""Mixtures are refitted at every this many published refits (a cost setting of the
replay: they are slow to fit and change slowly); in between, and on a refit that publishes
nothing, the last ones stay."""


@dataclass(frozen=True)
class TwoPhase:
    """One category's mixture: reuse probability, fast-phase weight and the two rates."""

    p: float
    fast_share: float
    fast_rate: float
    slow_rate: float

    def log_reuse_prob(self, idle_s: float, life_s: float) -> float:
        """``log(F(d + L) - F(d))`` (module docstring)."""
        fast = self.fast_share * -math.expm1(-self.fast_rate * life_s)
        slow = (1.0 - self.fast_share) * -math.expm1(-self.slow_rate * life_s)
        a = math.log(fast) - self.fast_rate * idle_s if fast > 0 else -math.inf
        b = math.log(slow) - self.slow_rate * idle_s if slow > 0 else -math.inf
        top = max(a, b)
        if top == -math.inf or self.p <= 0:
            return -math.inf
        return math.log(self.p) + top + math.log1p(math.exp(min(a, b) - top))


def _neg_loglik(x: F64, n: F64, m: F64, lo: F64, w: F64, age: F64) -> float:
    """Minus the log-likelihood of ``x = (logit p, logit pi, log a1, log a2)``."""
    p, share = expit(x[:2])
    a1, a2 = np.exp(x[2:])
    with np.errstate(over="ignore", invalid="ignore"):
        in_bin = share * np.exp(-a1 * lo) * -np.expm1(-a1 * w) + (1 - share) * np.exp(
            -a2 * lo
        ) * -np.expm1(-a2 * w)
        alive = 1 - p + p * (share * np.exp(-a1 * age) + (1 - share) * np.exp(-a2 * age))
    seen = n > 0
    open_ = m > 0
    ll = float(np.sum(n[seen] * (np.log(p) + np.log(np.maximum(in_bin[seen], 1e-300)))))
    ll += float(np.sum(m[open_] * np.log(np.maximum(alive[open_], 1e-300))))
    return -ll


def fit_two_phase(
    observed: F64,
    censored: F64,
    edges: F64,
    shift: float,
    one: MixtureFit,
    *,
    rate_bounds: tuple[float, float] = DEFAULT_RATE_BOUNDS,
) -> tuple[TwoPhase, float]:
    """The maximum-likelihood mixture of one category's row, started from its
    one-exponential maximum ``one`` (the fast phase above it, the slow one below), and the
    log-likelihood it gains over ``one`` on the same data. Both rates keep to
    ``rate_bounds`` (the fitter's ``rate_min``, ``rate_max``)."""
    lo = np.maximum(edges[:-1] - shift, 0.0)
    w = np.maximum(edges[1:] - shift, 0.0) - lo
    age = np.maximum(censored_ages(edges) - shift, 0.0)
    args = (observed.astype(float), censored.astype(float), lo, w, age)
    logit_p = clipped_logit(one.p)
    log_rate = math.log(one.rate)
    single = _neg_loglik(np.array([logit_p, 20.0, log_rate, log_rate]), *args)
    log_lo, log_hi = math.log(rate_bounds[0]), math.log(rate_bounds[1])
    phases = np.clip([log_rate + 1.5, log_rate - 1.5], log_lo, log_hi)
    start = np.array([logit_p, 0.0, *phases])
    bounds = [(-20.0, 20.0), (-20.0, 20.0), (log_lo, log_hi), (log_lo, log_hi)]
    two = minimize(_neg_loglik, start, args=args, method="L-BFGS-B", bounds=bounds)
    p, share = expit(two.x[:2]).tolist()
    fast, slow = np.clip(np.exp(two.x[2:]), *rate_bounds).tolist()
    if fast < slow:
        fast, slow, share = slow, fast, 1.0 - share
    return TwoPhase(p, share, fast, slow), float(single - two.fun)


def mixtures_of(snap: StatsSnapshot, fit: FitResult, settings: FitSettings) -> dict[str, TwoPhase]:
    """The categories of ``fit`` that take a mixture (module docstring's rule), their
    rates within ``settings``' bounds."""
    bounds = (settings.rate_min, settings.rate_max)
    out: dict[str, TwoPhase] = {}
    for code, name in enumerate(snap.categories):
        detail = fit.details.get(name)
        if detail is None or detail.raw is None or detail.exposures < MIN_EXPOSURES:
            continue
        quality = detail.params.fit_quality
        if quality is None or quality < KS_MIN:
            continue
        model, gain = fit_two_phase(
            snap.observed[code],
            snap.censored[code],
            snap.edges,
            snap.near_concurrent_s,
            detail.raw,
            rate_bounds=bounds,
        )
        if gain > 2.0:  # Akaike: two more parameters must buy more than 2 in log-likelihood
            out[name] = model
    return out


class MixtureWA(WAPolicy):
    """``wa`` with two-phase categories (``mixtures``, by name, set with the document):
    with ``fitted``, each ``set_policy`` takes that refitter's mixtures in force. Blocks
    are attributed as ``wa``'s are (``attribution``: the last accessor's category, or
    the creator's)."""

    __slots__ = ("_fitted", "_mix", "mixtures")

    def __init__(
        self,
        *,
        category_names: Sequence[str],
        doc: PolicyDocument,
        fitted: MixtureRefitter | None = None,
        attribution: Attribution | None = None,
    ) -> None:
        super().__init__(category_names=category_names, doc=doc, attribution=attribution)
        self.mixtures: dict[str, TwoPhase] = {}
        self._fitted = fitted
        self._mix: list[TwoPhase | None] = []

    def set_mixtures(self, mixtures: dict[str, TwoPhase]) -> None:
        """For the categories named, use their mixtures from the next ``set_policy`` on."""
        self.mixtures = dict(mixtures)

    def set_policy(self, doc: PolicyDocument) -> None:
        super().set_policy(doc)
        if self._fitted is not None:
            self.set_mixtures(self._fitted.mixtures)

    def _score(self, row: int, stamp: float, now: float) -> float:
        mix = self._mix[row]
        if mix is None:
            log_constant, rate = self._constants[row]
            return log_constant - rate * (now - stamp)
        code = self._rows[row][0]
        name = self._names[code] if 0 <= code < len(self._names) else None
        life = (self._doc.default if name is None else self._doc.params_for(name)).life_s
        return mix.log_reuse_prob(now - stamp, life)

    def evict(self, n: int) -> list[int]:
        """Victims one at a time: the smallest head key of all categories."""
        if n <= 0 or not self._ev:
            return []
        if self._consts_stale:
            self._refresh_consts()
            self._mix = []
        if len(self._mix) != len(self._rows):
            names = self._names
            self._mix = [
                self.mixtures.get(names[code]) if 0 <= code < len(names) else None
                for code, _ in self._rows
            ]
        now, evictable = self._clock, self._ev
        heads: list[Key] = []
        for row, (_, lane) in enumerate(self._rows):
            head = lane.head(evictable)
            if head is not None:
                heappush(heads, self._key(row, head, now))
        victims: list[int] = []
        while heads and len(victims) < n:
            row = heappop(heads)[4]
            lane = self._rows[row][1]
            log_constant, rate = self._constants[row]
            victims += lane.take(evictable, ((log_constant, rate), now, None, None), 1)
            head = lane.head(evictable)
            if head is not None:
                heappush(heads, self._key(row, head, now))
        self._bounds_valid = False
        if self._by_creator:
            self._forget_creators(victims)
        return victims

    def _key(self, row: int, head: Entry, now: float) -> Key:
        stamp, neg_offset, release, _ = head
        return (self._score(row, stamp, now), stamp, neg_offset, release, row)


class MixtureRefitter(CensoredRefitter):
    """``wa``'s refitter that also fits the mixtures of every ``MIX_EVERY``-th published
    refit: ``mixtures`` are those of the last document it gave (a refit that publishes
    nothing leaves them as they are), read by every evictor it feeds (``MixtureWA``)."""

    def __init__(self, names: Sequence[str], settings: FitSettings) -> None:
        super().__init__(names, settings)
        self.mixtures: dict[str, TwoPhase] = {}
        self._refits = 0

    def document(self, now: float, version: int) -> PolicyDocument | None:
        fitted = self.fit(now)
        if fitted is None:
            return None
        snap, fit = fitted
        doc = self.document_of(fit, now, version)
        if doc is None:  # nothing published: the mixtures stay with the document in force
            return None
        if self._refits % MIX_EVERY == 0:
            self.mixtures = mixtures_of(snap, fit, self.settings)
        self._refits += 1
        return doc


class MixtureSetup(FittedSetup):
    """``wa``'s setup (shared by a fleet) with ``wa-mix``'s evictor and refitter."""

    def evictor(self, names: Sequence[str], refitter: Refitter) -> MixtureWA:
        if not isinstance(refitter, MixtureRefitter):
            raise TypeError(f"wa-mix's evictor takes a MixtureRefitter's mixtures, not {refitter}")
        return MixtureWA(
            category_names=names, doc=BUILTIN_POLICY, fitted=refitter, attribution=self.attribution
        )

    def refitter(self, names: Sequence[str]) -> MixtureRefitter:
        return MixtureRefitter(names, self.options.fit_settings(self.trace))


def fitted_wa_mix(capacity: int, trace: Trace, options: ReplayOptions) -> FittedReplayPolicy:
    """``wa-mix``: ``wa`` fitted online (or split), two-phase where the rule says so."""
    plain = replace(options, reuse_class="off", depth="off")
    return MixtureSetup.of("wa", trace, plain, None, capacity).policy()

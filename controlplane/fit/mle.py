"""Maximum-likelihood fit of the censored cure-rate reuse model on binned data.

Owns ``fit_cure_rate`` / ``fit_cure_rate_many``, ``MixtureFit`` and ``clipped_logit``
(the logit of a fitted ``p``, kept finite). The model: an access episode is reused with
probability ``p``, after ``shift + Exp(rate)`` seconds, where ``shift`` is the
near-concurrent threshold (gaps below it were merged away by the stats;
the exponential is memoryless, so only the time beyond it is modelled). Log-likelihood,
in time shifted by ``shift``:

- a reuse gap known to lie in ``[l, l + w)`` contributes
  ``log p - rate l + log(1 - e^{-rate w})``: the exact interval-censored form of
  ``log(p rate e^{-rate t})``, so binning loses nothing on the observed side;
- an exposure still open at age ``c`` contributes ``log(1 - p + p e^{-rate c})``, with
  ``c`` the geometric middle of its age bin (bins are 12 % wide: a small error).

All categories are solved at once: a Levenberg-Marquardt-damped Newton iteration on
``(logit p, log rate)`` with the analytic gradient and Hessian, vectorised over a
``[categories, bins]`` array, so a refit costs a few dozen array passes whatever the number
of categories (a per-category ``scipy.optimize.minimize`` costs milliseconds each).

It must never do I/O or know about categories' names, settings or the policy document.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict, Unpack

import numpy as np
from numpy.typing import NDArray
from scipy.special import expit, logit

from controlplane.traces.arrays import F64, I64

LOGIT_BOUND = 20.0
"""p is kept in ``[expit(-20), expit(20)]`` (2e-9 from 0 and 1): no data tells it apart."""

P_CLIP = 1e-6
"""A fitted p is kept this far from 0 and 1 before its logit is taken (``clipped_logit``),
so the logit stays finite whatever p the fit gave."""

DEFAULT_RATE_BOUNDS = (1e-6, 1e3)
"""Fitted rates are kept in this range (1/s) unless the caller gives one."""

_MAX_ITER = 200
"""Damped Newton steps at most; rows converge in a handful."""
_TOL_STEP = 1e-10
"""A row whose accepted step moved ``logit p`` and ``log rate`` less than this is done."""
_TOL_GRAD = 1e-10
"""A row whose gradient (ignoring components pushing out through a bound) is below this
is done."""
_TOL_GAIN_NATS = 1e-6
"""A row whose Newton step promises less than this rise of its total log-likelihood is
done: half a nat is one standard error, so what the quadratic model says is left moves
no parameter by more than a thousandth of one (on a curved ridge, where the model
undersells it, what is left stays under a thousandth of a nat). Without it a row on a
flat ridge (``p`` and ``rate`` traded against each other toward ``p = 1``, as when every
exposure is young) walked it for all ``_MAX_ITER`` steps."""
_DAMPING_START = 1e-3
"""Levenberg-Marquardt damping of the first step: close to a pure Newton step."""
_DAMPING_DOWN = 3.0
"""An accepted step divides the damping by this (trust the quadratic model more)..."""
_DAMPING_UP = 4.0
"""...a rejected one multiplies it by this (shorter steps, closer to the gradient)."""
_DAMPING_MIN = 1e-12
"""The damping never drops below this, so the damped system stays well conditioned."""
_DAMPING_GIVE_UP = 1e12
"""Damping past this means no step improves the likelihood: the row stops, not converged."""
_START_P_RANGE = (0.05, 0.95)
"""The naive ``reuses / exposures`` start of ``p`` is clipped into this range."""
_EMPTY_BIN_WIDTH = 1e-3
"""A bin wholly below the shift gets this share of the first bin's width (never zero)."""


@dataclass(frozen=True)
class MixtureFit:
    """One fit: ``F(t) = p (1 - exp(-rate (t - shift)))`` for ``t >= shift``."""

    p: float
    rate: float
    reuses: int
    exposures: float
    loglik: float
    converged: bool
    iterations: int


def censored_ages(edges: F64) -> F64:
    """Representative age of each bin: the geometric middle, half the first edge for
    ``[0, e1)``, the lower edge for the overflow bin ``[e_(B-1), inf)``."""
    lo, hi = edges[:-1], edges[1:]
    mid = np.sqrt(lo * np.where(np.isinf(hi), lo, hi))
    mid[0] = hi[0] / 2
    return mid


@dataclass(frozen=True, eq=False)
class _Data:
    n: F64  # [C, B] observed counts
    m: F64  # [C, B] censored counts
    lo: F64  # [B] observed interval starts (shifted)
    w: F64  # [B] observed interval widths, inf for the overflow bin
    age: F64  # [B] censored ages (shifted)
    n_obs: F64  # [C]
    total: F64  # [C]


def _prepare(observed: F64, censored: F64, edges: F64, shift: float) -> _Data:
    lo = np.maximum(edges[:-1] - shift, 0.0)
    w = np.maximum(edges[1:] - shift, 0.0) - lo
    # A bin wholly below the threshold holds nothing in practice; if it does, it is a tiny
    # interval at 0 rather than an impossible event.
    w = np.where(w > 0, w, edges[1] * _EMPTY_BIN_WIDTH)
    total = observed.sum(axis=1) + censored.sum(axis=1)
    return _Data(
        n=observed,
        m=censored,
        lo=lo,
        w=w,
        age=np.maximum(censored_ages(edges) - shift, 0.0),
        n_obs=observed.sum(axis=1),
        total=np.maximum(total, 1.0),
    )


def clipped_logit(p: float) -> float:
    """``logit p``, with ``p`` first kept in ``[P_CLIP, 1 - P_CLIP]``."""
    return float(logit(min(max(p, P_CLIP), 1.0 - P_CLIP)))


def _terms(u: F64, s: F64, d: _Data, derivs: bool) -> tuple[F64, F64 | None, F64 | None]:
    """Mean log-likelihood per exposure of each category at ``(logit p, log rate)``, and
    (if ``derivs``) its gradient ``[C, 2]`` and Hessian ``[C, 2, 2]``."""
    p = expit(u)
    a = np.exp(s)
    aw = a[:, None] * d.w[None, :]
    finite = np.isfinite(d.w)[None, :]
    with np.errstate(over="ignore", invalid="ignore"):
        log_int = np.where(finite, np.log(-np.expm1(-aw)), 0.0)
    surv = np.exp(-a[:, None] * d.age[None, :])
    denom = 1.0 - p[:, None] + p[:, None] * surv
    ll = (
        d.n_obs * np.log(p)
        + np.sum(d.n * (log_int - a[:, None] * d.lo[None, :]), axis=1)
        + np.sum(d.m * np.log(denom), axis=1)
    )
    if not derivs:
        return ll / d.total, None, None
    with np.errstate(over="ignore", invalid="ignore"):
        ratio = np.where(finite, d.w / np.expm1(aw), 0.0)
        half = np.where(finite, d.w / (2.0 * np.sinh(aw / 2.0)), 0.0)
    c = d.age[None, :]
    dp, da = surv - 1.0, -p[:, None] * c * surv  # dD/dp, dD/da
    l_p = d.n_obs / p + np.sum(d.m * dp / denom, axis=1)
    l_a = np.sum(d.n * (ratio - d.lo[None, :]), axis=1) + np.sum(d.m * da / denom, axis=1)
    l_pp = -d.n_obs / p**2 - np.sum(d.m * (dp / denom) ** 2, axis=1)
    l_pa = np.sum(d.m * (-c * surv / denom - dp * da / denom**2), axis=1)
    l_aa = -np.sum(d.n * half**2, axis=1) + np.sum(
        d.m * (p[:, None] * c**2 * surv / denom - (da / denom) ** 2), axis=1
    )
    # Chain rule to (u, s): dp/du = p(1-p), d2p/du2 = p(1-p)(1-2p); da/ds = d2a/ds2 = a.
    q = p * (1.0 - p)
    grad = np.stack([l_p * q, l_a * a], axis=1)
    hess = np.empty((len(u), 2, 2))
    hess[:, 0, 0] = l_pp * q**2 + l_p * q * (1.0 - 2.0 * p)
    hess[:, 1, 1] = l_aa * a**2 + l_a * a
    hess[:, 0, 1] = hess[:, 1, 0] = l_pa * q * a
    return ll / d.total, grad / d.total[:, None], hess / d.total[:, None, None]


def _rows(d: _Data, idx: NDArray[np.intp]) -> _Data:
    return _Data(
        n=d.n[idx],
        m=d.m[idx],
        lo=d.lo,
        w=d.w,
        age=d.age,
        n_obs=d.n_obs[idx],
        total=d.total[idx],
    )


def _initial(d: _Data, log_bounds: tuple[float, float]) -> tuple[F64, F64]:
    mid = d.lo + np.where(np.isfinite(d.w), d.w / 2.0, 0.0)
    mean = (d.n @ mid) / np.maximum(d.n_obs, 1.0)
    s = np.where(mean > 0, -np.log(np.where(mean > 0, mean, 1.0)), np.mean(log_bounds))
    p = np.clip(d.n_obs / d.total, *_START_P_RANGE)
    return logit(p), np.clip(s, *log_bounds)


@dataclass(eq=False)
class _Iterate:
    """Where the damped Newton iteration stands, one entry per row."""

    u: F64
    """logit p"""
    s: F64
    """log rate"""
    damping: F64
    loglik: F64
    """Mean log-likelihood per exposure at ``(u, s)``."""
    done: NDArray[np.bool_]
    iterations: I64


class FitOptions(TypedDict, total=False):
    """``fit_cure_rate``'s keyword options: those of ``fit_cure_rate_many``."""

    shift: float
    rate_bounds: tuple[float, float]


def fit_cure_rate_many(
    observed: I64 | F64,
    censored: F64,
    edges: F64,
    *,
    shift: float = 0.0,
    rate_bounds: tuple[float, float] = DEFAULT_RATE_BOUNDS,
) -> list[MixtureFit]:
    """Maximum-likelihood ``(p, rate)`` of each row of ``[C, B]`` binned data.

    ``observed[c, j]`` reuse gaps and ``censored[c, j]`` open exposures lie in
    ``[edges[j], edges[j + 1])``. A row with no reuse at all drives ``p`` to its lower
    bound and leaves ``rate`` unidentified (at its starting value, not converged).
    """
    obs = np.atleast_2d(np.asarray(observed, dtype=np.float64))
    cen = np.atleast_2d(np.asarray(censored, dtype=np.float64))
    d = _prepare(obs, cen, edges, shift)
    log_bounds = (float(np.log(rate_bounds[0])), float(np.log(rate_bounds[1])))
    u, s = _initial(d, log_bounds)
    rows = len(u)
    state = _Iterate(
        u=u,
        s=s,
        damping=np.full(rows, _DAMPING_START),
        loglik=np.zeros(rows),
        done=np.zeros(rows, dtype=bool),
        iterations=np.zeros(rows, dtype=np.int64),
    )
    for _ in range(_MAX_ITER):
        # Only rows still iterating are computed: most converge in a handful of steps.
        idx = np.flatnonzero(~state.done)
        if len(idx) == 0:
            break
        _step(state, idx, _rows(d, idx), log_bounds)
    p = expit(state.u)
    converged = state.done & (state.damping <= _DAMPING_GIVE_UP) & (d.n_obs > 0)
    return [
        MixtureFit(
            p=float(p[c]),
            # exp(log bound) can miss the bound by an ulp: a pinned rate stays pinned.
            rate=float(np.clip(np.exp(state.s[c]), *rate_bounds)),
            reuses=int(d.n_obs[c]),
            exposures=float(obs[c].sum() + cen[c].sum()),
            loglik=float(state.loglik[c] * d.total[c]),
            converged=bool(converged[c]),
            iterations=int(state.iterations[c]),
        )
        for c in range(rows)
    ]


def _step(
    state: _Iterate, idx: NDArray[np.intp], d: _Data, log_bounds: tuple[float, float]
) -> None:
    """One damped Newton step of rows ``idx`` (``d`` holds their data): kept if the
    likelihood does not drop, and the damping adapted either way."""
    u, s, damping = state.u[idx], state.s[idx], state.damping[idx]
    f, g, h = _terms(u, s, d, derivs=True)
    assert g is not None and h is not None
    held_u, held_s = _held(u, s, g, log_bounds)
    du, ds, _ = _damped_newton(g, h, damping, held_u, held_s)
    u_new = np.clip(u + du, -LOGIT_BOUND, LOGIT_BOUND)
    s_new = np.clip(s + ds, *log_bounds)
    f_new, _, _ = _terms(u_new, s_new, d, derivs=False)
    better = f_new >= f
    moved = np.maximum(np.abs(u_new - u), np.abs(s_new - s))
    state.u[idx] = np.where(better, u_new, u)
    state.s[idx] = np.where(better, s_new, s)
    state.loglik[idx] = np.where(better, f_new, f)
    damping = np.where(
        better, np.maximum(damping / _DAMPING_DOWN, _DAMPING_MIN), damping * _DAMPING_UP
    )
    state.damping[idx] = damping
    state.iterations[idx] += 1
    grad = np.abs(np.where(held_u, 0.0, g[:, 0])) + np.abs(np.where(held_s, 0.0, g[:, 1]))
    gain = _newton_gain(g, h, held_u, held_s) * d.total
    state.done[idx] = (
        (better & (moved < _TOL_STEP))
        | (grad < _TOL_GRAD)
        | (gain < _TOL_GAIN_NATS)
        | (damping > _DAMPING_GIVE_UP)
    )


def _newton_gain(g: F64, h: F64, held_u: NDArray[np.bool_], held_s: NDArray[np.bool_]) -> F64:
    """Rise of the mean log-likelihood the quadratic model promises to its maximum,
    ``g x / 2`` with ``-H x = g`` over the variables not held (half the squared Newton
    decrement); ``inf`` where ``-H`` is not positive definite (no maximum to promise)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        du, ds, definite = _damped_newton(g, h, np.zeros(len(g)), held_u, held_s)
    rise = np.where(held_u, 0.0, g[:, 0] * du) + np.where(held_s, 0.0, g[:, 1] * ds)
    return np.where(definite, rise / 2.0, np.inf)


def _damped_newton(
    g: F64, h: F64, damping: F64, held_u: NDArray[np.bool_], held_s: NDArray[np.bool_]
) -> tuple[F64, F64, NDArray[np.bool_]]:
    """The step ``x`` solving ``(-H + damping I) x = g`` per row (the negative
    log-likelihood's damped Newton system) over the variables not held on a bound (a held
    one does not move, and the other's step is its own one-dimensional Newton step); a
    gradient step where the system is not positive definite (the third value says where
    it is)."""
    held = held_u | held_s
    g_u, g_s = np.where(held_u, 0.0, g[:, 0]), np.where(held_s, 0.0, g[:, 1])
    a11 = np.where(held_u, 1.0, -h[:, 0, 0] + damping)
    a22 = np.where(held_s, 1.0, -h[:, 1, 1] + damping)
    a12 = np.where(held, 0.0, -h[:, 0, 1])
    det = a11 * a22 - a12 * a12
    bad = ~(det > 0) | ~(a11 > 0)
    det = np.where(bad, 1.0, det)
    du = np.where(bad, g_u / damping, (a22 * g_u - a12 * g_s) / det)
    ds = np.where(bad, g_s / damping, (a11 * g_s - a12 * g_u) / det)
    return du, ds, ~bad


def _held(
    u: F64, s: F64, g: F64, log_bounds: tuple[float, float]
) -> tuple[NDArray[np.bool_], NDArray[np.bool_]]:
    """Whether ``u`` and ``s`` of each row sit on a bound their gradient pushes out
    through: such a variable cannot follow its gradient, so it is held where it is (left
    out of the Newton system and of the convergence test). Moving it in a coupled step
    only to clip it back made the other variable's step wrong: a fit ending on
    ``rate_min`` crept along it for all ``_MAX_ITER`` steps."""
    held_u = ((u >= LOGIT_BOUND) & (g[:, 0] > 0)) | ((u <= -LOGIT_BOUND) & (g[:, 0] < 0))
    held_s = ((s >= log_bounds[1]) & (g[:, 1] > 0)) | ((s <= log_bounds[0]) & (g[:, 1] < 0))
    return held_u, held_s


def fit_cure_rate(
    observed: I64 | F64, censored: F64, edges: F64, **options: Unpack[FitOptions]
) -> MixtureFit:
    """``fit_cure_rate_many`` of a single row."""
    return fit_cure_rate_many(
        np.asarray(observed, dtype=np.float64)[None, :],
        np.asarray(censored, dtype=np.float64)[None, :],
        edges,
        **options,
    )[0]

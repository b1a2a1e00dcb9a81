"""Synthetic Bailian traces whose statistics follow the paper's (trace A to-C, trace B to-B).

Owns ``synthesize``, the one entry point, and the profile names. The workloads are
generative models, not fitted curves: users and applications send conversations, API
calls, fan-outs and agent chains, prompts extend or share earlier prompts, and the hash
ids follow from which tokens two prompts share (``synth_prefix``). The models are
``synth_toc`` (people chatting; the to-C column of docs/traces.md, "What the paper
found") and ``synth_tob`` (programs calling an API; the to-B column); their docstrings say
which finding each knob reproduces, and docs/traces.md ("Synthetic traces") lists every
target with its tolerance and what the default knobs measure. The statistics are defined in
``controlplane.traces.workload_stats``.

Same profile, duration, rate, seed and knobs give the identical trace; everything is
vectorised (ten minutes of to-C at 6 QPS takes well under a second plus the ``Trace``
construction). It must never read or write files (``controlplane.traces.writer`` does)
or use global randomness. Synthetic results are synthetic: never present them as
measurements of the real traces.
"""

from __future__ import annotations

from typing import Literal, get_args

import numpy as np

from controlplane.traces.model import Trace
from controlplane.traces.synth_build import TraceBuilder
from controlplane.traces.synth_tob import ToBKnobs, generate_to_b
from controlplane.traces.synth_toc import ToCKnobs, generate_to_c

Profile = Literal["to-c", "to-b"]
PROFILES: tuple[str, ...] = get_args(Profile)

TO_C_TYPES = ("text", "search", "image", "file")
TO_B_TYPES = ("api", "text")


def synthesize(
    profile: Profile,
    *,
    duration_s: float,
    qps: float,
    seed: int,
    knobs: ToCKnobs | ToBKnobs | None = None,
) -> Trace:
    """A synthetic trace of about ``qps`` requests per second over ``duration_s`` seconds.

    ``knobs`` replaces the profile's calibrated defaults (``ToCKnobs`` for ``to-c``,
    ``ToBKnobs`` for ``to-b``). Raises ``ValueError`` for an unknown profile, a
    non-positive duration or rate, or knobs of the other profile. Time and memory go with
    ``generated_requests``, not with the requests the window keeps.
    """
    chosen = _knobs(profile, knobs)
    if not (duration_s > 0 and np.isfinite(duration_s)):
        raise ValueError(f"duration_s must be a positive number, got {duration_s}")
    if not (qps > 0 and np.isfinite(qps)):
        raise ValueError(f"qps must be a positive number, got {qps}")
    rng = np.random.default_rng(seed)
    if isinstance(chosen, ToCKnobs):
        builder = TraceBuilder(TO_C_TYPES)
        generate_to_c(builder, rng, duration_s, qps, chosen)
    else:
        builder = TraceBuilder(TO_B_TYPES)
        generate_to_b(builder, rng, duration_s, qps, chosen)
    name = f"synth-{profile}-{duration_s:g}s-{qps:g}qps-seed{seed}"
    return builder.build(name=name, duration_s=duration_s)


def generated_requests(
    profile: Profile, *, duration_s: float, qps: float, knobs: ToCKnobs | ToBKnobs | None = None
) -> float:
    """About how many requests ``synthesize`` draws: the window's and the warm-up's before
    it (``warmup_s``: 1,800 s for to-C, 120 s for to-B), which are drawn, then dropped.
    While the trace is built a kept to-C request takes about 13 KB (docs/traces.md)."""
    return (duration_s + _knobs(profile, knobs).warmup_s) * qps


def _knobs(profile: Profile, knobs: ToCKnobs | ToBKnobs | None) -> ToCKnobs | ToBKnobs:
    """The knobs ``profile`` runs with: ``knobs``, or its calibrated defaults."""
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; known profiles: {', '.join(PROFILES)}")
    wanted = ToCKnobs if profile == "to-c" else ToBKnobs
    if knobs is None:
        return wanted()
    if not isinstance(knobs, wanted):
        raise ValueError(f"{profile} takes {wanted.__name__}")
    return knobs

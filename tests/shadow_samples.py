"""A shadow evaluation that selects an evictor family within a short synthetic trace, for
the selection's tests: the trace, the settings and a ``wa`` curve any baseline beats."""

from __future__ import annotations

from agent.policy_document import CategoryParams
from controlplane.shadow.settings import ShadowSettings
from controlplane.traces.model import Trace
from controlplane.traces.synth import synthesize

QUICK_SELECTION = ShadowSettings(
    shadow_rate=1.0,
    shadow_policies="lru,s3fifo",
    shadow_window_s=120.0,
    shadow_buckets=4,
    select_margin=0.0,
    select_min_accesses=0,
)
"""Every request sampled, two baselines, 120 s windows (five in ``selection_trace``); any
lead counts. Tests set ``select_windows`` to the streak they need."""

KEEPS_OLDEST = CategoryParams(rate=1e-6, p_reuse=1.0, life_s=1.0)
"""A curve that ranks blocks by age, the oldest kept: no reuse expected of new blocks,
so a ``wa`` document with it loses to every baseline."""


def selection_trace() -> Trace:
    """Ten minutes of to-C traffic at 3 QPS."""
    return synthesize("to-c", duration_s=600, qps=3, seed=7)

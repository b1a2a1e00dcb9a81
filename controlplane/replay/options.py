"""Options of one replay run that reach every policy factory: ``ReplayOptions``.

Owns the run-level choices a fitted policy needs beyond a capacity and the trace: how
``wa``/``wa-ref`` are fitted during the replay (online every ``refit_every_s`` trace
seconds, or once on the first part of the trace, the paper's protocol), where categories
come from (the trace's labels or inferred from blocks), and the fitting knobs
(``FitSettings``, which the controller's settings extend). Also ``first_scored``: the
first request a run's hit ratio counts (the second part in split mode, for every policy
of the run).

Fitting knobs come from ``FitSettings``'s declared defaults, never from the environment,
so a replay gives the same numbers on every machine; an option set here overrides them.
It must never read files or the environment, or build policies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Literal, get_args

from agent.policy_document import SUPERSEDE_RULES, SupersedeRule
from agent.reuse_classes import REUSE_GHOST_CAPACITIES
from controlplane.fit.settings import FitSettings
from controlplane.traces.model import Trace

FitMode = Literal["online", "split"]
CategorySource = Literal["labels", "auto"]
Attribution = Literal["creator", "last"]
ReuseClass = Literal["off", "hit", "trace"]
"""How a replay splits categories into reuse classes (``ReplayOptions.reuse_class``)."""
DepthMode = Literal["off", "classes", "cost"]
"""Prefix depth in a replay's ``wa`` (``ReplayOptions.depth``; replay only)."""

AutoSupersede = SupersedeRule
"""Whether ``auto``'s ``wa`` demotes superseded branches (``ReplayOptions.auto_supersede``)."""
AutoWA = Literal["wa", "wa-shared"]
"""Which ``wa`` ``auto`` serves and shadows (``ReplayOptions.auto_wa``)."""
AutoSwitch = Literal["hand-over", "kept"]
"""How ``auto`` changes family (``ReplayOptions.auto_switch``)."""

DEFAULT_ATTRIBUTION: Attribution = "last"
"""Chosen by measurement (docs/policy.md, "Measured settings")."""


@dataclass(frozen=True)
class ReplayOptions:
    """How fitted policies are fitted and scored in one replay (module docstring).

    ``split``: the share of the trace's *requests* fitted on in split mode; the rest are
    scored. ``near_concurrent_s``, ``life_s``, ``window_s``, ``shrinkage_samples``,
    ``min_samples``: ``None`` keeps the ``fit`` default (``life_s`` set = one life window
    for every category; ``window_s = inf`` = every access since the start). ``fit``
    holds the fitting knobs those overrides apply to. ``reuse_class``: each category is
    split in two classes, ``w`` and ``w/re``: ``"hit"`` as the agent does it
    (``KVWISE_REUSE_CLASSES``: ``w/re`` holds the blocks the request found cached or that
    are among the ``reuse_ghost`` times the capacity most recently evicted,
    ``KVWISE_REUSE_GHOST_BLOCKS``, ``w`` the others), ``"trace"`` from trace knowledge
    (``w/re``: the block was accessed before, cached or not; replay only); measured in
    docs/policy.md. ``depth`` (replay only, ``controlplane.replay.depth``): ``"classes"``
    splits each category by the block's depth in its prompt, ``"cost"`` also ranks by
    the prefill a hit saves (deeper blocks save more). ``auto_*``: the shadow and the
    family selection of ``auto`` (``controlplane.shadow.auto_replay``): sampling rate,
    window (trace seconds), the margin a family must lead by, in how many windows in a
    row, and the sampled accesses a window needs (docs/policy.md says how they were
    chosen); ``auto_supersede``: ``"tree"`` serves ``auto``'s ``wa`` as a vLLM worker runs
    it under the policy document's ``supersede: tree`` (the superseded branches evicted
    first while ``wa`` is in force, ``controlplane.replay.superseded``), ``"off"`` without
    (its shadow judges ``wa`` without it either way, as the controller's does);
    ``auto_wa``: ``"wa-shared"`` serves and shadows the replay-only ``wa-shared``
    (``controlplane.replay.shared_rate``; reuse classes by hit included) as ``auto``'s
    ``wa`` family, ``"wa"`` the agent's ``wa``. ``auto_switch``: ``"hand-over"`` moves
    the cache's blocks into the new family, as an agent does on hot reload; ``"kept"``
    (replay only) keeps every family's evictor over the cache's blocks all along
    (``controlplane.replay.experts.KeptExperts``), so a switch only changes which one
    takes the victims.
    """

    refit_every_s: float = 60.0
    wa_fit: FitMode = "online"
    split: float = 0.5
    categories: CategorySource = "labels"
    attribution: Attribution = DEFAULT_ATTRIBUTION
    near_concurrent_s: float | None = None
    life_s: float | None = None
    window_s: float | None = None
    shrinkage_samples: float | None = None
    min_samples: int | None = None
    reuse_class: ReuseClass = "off"
    reuse_ghost: float = REUSE_GHOST_CAPACITIES
    depth: DepthMode = "off"
    auto_rate: float = 1.0
    auto_window_s: float = 300.0
    auto_margin: float = 0.01
    auto_windows: int = 1
    auto_min_accesses: int = 2000
    auto_supersede: AutoSupersede = "off"
    auto_wa: AutoWA = "wa"
    auto_switch: AutoSwitch = "hand-over"
    fit: FitSettings = field(default_factory=FitSettings, compare=False)

    def __post_init__(self) -> None:
        if not (self.refit_every_s > 0 and math.isfinite(self.refit_every_s)):
            raise ValueError(f"refit_every_s must be a finite number > 0, got {self.refit_every_s}")
        if self.wa_fit not in ("online", "split"):
            raise ValueError(f"wa_fit must be 'online' or 'split', got {self.wa_fit!r}")
        if not 0.0 < self.split < 1.0:
            raise ValueError(f"split must be in (0, 1), got {self.split}")
        if self.categories not in ("labels", "auto"):
            raise ValueError(f"categories must be 'labels' or 'auto', got {self.categories!r}")
        if self.attribution not in ("creator", "last"):
            raise ValueError(f"attribution must be 'creator' or 'last', got {self.attribution!r}")
        if self.reuse_class not in get_args(ReuseClass):
            raise ValueError(f"reuse_class must be off, hit or trace, got {self.reuse_class!r}")
        if self.depth not in ("off", "classes", "cost"):
            raise ValueError(f"depth must be off, classes or cost, got {self.depth!r}")
        if self.reuse_class == "hit" and self.attribution == "creator":
            raise ValueError(
                "reuse classes by hit (--reuse-class hit) need attribution to the last "
                "accessor (--attribution last)"
            )
        if self.depth != "off" and self.reuse_class != "off":
            raise ValueError("depth classes and reuse classes are not combined")
        if not (self.reuse_ghost >= 0 and math.isfinite(self.reuse_ghost)):
            raise ValueError(f"reuse_ghost must be a finite number >= 0, got {self.reuse_ghost}")
        auto_ok = 0 < self.auto_rate <= 1 and self.auto_windows >= 1
        if not (auto_ok and self.auto_min_accesses >= 0):
            raise ValueError(
                "auto_rate must be in (0, 1], auto_windows >= 1, auto_min_accesses >= 0"
            )
        if self.auto_supersede not in SUPERSEDE_RULES:
            raise ValueError(f"auto_supersede must be tree or off, got {self.auto_supersede!r}")
        if self.auto_wa not in get_args(AutoWA):
            raise ValueError(f"auto_wa must be wa or wa-shared, got {self.auto_wa!r}")
        if self.auto_wa == "wa-shared" and self.auto_supersede != "off":
            raise ValueError(
                "auto's wa-shared (--auto-wa wa-shared) does not run the superseded-branch "
                "rule: leave --auto-supersede off"
            )
        if self.auto_switch not in get_args(AutoSwitch):
            raise ValueError(f"auto_switch must be hand-over or kept, got {self.auto_switch!r}")
        if self.auto_switch == "kept" and self.auto_supersede != "off":
            raise ValueError("auto's kept families do not run the superseded-branch rule")
        if self.min_samples is not None and self.min_samples < 1:
            raise ValueError(f"min_samples must be >= 1, got {self.min_samples}")
        for name in ("near_concurrent_s", "shrinkage_samples"):
            v = getattr(self, name)
            if v is not None and not (v >= 0 and math.isfinite(v)):
                raise ValueError(f"{name} must be a finite number >= 0, got {v}")
        self._check_seconds()

    def _check_seconds(self) -> None:
        """Every life or window length finite and > 0, but ``window_s``, which may also be
        infinite (every access since the start, ``fit_settings``)."""
        for name in ("life_s", "window_s", "auto_window_s"):
            v = getattr(self, name)
            infinite_window = name == "window_s" and v == math.inf
            if v is not None and not (v > 0 and (math.isfinite(v) or infinite_window)):
                also = " or inf" if name == "window_s" else ""
                raise ValueError(f"{name} must be a finite number > 0{also}, got {v}")

    def fit_settings(self, trace: Trace) -> FitSettings:
        """The controller's fitting knobs with this run's overrides applied. An infinite
        window becomes one that outlasts ``trace``."""
        update: dict[str, object] = {}
        if self.near_concurrent_s is not None:
            update["near_concurrent_s"] = self.near_concurrent_s
        if self.life_s is not None:
            update["life_s_override"] = self.life_s
        if self.shrinkage_samples is not None:
            update["shrinkage_samples"] = self.shrinkage_samples
        if self.min_samples is not None:
            update["min_samples"] = self.min_samples
        if self.window_s is not None:
            span = float(trace.timestamps[-1] - trace.timestamps[0]) if trace.n_requests else 0
            update["window_s"] = self.window_s if math.isfinite(self.window_s) else span + 1.0
        # Validated, not copied: the fitter's own checks apply to the overrides too.
        return FitSettings.model_validate({**self.fit.fit_only().model_dump(), **update})

    def to_json(self) -> dict[str, object]:
        """Every option of the run but the fitting knobs it starts from (``fit``)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "fit"}

    def first_scored(self, trace: Trace) -> int:
        """Index of the first request whose hits count: 0, or in split mode the first
        request of the scored part (``ceil(split * n)``, at least one request fitted)."""
        if self.wa_fit != "split" or trace.n_requests == 0:
            return 0
        return min(max(1, math.ceil(self.split * trace.n_requests)), trace.n_requests)


DEFAULT_OPTIONS = ReplayOptions()

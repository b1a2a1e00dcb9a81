"""``auto`` in replay: the controller's family selection run offline.

Owns ``AutoReplayPolicy`` and its registration as ``auto`` in the replay catalogue
(``controlplane.replay.catalog``; the catalogue sits below the shadow, so this module
registers itself when imported, as the replay command does). The cache starts as ``wa``
refitted online (as ``kvwise replay --policy wa``: ``controlplane.replay.online``; with
``auto_supersede`` ``"tree"``, evicting superseded branches first while it is in force, as
a vLLM worker under the document's ``supersede: tree``: ``controlplane.replay.superseded``;
with ``auto_wa`` ``"wa-shared"``, the replay-only ``wa-shared``, shadowed as it is served:
``controlplane.replay.shared_rate``).
Beside it runs a shadow of the replayed past, as the controller's: requests kept by a
``PrefixSampler`` on their key block (the controller's key depth; the rate is
``auto_rate``) are served by one miniature cache per candidate family (``wa`` under the
document in force, evicting superseded branches first when the replayed ``wa`` does, as
the controller's shadow of a vLLM worker; and the controller's default baselines), each
at the cache's capacity times the rate (below a rate of 1, sized as the controller
sizes them by the sample's share of the replayed cache's inflow, and each window's
figures moved by that cache's own hit ratio: the replayed cache stands for the worker);
with reuse classes by hit, the
miniature ``wa`` files by reuse class on its own hits and evictions, as the controller's
shadow does for a classing worker. At the end of every ``auto_window_s`` trace seconds the
window's hit ratios go to the ``FamilySelector`` (the controller's rule); when it
switches, every block of the cache moves into the new family in its victim order
(``agent.policies.handover``), as an agent's does on hot reload; with ``auto_switch``
``"kept"`` (replay only) every family's evictor runs over the cache's blocks from the
start instead (``controlplane.replay.experts.KeptExperts``), and a switch only changes
which one takes the victims. ``wa`` keeps being
refitted while a baseline runs, so a switch back finds the newest document. ``switches``
records each switch, ``verdicts`` every word of the selector.

Each request is judged on what came before it: the shadow serves a request after the
windows ending before it are judged, and refits see only earlier requests. It must never
do I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from agent.policies import create
from agent.policies.handover import hand_over
from agent.policies.wa import WAPolicy
from agent.policy_document import DEFAULT_FAMILY
from agent.reuse_classes import ReturnTracker
from controlplane.replay import catalog, online
from controlplane.replay.experts import KeptExperts
from controlplane.replay.online import FittedReplayPolicy
from controlplane.replay.options import ReplayOptions
from controlplane.replay.shared_rate import (
    BlockHistory,
    SharedRateFiling,
    SharedRateReplayPolicy,
    SharedRateWA,
    fitted_wa_shared,
)
from controlplane.replay.superseded import superseding
from controlplane.shadow.estimator import MiniCache, ReuseClassing, WindowCounts
from controlplane.shadow.inflow import InflowShare
from controlplane.shadow.miniatures import branch_rule
from controlplane.shadow.rebuild import Request
from controlplane.shadow.sampler import PrefixSampler
from controlplane.shadow.selection import (
    FamilySelector,
    Reading,
    SelectionSettings,
    SelectionView,
)
from controlplane.shadow.settings import ShadowSettings
from controlplane.traces.model import Trace


@dataclass(frozen=True)
class Switch:
    """One family switch of the replayed cache."""

    at_s: float
    request: int
    """Index of the first request served by the new family."""
    verdict: SelectionView


class _Shadow:
    """The miniature caches of every candidate family and the window's counts. Below a
    rate of 1 they are kept as the controller keeps them for one worker: each miniature
    sized by the sample's share of the replayed cache's inflow, each window's figures
    moved by the replayed cache's own hit ratio (``controlplane.shadow.evaluator``); at a
    rate of 1 the sample is the traffic and neither applies."""

    def __init__(
        self, trace: Trace, capacity: int, options: ReplayOptions, fitted: FittedReplayPolicy
    ) -> None:
        defaults = ShadowSettings()
        self.rate = options.auto_rate
        sampler = PrefixSampler(self.rate)
        offsets = trace.offsets
        lengths = np.diff(offsets)
        depth = np.clip(np.minimum(lengths - 1, defaults.shadow_key_depth), 0, None)
        # A request's key block (an empty request, which serves nothing, gets any block).
        last = len(trace.blocks) - 1
        keys = trace.blocks[np.minimum(offsets[:-1] + depth, last)] if last >= 0 else lengths * 0
        self.keys = keys.astype(np.int64).tolist()
        self.sampled = sampler.keep(keys.astype(np.int64)).tolist()
        self.capacity = capacity
        self.share = InflowShare(self.rate, capacity)
        size = sampler.scaled(capacity)
        self.families = (DEFAULT_FAMILY, *defaults.baselines)
        wa = fitted.inner
        shared = isinstance(fitted, SharedRateReplayPolicy)
        miniature = SharedRateWA if shared else WAPolicy
        self.wa = miniature(size, category_names=wa.category_names, doc=wa.policy)
        wa_cache = MiniCache(
            self.wa, size, _classing(fitted, options, size), _filing(fitted, options, size)
        )
        wa_cache.run_branch_rule(branch_rule(options.auto_supersede == "tree", wa.policy))
        self.caches = [wa_cache, *(MiniCache(create(f, size), size) for f in defaults.baselines)]
        self._start_window()

    @property
    def sampling(self) -> bool:
        """Whether only part of the traffic is served (a rate below 1)."""
        return self.rate < 1

    def _start_window(self) -> None:
        self.counts = [WindowCounts(_WHOLE_WINDOW_S, 1) for _ in self.families]
        self.seen_hits = 0
        self.seen_accesses = 0

    def see(self, request: Request, sampled: bool) -> None:
        """A request the replayed cache is serving (``seen_hits``: its prefix cached
        there), served to the miniatures too when ``sampled``."""
        if self.sampling:
            computed = len(request.blocks) - request.seen_hits
            self.share.add(computed, computed if sampled else 0)
            self.seen_hits += request.seen_hits
            self.seen_accesses += len(request.blocks)
        if not sampled:
            return
        size = self.share.capacity(self.capacity) if self.sampling else None
        for cache, counts in zip(self.caches, self.counts, strict=True):
            if size is not None:
                cache.resize(size)
            hits = cache.serve(request)
            counts.add(request.ts, hits, len(request.blocks), request.seen_hits, request.subtree)

    def reading(self, start: float, end: float) -> Reading:
        """The window's hit ratios; the counts start again."""
        own = self.seen_hits / self.seen_accesses if self.seen_accesses else None
        ratios: dict[str, float] = {}
        n = 0
        for family, counts in zip(self.families, self.counts, strict=True):
            totals = counts.totals(0.0)
            if totals.accesses:
                ratios[family] = totals.estimate(own).hit_ratio
                n = int(totals.accesses)
        self._start_window()
        return Reading(ratios, n, start, end)


_WHOLE_WINDOW_S = 1e18
"""One bucket that holds a whole judged window of the trace (read, then started again)."""


class AutoReplayPolicy:
    """The replayed cache, whose evictor family the shadow of the past selects."""

    def __init__(self, capacity: int, trace: Trace, options: ReplayOptions) -> None:
        self.capacity = capacity
        self.wa: FittedReplayPolicy = (
            superseding(trace, options, capacity)
            if options.auto_supersede == "tree"
            else fitted_wa_shared(capacity, trace, options)
            if options.auto_wa == "wa-shared"
            else online.build("wa", trace, options, capacity=capacity)
        )
        assert isinstance(self.wa.inner, WAPolicy)  # "wa" builds the agent's evictor
        self.family: str = DEFAULT_FAMILY
        self.selector = FamilySelector(
            SelectionSettings(
                margin=options.auto_margin,
                windows=options.auto_windows,
                min_accesses=options.auto_min_accesses,
            )
        )
        self.switches: list[Switch] = []
        self.verdicts: list[tuple[int, SelectionView]] = []
        """Every word of the selector, with the index of the first request served after it."""
        self._trace = trace
        self._ts = trace.timestamps.tolist()
        self._shadow = _Shadow(trace, capacity, options, self.wa)
        self._kept: KeptExperts | None = None
        if options.auto_switch == "kept":
            baselines = [create(f, capacity) for f in self._shadow.families[1:]]
            self._kept = KeptExperts([self.wa.inner, *baselines])
            self.wa.in_force = self._kept
        self._window_s = options.auto_window_s
        self._window_start = self._ts[0] if self._ts else 0.0
        self._docs_seen = 0
        self._r = 0
        self._windows_judged = 0
        """Shadow windows that ended with enough sampled accesses to judge."""
        self._windows_thin = 0
        """Shadow windows that ended with too few (no evidence either way)."""

    # --- the replay's driving (TraceIndexed) -------------------------------------------------
    def arrive(self, request: int) -> None:
        """Judge the windows that ended before ``request``, refit ``wa`` when due, then
        let the shadow serve ``request`` if it is sampled."""
        t = self._ts[request]
        if t >= self._window_start + self._window_s:
            end = self._window_start + self._window_s
            self._judge(self._shadow.reading(self._window_start, end), request)
            # The windows after it up to this request saw no access: none is evidence, and
            # judging them one by one would never end on a jump of the times.
            skipped = max(0.0, (t - end) // self._window_s)
            self._windows_thin += int(min(skipped, 2**62))
            start = end + skipped * self._window_s
            self._window_start = start if start > self._window_start else t
        self.wa.arrive(request)
        if self.wa.versions_applied != self._docs_seen:
            self._docs_seen = self.wa.versions_applied
            self._shadow.wa.set_policy(self.wa.inner.policy)
        shadow = self._shadow
        sampled = shadow.sampled[request]
        if sampled or shadow.sampling:
            shadow.see(self._request(request), sampled)

    def free_request(
        self, request: int, blocks: Sequence[int], offsets: Sequence[int], now: float
    ) -> None:
        self.wa.free_request(request, blocks, offsets, now)

    def _request(self, r: int) -> Request:
        """Request ``r`` with its prefix cached here now (asked only when the shadow
        samples: the controller's estimate needs the worker's own hits)."""
        lo, hi = self._trace.offsets[r], self._trace.offsets[r + 1]
        blocks = self._trace.blocks[lo:hi].tolist()
        cached = 0
        if self._shadow.sampling:
            wa = self.wa
            while cached < len(blocks) and blocks[cached] in wa:
                cached += 1
        return Request(self._ts[r], self.wa.request_code(r), blocks, cached, self._shadow.keys[r])

    def _judge(self, reading: Reading, request: int) -> None:
        if reading.accesses < self.selector.settings.min_accesses:
            self._windows_thin += 1
        else:
            self._windows_judged += 1
        verdict = self.selector.observe(reading, self.family)
        self.verdicts.append((request, verdict))
        if not verdict.switches:
            return
        chosen = verdict.chosen
        if self._kept is not None:
            self._kept.chosen = self._shadow.families.index(chosen)
        else:
            new = self.wa.inner if chosen == DEFAULT_FAMILY else create(chosen, self.capacity)
            hand_over(self.wa.in_force, new, reading.end)
            self.wa.in_force = new
        self.family = chosen
        self.switches.append(Switch(reading.end, request, verdict))

    @property
    def shadow_inflow(self) -> tuple[float, float]:
        """Blocks the replayed cache computed so far, for every request and the sampled
        ones (counted below a rate of 1 only)."""
        return self._shadow.share.totals

    @property
    def shadow_caches(self) -> list[MiniCache]:
        """The shadow's miniature caches, one per candidate family."""
        return self._shadow.caches

    def run_notes(self) -> list[str]:
        """The fitted ``wa``'s notes (a run on the defaults), then each switch of family
        (none: it stayed ``wa`` all along, and why)."""
        return self.wa.run_notes() + self._family_notes()

    def _family_notes(self) -> list[str]:
        if not self.switches and self._windows_thin and not self._windows_judged:
            return [
                f"stayed {DEFAULT_FAMILY}: no shadow window had the sampled accesses to "
                f"judge ({self._windows_thin} window{'s' * (self._windows_thin != 1)}, each under "
                f"{self.selector.settings.min_accesses:,})"
            ]
        if not self.switches and not self._windows_judged:
            span = self._ts[-1] - self._ts[0] if self._ts else 0.0
            return [
                f"stayed {DEFAULT_FAMILY}: no shadow window ended (the trace spans "
                f"{span:,.0f} s, --auto-window {self._window_s:g} s)"
            ]
        if not self.switches:
            return [
                f"stayed {DEFAULT_FAMILY}: no family led it by the margin "
                f"({self._windows_judged} window{'s' * (self._windows_judged != 1)} judged)"
            ]
        return [
            f"at {s.at_s - self._ts[0]:,.0f} s (request {s.request:,}): {s.verdict.reason}"
            for s in self.switches
        ]

    # --- the Protocol ------------------------------------------------------------------------
    # The fitted ``wa`` drives the family in force (``in_force``), so that its reuse
    # classes keep being told what was hit and evicted whichever family runs.
    def touch(self, blocks: Sequence[int], now: float) -> None:
        self.wa.touch(blocks, now)

    def free(
        self, blocks: Sequence[int], offsets: Sequence[int], now: float, category: int
    ) -> None:
        r = self._r
        self._r = r + 1
        self.arrive(r)
        self.free_request(r, blocks, offsets, now)

    def evict(self, n: int) -> list[int]:
        return self.wa.evict(n)

    def __len__(self) -> int:
        return len(self.wa)

    def __contains__(self, block: object) -> bool:
        return block in self.wa


def _classing(
    fitted: FittedReplayPolicy, options: ReplayOptions, size: int
) -> ReuseClassing | None:
    """The miniature ``wa``'s reuse classes, when the replayed ``wa`` has them (its own
    ghost, scaled as the cache is)."""
    classes = fitted.hit_classes
    if classes is None:
        return None
    tracker = ReturnTracker(round(options.reuse_ghost * size))
    offset = classes.k
    return ReuseClassing(tracker, lambda code: code + offset, float(options.reuse_ghost))


def _filing(
    fitted: FittedReplayPolicy, options: ReplayOptions, size: int
) -> SharedRateFiling | None:
    """The miniature ``wa``'s rate classes, when the replayed ``wa`` is ``wa-shared``
    (a history of its own, its ghost scaled as the cache is)."""
    if not isinstance(fitted, SharedRateReplayPolicy):
        return None
    history = BlockHistory(round(options.reuse_ghost * size))
    return SharedRateFiling(history, fitted.filing.first_rate_code, size)


@catalog.register_offline("auto")
def auto(capacity: int, trace: Trace, options: ReplayOptions) -> AutoReplayPolicy:
    """``auto``: ``wa`` refitted online, switched to a baseline (and back) by the shadow."""
    return AutoReplayPolicy(capacity, trace, options)

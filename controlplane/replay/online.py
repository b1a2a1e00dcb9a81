"""``wa`` and ``wa-ref`` in replay, fitted the way the controller fits them.

Owns ``FittedReplayPolicy``, which drives an agent evictor (``WAPolicy`` or
``WARefPolicy``) through a replay and swaps fitted ``PolicyDocument``s into it, and the two
refitters that produce them:

- ``CensoredRefitter`` (``wa``): a ``ReuseStats`` window fed with the accesses replayed
  since the last refit, then ``fit_all``; the pooled fit is the document's default, and
  a refit the controller would not publish (``min_samples``, ``change_threshold``) gives
  none;
- ``ReferenceRefitter`` (``wa-ref``): the reference code's fitter (``fit_reference``:
  shifted exponential, ``p = reuses / accesses``, 5 s life window) on every reuse gap seen
  so far.

Two protocols (``ReplayOptions.wa_fit``): ``online`` starts from the built-in default
(``agent.policy_document.BUILTIN_POLICY``) and refits every ``refit_every_s`` trace seconds from
everything replayed before the request being served; ``split`` fits once on the first
part of the requests (the paper's protocol) and serves the whole trace with it (only the
second part is scored, see ``ReplayOptions.first_scored``). Categories come from the
trace's labels or are inferred (``controlplane.replay.accesses``).

A fleet (``kvwise simulate``): what ``build`` derives from the trace and the options
(``FittedSetup``: category codes, access columns, read-only) is the same for every cache,
and so, without reuse classes by hit, is every refit: it takes the trace's accesses up to
the refit's request, whatever each cache held. ``Refits`` makes each refit once and hands
its document to every policy that shares it, as the live controller fits the whole
fleet's traffic and publishes one document to every worker
(``FittedReplayPolicy.fleet_mate``). Reuse classes by hit depend on each cache's own hits:
each policy then has its own hit classes, refitter and refits, and shares only the
trace's previous accesses they read (``FittedSetup.previous``). ``wa-mix``
(``controlplane.replay.mixture``) is made the same way, with its own evictor and
refitter (``FittedSetup.evictor``, ``FittedSetup.refitter``).

``controlplane.replay.catalog`` registers ``fitted_wa`` and ``fitted_wa_ref`` as ``wa`` and
``wa-ref``, where they win over the agent registry's unfitted ones. It must never do I/O.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, fields
from functools import cached_property
from typing import Literal, Protocol, Self

import numpy as np

from agent.policies.base import EvictionPolicy
from agent.policies.wa import WAPolicy
from agent.policies.wa_core import runs
from agent.policy_document import BUILTIN_POLICY, CategoryParams, PolicyDocument
from controlplane.fit import fit_all
from controlplane.fit.per_category import FitResult, max_relative_change
from controlplane.fit.reuse_window import ReuseStats, StatsSnapshot
from controlplane.fit.settings import FitSettings
from controlplane.replay.accesses import (
    AccessColumns,
    HitClasses,
    access_columns,
    block_tokens_of,
    previous_access,
    request_categories,
    with_reuse_class,
)
from controlplane.replay.depth import CostWeightedWA, with_depth_class
from controlplane.replay.options import Attribution, ReplayOptions
from controlplane.replay.reference.fit import (
    REFERENCE_LIFE_S,
    REFERENCE_MIN_GAP_S,
    fit_reference_all,
)
from controlplane.replay.reference.wa_ref import WARefPolicy
from controlplane.traces.arrays import I64
from controlplane.traces.model import Trace


class Refitter(Protocol):
    """Turns the accesses replayed so far into a policy document."""

    def ingest(self, cols: AccessColumns, at: slice | I64) -> None:
        """The accesses at positions ``at`` in ``cols`` have been replayed."""

    def document(self, now: float, version: int) -> PolicyDocument | None:
        """The document to apply at ``now`` (None: nothing to fit from yet)."""


class CensoredRefitter:
    """``fit_all`` on a sliding ``ReuseStats`` window, as the controller does."""

    def __init__(self, names: Sequence[str], settings: FitSettings) -> None:
        self.settings = settings
        self.names = tuple(names)
        self._published: dict[str, CategoryParams] = {}
        """The categories of the last document this refitter gave (none yet)."""
        self.stats = ReuseStats(
            settings.window_s,
            near_concurrent_s=settings.near_concurrent_s,
            n_buckets=settings.window_buckets,
            categories=self.names,
        )

    def ingest(self, cols: AccessColumns, at: slice | I64) -> None:
        self.stats.ingest(cols.ts[at], cols.category[at], cols.prev_ts[at], cols.prev_category[at])

    def fit(self, now: float) -> tuple[StatsSnapshot, FitResult] | None:
        """The window at ``now`` and its fit (None: nothing to fit from yet)."""
        snap = self.stats.snapshot(now)
        if not snap.total_accesses:
            return None
        return snap, fit_all(snap, self.settings)

    def document(self, now: float, version: int) -> PolicyDocument | None:
        fitted = self.fit(now)
        return None if fitted is None else self.document_of(fitted[1], now, version)

    def document_of(self, fit: FitResult, now: float, version: int) -> PolicyDocument | None:
        """The policy document of ``fit``, the pooled fit its default; None when the
        controller would publish nothing: it fitted nothing (``FitResult.fitted``: fewer
        than ``min_samples`` exposures in the window), or it changes no parameter of the
        last document by ``change_threshold`` and brings no new category."""
        if not fit.fitted or fit.pooled is None:
            return None
        if max_relative_change(self._published, fit.fitted) < self.settings.change_threshold:
            return None
        self._published = fit.fitted
        return PolicyDocument(
            version=version,
            created_at=now,
            categories=fit.fitted,
            default=fit.pooled,
            note=f"replay refit at {now:.1f}s from {fit.accesses} exposures",
        )


class ReferenceRefitter:
    """The reference code's fitter on every reuse gap replayed so far (no window)."""

    def __init__(self, names: Sequence[str], life_s: float = REFERENCE_LIFE_S) -> None:
        self.names = tuple(names)
        self.life_s = life_s
        self._gaps: list[list[np.ndarray]] = [[] for _ in self.names]
        self._accesses = np.zeros(len(self.names), dtype=np.int64)

    def ingest(self, cols: AccessColumns, at: slice | I64) -> None:
        k = len(self.names)
        self._accesses += np.bincount(cols.category[at], minlength=k)[:k]
        pc = cols.prev_category[at]
        known = pc >= 0
        gaps = (cols.ts[at] - cols.prev_ts[at])[known]
        pc = pc[known]
        for c in np.unique(pc).tolist():
            self._gaps[c].append(gaps[pc == c])

    def document(self, now: float, version: int) -> PolicyDocument | None:
        gaps = {n: np.concatenate(g) for n, g in zip(self.names, self._gaps, strict=True) if g}
        acc = {n: int(a) for n, a in zip(self.names, self._accesses, strict=True) if a}
        if not acc:
            return None
        cats = fit_reference_all(gaps, acc, min_gap_s=REFERENCE_MIN_GAP_S, life_s=self.life_s)
        return PolicyDocument(
            version=version, created_at=now, categories=cats, note="reference refit"
        )


class Refits:
    """A refitter's documents by the request they apply from, each refit made once.

    A refit before request ``r`` feeds the refitter the accesses replayed since the last
    one and asks it for a document: the trace's accesses up to ``r`` (the same in every
    cache, so the policies of a fleet share one ``Refits``: the first policy to reach a
    refit makes it, the others are handed its document), or with reuse classes by hit
    (``classes``) the accesses this cache has released, its own.
    """

    def __init__(
        self, refitter: Refitter, cols: AccessColumns, classes: HitClasses | None = None
    ) -> None:
        self.refitter = refitter
        self.made = 0
        """Refits made (documents asked of the refitter), however many policies share them."""
        self.published = 0
        """Documents given (a refit the controller would not publish gives none)."""
        self._cols = cols
        self._classes = classes
        self._done = 0  # accesses ingested
        self._last: tuple[int, PolicyDocument | None] = (-1, None)

    def before(self, request: int, hi: int, now: float) -> PolicyDocument | None:
        """The document to apply from ``request`` on, the accesses ``[0, hi)`` replayed
        at trace time ``now`` (None: the one in force stays)."""
        last, doc = self._last
        if request == last:
            return doc
        if request < last or hi < self._done:
            raise RuntimeError(f"refit at request {request}: requests arrive in trace order")
        if self._classes is None:
            self.refitter.ingest(self._cols, slice(self._done, hi))
        else:
            self.refitter.ingest(*self._classes.released_columns())
        self._done = hi
        self.made += 1
        doc = self.refitter.document(now, self.published + 1)
        self.published += doc is not None
        self._last = (request, doc)
        return doc


APPLIED_KEPT = 100
"""Documents a fitted replay policy keeps (the newest): a long replay refits thousands of
times, each document as large as its categories."""


@dataclass(frozen=True)
class AppliedVersion:
    """One document swapped in during the replay."""

    version: int
    at_s: float
    request: int
    """Index of the first request served with it."""
    doc: PolicyDocument


class FittedReplayPolicy:
    """An agent evictor driven through a replay, its parameters refitted as it goes.

    Driven by the replay loop, one ``free`` per request in trace order (it counts them to
    know which request is being served), or through ``TraceIndexed`` (``arrive`` in trace
    order, then ``free_request`` in any order). ``free``'s category argument is
    replaced by this run's category code of the request (labels or inferred), plus, with
    the setup's ``block_class`` (per access, in trace order), that access's class offset,
    or with ``classes`` the class the agent would give it (a hit or an insert): the blocks
    of a request are then released in runs of equal codes, in release order. With
    ``classes`` the split protocol fits when the first scored request arrives (the classes
    of the fitted part are known only once it has been replayed). Made by
    ``FittedSetup.policy``: the trace, options, codes and columns are its setup's, and
    ``refits`` (its own or its fleet's) hold its refitter.
    """

    def __init__(
        self,
        inner: WAPolicy | WARefPolicy,
        setup: FittedSetup,
        refits: Refits,
        classes: HitClasses | None = None,
    ) -> None:
        trace, options = setup.trace, setup.options
        self.inner = inner
        self.in_force: EvictionPolicy = inner
        """What takes the touches, releases and evictions: ``inner``, or the baseline
        ``auto`` switched to (reuse classes are still decided, and refits still made)."""
        self._class = setup.block_class
        self._hit_classes = classes
        self.applied: deque[AppliedVersion] = deque(maxlen=APPLIED_KEPT)
        """The newest documents swapped in, oldest first (at most ``APPLIED_KEPT``)."""
        self.versions_applied = 0
        """Documents swapped in since the start (all of them)."""
        self._codes = setup.codes
        self._ts, self._offsets = setup.times, setup.offsets
        self.refits = refits
        """Where its documents come from: its own, or its fleet's (``fleet_mate``)."""
        self.setup = setup
        """What it was made from, and its fleet mates with it (``fleet_mate``)."""
        self._every = options.refit_every_s
        self._online = options.wa_fit == "online"
        self._r = 0
        n = trace.n_requests
        self._t0 = self._ts[0] if n else 0.0
        self._due = self._t0 + self._every if self._online else float("inf")
        self._split_at = -1  # split protocol, classes: the request that triggers the fit
        if not self._online and n:
            if classes is None:
                self._refit(options.first_scored(trace))
            else:
                self._split_at = options.first_scored(trace)

    @property
    def policy(self) -> PolicyDocument:
        return self.inner.policy

    @property
    def hit_classes(self) -> HitClasses | None:
        """The reuse classes by hit this run decides (``reuse_class="hit"``), or None."""
        return self._hit_classes

    @property
    def refitter(self) -> Refitter:
        return self.refits.refitter

    def fleet_mate(self) -> FittedReplayPolicy:
        """The policy of another cache of a fleet serving the same trace, made before the
        replay starts: an evictor of its own; this one's codes and access columns and,
        without reuse classes by hit, its refits (one refit for the fleet)."""
        return self.setup.policy(self.refits if self._hit_classes is None else None)

    def _refit(self, r: int) -> None:
        """Fit on requests ``[0, r)`` and apply the result from request ``r`` on."""
        now = self._ts[min(r, len(self._ts) - 1)]
        doc = self.refits.before(r, self._offsets[r], now)
        if doc is not None:
            self.inner.set_policy(doc)
            self.applied.append(AppliedVersion(doc.version, now, r, doc))
            self.versions_applied += 1

    def run_notes(self) -> list[str]:
        """What a reader must know of the run: that no refit published a policy (a trace
        shorter than one refit period, or too few accesses), so the run scored the
        built-in default parameters, not a fit (``ExplainsRun``)."""
        if self.versions_applied:
            return []
        if not self._online:
            return [
                "the fit on the first part published no policy (too few accesses): it "
                "ran on the built-in default parameters"
            ]
        span = self._ts[-1] - self._t0 if self._ts else 0.0
        return [
            f"no refit published a policy: it ran on the built-in default parameters (the "
            f"trace spans {span:,.0f} s; a refit comes every {self._every:g} s, --refit-every,"
            " and publishes once enough accesses are seen)"
        ]

    def request_code(self, request: int) -> int:
        """This run's category code of ``request`` (labels or inferred)."""
        return self._codes[request]

    def touch(self, blocks: Sequence[int], now: float) -> None:
        if self._hit_classes is not None:
            self._hit_classes.tracker.touched(blocks)
        self.in_force.touch(blocks, now)

    def free(
        self, blocks: Sequence[int], offsets: Sequence[int], now: float, category: int
    ) -> None:
        r = self._r
        if r >= len(self._codes):
            raise RuntimeError("a fitted replay policy is driven past the end of its trace")
        self._r = r + 1
        self.arrive(r)
        self.free_request(r, blocks, offsets, now)

    def arrive(self, request: int) -> None:
        """Refit before serving ``request`` when a refit is due (trace order)."""
        if request == self._split_at:
            self._refit(request)
        t = self._ts[request]
        if t >= self._due:
            self._refit(request)
            steps = int((t - self._t0) // self._every) + 1
            self._due = self._t0 + steps * self._every

    def free_request(
        self, request: int, blocks: Sequence[int], offsets: Sequence[int], now: float
    ) -> None:
        """Release ``blocks`` (at ``offsets`` in the prompt) of ``request``."""
        if self._hit_classes is not None:
            self._hit_classes.finished(request)
        keys = self.release_codes(request, blocks, offsets, now) if len(blocks) else None
        if keys is None:
            self.in_force.free(blocks, offsets, now, self._codes[request])
            return
        for key, a, b in runs(keys):
            self.in_force.free(blocks[a:b], offsets[a:b], now, key)

    def release_codes(
        self, request: int, blocks: Sequence[int], offsets: Sequence[int], now: float
    ) -> list[int] | None:
        """The code each of ``blocks`` of ``request`` is filed under (by reuse or depth
        class), or None when they all take the request's category."""
        code = self._codes[request]
        lo = self._offsets[request]
        classes, by_trace = self._hit_classes, self._class
        if classes is not None:
            return [code + shift for shift in classes.classify(lo, blocks, offsets)]
        if by_trace is not None:
            return [code + by_trace[lo + o] for o in offsets]
        return None

    def evict(self, n: int) -> list[int]:
        victims = self.in_force.evict(n)
        if self._hit_classes is not None:
            self._hit_classes.tracker.evicted(victims)
        return victims

    def __len__(self) -> int:
        return len(self.in_force)

    def __contains__(self, block: object) -> bool:
        return block in self.in_force


Evictor = Literal["wa", "wa-ref"]
Fitter = Literal["censored", "reference"]


def build(
    kind: Evictor,
    trace: Trace,
    options: ReplayOptions,
    *,
    fitter: Fitter | None = None,
    capacity: int = 0,
) -> FittedReplayPolicy:
    """A fitted ``wa`` (``kind="wa"``) or ``wa-ref`` for a replay of ``trace`` in a cache
    of ``capacity`` blocks (the size of the ghost of reuse classes by hit).

    ``fitter`` defaults to each one's own (``wa``: censored, ``wa-ref``: reference); the
    ablation report crosses them. ``wa-ref`` always attributes a block to its creator, so
    it files by no reuse class by hit (they need the last accessor): it runs plain.
    """
    return FittedSetup.of(kind, trace, options, fitter, capacity).policy()


def request_lists(trace: Trace) -> tuple[list[float], list[int]]:
    """The trace's request times and access offsets, as lists (read per request)."""
    return trace.timestamps.tolist(), trace.offsets.tolist()


def read_only(cols: AccessColumns) -> AccessColumns:
    """``cols`` through views that cannot be written: the policies of a fleet share them."""
    views = {f.name: getattr(cols, f.name).view() for f in fields(cols)}
    for view in views.values():
        view.setflags(write=False)
    return AccessColumns(**views)


@dataclass(frozen=True, eq=False)
class FittedSetup:
    """What ``build`` derives from the trace and the options alone, the same for every
    cache that replays the trace (the policies of a fleet share it): the category codes,
    the access columns (read-only), reuse or depth class offsets and request lists, and
    with reuse classes by hit the trace's previous accesses (``previous``). A subclass
    gives another evictor and refitter (``wa-mix``, ``wa-pace``) and shares the rest the same
    way."""

    kind: Evictor
    trace: Trace
    options: ReplayOptions
    fitter: Fitter
    capacity: int
    codes: list[int]
    names: tuple[str, ...]
    attribution: Attribution
    cols: AccessColumns
    block_class: list[int] | None
    times: list[float]
    offsets: list[int]

    @classmethod
    def of(
        cls,
        kind: Evictor,
        trace: Trace,
        options: ReplayOptions,
        fitter: Fitter | None,
        capacity: int,
    ) -> Self:
        codes, names = request_categories(trace, options.categories)
        attr: Attribution = "creator" if kind == "wa-ref" else options.attribution
        cols = access_columns(trace, codes, attr)
        block_class = None
        if options.reuse_class == "trace":
            cols, names, offsets = with_reuse_class(trace, cols, names)
            block_class = offsets.tolist()
        elif options.depth != "off":
            block_tokens = block_tokens_of(trace) or 16
            cols, names, offsets = with_depth_class(trace, cols, names, block_tokens)
            block_class = offsets.tolist()
        fitter = fitter or ("reference" if kind == "wa-ref" else "censored")
        times, request_offsets = request_lists(trace)
        return cls(
            kind,
            trace,
            options,
            fitter,
            capacity,
            codes.tolist(),
            tuple(names),
            attr,
            read_only(cols),
            block_class,
            times,
            request_offsets,
        )

    @cached_property
    def previous(self) -> I64:
        """Per access, the position of its block's previous access in the trace (-1 for
        the first), read only: built once, at the first policy with hit classes."""
        previous = previous_access(self.trace.blocks)
        previous.setflags(write=False)
        return previous

    @property
    def by_hit(self) -> bool:
        """Reuse classes by hit, each cache's own (``wa-ref`` files by none)."""
        o = self.options
        return o.reuse_class == "hit" and o.depth == "off" and self.kind != "wa-ref"

    def policy(self, shared: Refits | None = None) -> FittedReplayPolicy:
        """A policy with an evictor of its own and ``shared`` refits (None: its own)."""
        names, classes = self.names, None
        if self.by_hit:
            ghost = round(self.options.reuse_ghost * self.capacity)
            classes = HitClasses(self.trace, self.cols, names, ghost, previous=self.previous)
            names = classes.names
        refits = shared if shared is not None else Refits(self.refitter(names), self.cols, classes)
        return self.driver(self.evictor(names, refits.refitter), refits, classes)

    def driver(
        self, evictor: WAPolicy | WARefPolicy, refits: Refits, classes: HitClasses | None
    ) -> FittedReplayPolicy:
        """The replay policy that drives ``evictor`` (a subclass may drive it its own way)."""
        return FittedReplayPolicy(evictor, self, refits, classes)

    def evictor(self, names: Sequence[str], refitter: Refitter) -> WAPolicy | WARefPolicy:
        """A cache's own evictor, applied the documents of ``refitter`` (``wa`` and
        ``wa-ref`` need nothing else of it)."""
        if self.kind == "wa-ref":
            return WARefPolicy(category_names=names, doc=BUILTIN_POLICY)
        evictor = CostWeightedWA if self.options.depth == "cost" else WAPolicy
        return evictor(category_names=names, doc=BUILTIN_POLICY, attribution=self.attribution)

    def refitter(self, names: Sequence[str]) -> Refitter:
        if self.fitter == "reference":
            life = self.options.life_s if self.options.life_s is not None else REFERENCE_LIFE_S
            return ReferenceRefitter(names, life_s=life)
        return CensoredRefitter(names, self.options.fit_settings(self.trace))


def fitted_wa(capacity: int, trace: Trace, options: ReplayOptions) -> FittedReplayPolicy:
    """``wa`` fitted online (or split) during the replay."""
    return build("wa", trace, options, capacity=capacity)


def fitted_wa_ref(capacity: int, trace: Trace, options: ReplayOptions) -> FittedReplayPolicy:
    """``wa-ref`` with the reference fitter, fitted the same way as ``wa``."""
    return build("wa-ref", trace, options)

"""A worker's miniature caches at one capacity, and new ones warmed while the old serve on.

Owns ``Modeled`` (what a worker's miniatures stand for), ``Miniatures`` (every policy at
every ladder step, each with its window's counts; ``wa`` under the document in force,
filing by reuse class and evicting superseded branches first where the worker does)
and ``Warming`` (a worker's next miniatures: built and warmed with the window's kept
requests off the evaluator's lock, then caught up on what came meanwhile, in the order it
came, until they replace the old). A warm replays up to the whole buffer of kept requests
through every miniature, seconds on a busy host; what comes meanwhile is recorded by the
evaluator (under its lock) as it serves the old miniatures, and replayed here in order,
so the new miniatures end as if they had been warmed at once when the warm began and
served everything after. It must never take the evaluator's lock, rebuild requests or
read a worker's stream.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from agent.category_table import reused_name
from agent.policies import create
from agent.policies.wa import WAPolicy
from agent.policy_document import PolicyDocument
from agent.reuse_classes import ReturnTracker
from controlplane.shadow.estimator import MAX_SUBTREES, MiniCache, ReuseClassing, WindowCounts
from controlplane.shadow.rebuild import Request
from controlplane.shadow.settings import ShadowSettings

WA = "wa"


@dataclass(frozen=True)
class Modeled:
    """What a worker's miniatures stand for, from its heartbeat: its capacity (as the
    shadow models it), the ghost of its reuse classes in blocks (None: it files none),
    and whether its eviction runs the document's ``supersede`` rule under ``wa``."""

    capacity: int
    reuse_ghost: int | None = None
    supersedes: bool = False


@dataclass
class Ladder:
    """One policy at every multiple of the worker's capacity."""

    caches: list[MiniCache]
    counts: list[WindowCounts]


@dataclass(frozen=True)
class Served:
    """Sampled requests that came while new miniatures warmed, each with its size per
    ladder step at the new capacity, as it stood once that request was in."""

    requests: list[Request]
    sizes: list[list[int]] | None


CatchUp = Served | PolicyDocument
"""What came while new miniatures warmed: requests, or a new document for ``wa``."""


def branch_rule(supersedes: bool, doc: PolicyDocument) -> bool:
    """Whether ``wa`` evicts superseded branches first under ``doc`` for a worker whose
    eviction runs the rule where a document says so (``supersedes``)."""
    return supersedes and doc.supersede == "tree"


def ghost_share(capacity: int, reuse_ghost: int | None, size: int) -> int | None:
    """A miniature of ``size`` blocks' ghost: the worker's ghost-to-capacity share (None:
    the worker files no reuse classes)."""
    if reuse_ghost is None or not capacity:
        return None
    return round(size * reuse_ghost / capacity)


class Miniatures:
    """Every policy at every ladder step of one worker as ``modeled`` (each cache built at
    its nominal size, ``sizes``; the first request served resizes it), ``wa`` replaying
    ``doc`` with the category ``names`` known so far."""

    def __init__(
        self,
        modeled: Modeled,
        sizes: list[int],
        doc: PolicyDocument,
        names: Sequence[str],
        settings: ShadowSettings,
    ) -> None:
        self.modeled = modeled
        self.capacity = modeled.capacity
        self.reuse_ghost = modeled.reuse_ghost
        """The ghost of its reuse classes in blocks (None: it files none)."""
        self.ladders: dict[str, Ladder] = {}
        self.wa: list[WAPolicy] = []
        self.wa_caches: list[MiniCache] = []
        self.names = list(names)
        """The category names the ``wa`` caches have been told, by code."""
        self._codes = {name: code for code, name in enumerate(names)}
        self.curves_since: float | None = None
        """From when its caches count (None: nothing served yet)."""
        window, buckets = settings.shadow_window_s, settings.shadow_buckets
        for name in (WA, *settings.baselines):
            caches = [self._cache(name, size, doc, names) for size in sizes]
            counts = [WindowCounts(window, buckets, MAX_SUBTREES) for _ in sizes]
            self.ladders[name] = Ladder(caches, counts)

    def _cache(self, name: str, size: int, doc: PolicyDocument, names: Sequence[str]) -> MiniCache:
        """``name`` at ``size`` blocks; ``wa`` files by reuse class as the worker does,
        with a ghost of the worker's share (its ghost over its capacity)."""
        if name != WA:
            return MiniCache(create(name, size), size)
        wa = WAPolicy(size, category_names=names, doc=doc)
        self.wa.append(wa)
        ghost = ghost_share(self.capacity, self.reuse_ghost, size)
        classing = None
        if ghost is not None and self.reuse_ghost is not None:
            per_block = self.reuse_ghost / self.capacity
            classing = ReuseClassing(ReturnTracker(ghost), self._reuse_class_code, per_block)
        cache = MiniCache(wa, size, classing)
        cache.run_branch_rule(branch_rule(self.modeled.supersedes, doc))
        self.wa_caches.append(cache)
        return cache

    def _reuse_class_code(self, code: int) -> int:
        """The code of the reuse class of the category coded ``code``, as told."""
        return self._codes[reused_name(self.names[code])]

    def tell_categories(self, names: Sequence[str]) -> None:
        """The ``wa`` caches learn the category names as they stand: the new ones, and
        a code given again to another category (``CategoryTable``), whose blocks still
        queued are judged by the new name's parameters from then on."""
        if len(names) == len(self.names) and names == self.names:
            return
        for code, name in enumerate(names):
            if code >= len(self.names):
                self.names.append(name)
            elif self.names[code] != name:
                if self._codes.get(self.names[code]) == code:
                    del self._codes[self.names[code]]
                self.names[code] = name
            else:
                continue
            self._codes[name] = code
            for wa in self.wa:
                wa.name_category(code, name)

    def set_policy(self, doc: PolicyDocument) -> None:
        """The document the ``wa`` caches replay from the next request on."""
        for wa in self.wa:
            wa.set_policy(doc)
        for cache in self.wa_caches:
            cache.run_branch_rule(branch_rule(self.modeled.supersedes, doc))

    def resize(self, sizes: list[int]) -> None:
        """Every cache at its step's size of ``sizes``."""
        for ladder in self.ladders.values():
            for cache, size in zip(ladder.caches, sizes, strict=True):
                cache.resize(size)

    def serve(self, requests: list[Request], sizes: list[list[int]] | None = None) -> None:
        """Every request through every cache, each sized as ``sizes`` says for it (None:
        as they stand), counted from ``curves_since`` on (the first request's time, if
        not set before)."""
        if not requests:
            return
        if self.curves_since is None:
            self.curves_since = requests[0].ts
        counted_from = self.curves_since
        for ladder in self.ladders.values():
            for step, (cache, counts) in enumerate(zip(ladder.caches, ladder.counts, strict=True)):
                for i, request in enumerate(requests):
                    if sizes is not None:
                        cache.resize(sizes[i][step])
                    hits = cache.serve(request)
                    if request.ts >= counted_from:
                        counts.add(
                            request.ts,
                            hits,
                            len(request.blocks),
                            request.seen_hits,
                            request.subtree,
                        )


@dataclass
class Warming:
    """A worker's next miniatures, from what the evaluator handed over when it began:
    what they stand for, its caches' nominal sizes and their sizes for the kept requests
    (the inflow share as it stood), the document in force, the category names known and
    the kept requests, counted from ``curves_since`` (None: all)."""

    modeled: Modeled
    nominal: list[int]
    sizes: list[int]
    doc: PolicyDocument
    names: list[str]
    requests: list[Request]
    curves_since: float | None
    pending: list[CatchUp] = field(default_factory=list)
    """What came since it began and is not caught up yet (the evaluator appends)."""
    miniatures: Miniatures | None = None

    @property
    def capacity(self) -> int:
        return self.modeled.capacity

    def pending_accesses(self) -> int:
        """Accesses of the requests still to catch up."""
        served = (item for item in self.pending if isinstance(item, Served))
        return sum(len(request.blocks) for item in served for request in item.requests)

    def warm(self, settings: ShadowSettings) -> None:
        """Build the new miniatures and replay the kept requests through them (the long
        part: the evaluator runs it off its lock)."""
        miniatures = Miniatures(
            self.modeled,
            self.nominal,
            self.doc,
            self.names,
            settings,
        )
        miniatures.curves_since = self.curves_since
        if self.requests:
            miniatures.resize(self.sizes)
            miniatures.serve(self.requests)
        self.miniatures = miniatures

    def catch_up(self, items: list[CatchUp], names: Sequence[str]) -> None:
        """Replay ``items`` in order; ``names``: the category names known by then."""
        miniatures = self.miniatures
        if miniatures is None:
            raise RuntimeError("catch_up before warm")
        miniatures.tell_categories(names)
        for item in items:
            if isinstance(item, Served):
                miniatures.serve(item.requests, item.sizes)
            else:
                miniatures.set_policy(item)

"""``wa-superseded`` in replay: a cached branch that a newer request has left is evicted first.

Owns the two rules that say which blocks a request supersedes (``BranchTracker``: the
prefix tree, ``ChatTracker``: the conversation), ``SupersedingReplayPolicy`` (``wa``'s
fitted replay with a queue of superseded blocks in front of its own) and
``superseding_wa``, the catalogue's factory (``superseding``: the same for ``auto``'s
``wa`` with ``auto_supersede``, reuse classes included; only while ``wa`` is in force).

The idea: a request that follows a cached chain for its first ``d`` blocks and then
diverges has replaced what followed block ``d`` before: a turn whose app dropped old
history past its context limit, or replaced last turn's search results or retrieved
passages, or whose last partial block now holds more tokens. The old sibling branch is
likely dead. The rules, each causal (a request sees only the requests before it):

- ``tree``: per block seen so far, its latest child and the last request that accessed
  it. A request whose first new block (never seen) follows block ``x`` at position ``d``
  diverges from ``x``'s latest child ``c`` when ``x`` has one: the blocks from position
  ``d`` of the last request through ``c`` are superseded. A block where branches have
  parted before (a shared system prompt that many conversations leave) is a fan-out
  point, not a replacement: with ``every_fork`` false only the first divergence at a
  block supersedes anything.
- ``chat``: a request whose parent request (``parent_chat_id``) is in the trace
  supersedes the parent's blocks past the prefix the two share. It needs conversation
  ids, which a serving engine does not see; a trace without parents (Mooncake) gives
  nothing to supersede.

Superseded blocks are demoted outright: each eviction takes the oldest superseded blocks
still cached and not accessed since (tail first within a branch), dropping them from
``wa``'s queues, before ``wa`` picks from its own. Filing them under a class of their
own would move a block between time-ordered queues mid-idle and fit a curve from
accesses the refitter does not see classified, so this experiment does not.
docs/policy.md ("A better wa") says what it measured. The vLLM agent runs the ``tree``
rule on its own blocks (``agent.branches``, behind the document's
``supersede``), checked against ``BranchTracker`` in tests. It must never do
I/O.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from itertools import pairwise, repeat
from typing import Literal, Protocol

from agent.policies.wa import WAPolicy
from controlplane.replay.accesses import HitClasses
from controlplane.replay.online import FittedReplayPolicy, FittedSetup, Refits
from controlplane.replay.options import ReplayOptions
from controlplane.replay.reference.wa_ref import WARefPolicy
from controlplane.traces.model import Trace

Scope = Literal["tree", "chat", "tree-every-fork"]
"""Which rule says what a request supersedes (the module docstring)."""
SCOPES: tuple[Scope, ...] = ("tree", "chat", "tree-every-fork")
DEFAULT_SCOPE: Scope = "tree"
"""The rule ``wa-superseded`` replays with: ``tree``, the one a serving engine could run
(docs/policy.md, "A better wa", gives every rule's seed-7 figures)."""


class Tracker(Protocol):
    """What each request supersedes, told the requests in trace order."""

    def arrive(self, request: int, blocks: Sequence[int]) -> Sequence[int]:
        """``request`` (its ``blocks`` in prompt order) arrives: the blocks of earlier
        requests it supersedes, in prompt order."""


class LastAccess:
    """Per block seen so far, the last request that accessed it."""

    def __init__(self) -> None:
        self.request: dict[int, int] = {}

    def seen(self, blocks: Sequence[int]) -> int:
        """How many leading ``blocks`` have been seen before (a block after a new one is
        new too in a prefix-consistent trace; the count stops at the first new one)."""
        known = self.request
        for i, block in enumerate(blocks):
            if block not in known:
                return i
        return len(blocks)

    def accessed(self, request: int, blocks: Sequence[int]) -> None:
        self.request.update(zip(blocks, repeat(request)))

    def untouched_since(self, block: int, request: int) -> bool:
        """No request from ``request`` on has accessed ``block``."""
        return self.request.get(block, -1) < request


class BranchTracker:
    """The ``tree`` rule: per block its latest child, the parting points seen so far."""

    def __init__(self, trace: Trace, last: LastAccess, *, every_fork: bool = False) -> None:
        self._trace = trace
        self._last = last
        self._every_fork = every_fork
        self._child: dict[int, int] = {}
        self._forked: set[int] = set()

    def arrive(self, request: int, blocks: Sequence[int]) -> Sequence[int]:
        d = self._last.seen(blocks)
        superseded: Sequence[int] = ()
        if 0 < d < len(blocks):
            superseded = self._parted(blocks[d - 1], d)
        self._child.update(pairwise(blocks))
        return superseded

    def _parted(self, fork: int, d: int) -> Sequence[int]:
        """A request leaves ``fork`` (at position ``d - 1``) for a new block: the old
        branch from position ``d`` when ``fork`` had a child and may supersede."""
        old = self._child.get(fork)
        if old is None:
            return ()  # the request extends a leaf: nothing is left behind
        first = fork not in self._forked
        self._forked.add(fork)
        if not (first or self._every_fork):
            return ()
        owner = self._last.request[old]
        branch: list[int] = self._trace.request_blocks(owner)[d:].tolist()
        return branch if branch and branch[0] == old else ()


class ChatTracker:
    """The ``chat`` rule: a request supersedes its parent request's blocks past their
    shared prefix."""

    def __init__(self, trace: Trace) -> None:
        self._trace = trace
        self._parent = trace.parent_chat_ids.tolist()
        self._request_of: dict[int, int] = {}
        self._chat = trace.chat_ids.tolist()

    def arrive(self, request: int, blocks: Sequence[int]) -> Sequence[int]:
        chat = self._chat[request]
        if chat >= 0:
            self._request_of.setdefault(chat, request)
        parent = self._request_of.get(self._parent[request])
        if parent is None:
            return ()
        old: list[int] = self._trace.request_blocks(parent).tolist()
        return old[shared_prefix(old, blocks) :]


def shared_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Leading positions where ``a`` and ``b`` hold the same block."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


def checked_scope(scope: Scope) -> Scope:
    """``scope``, refused by name when it is none of ``SCOPES``."""
    if scope not in SCOPES:
        raise ValueError(f"supersede scope must be one of {', '.join(SCOPES)}, got {scope!r}")
    return scope


def tracker(scope: Scope, trace: Trace, last: LastAccess) -> Tracker:
    """The rule of ``scope`` over ``trace``, reading ``last``."""
    if checked_scope(scope) == "chat":
        return ChatTracker(trace)
    return BranchTracker(trace, last, every_fork=scope == "tree-every-fork")


class Marks:
    """The rule's state since tracking (re)started: each block's last access, the rule's
    tracker, and the superseded blocks (block -> the request that superseded it), oldest
    first."""

    def __init__(self, scope: Scope, trace: Trace) -> None:
        self.last = LastAccess()
        self.tracker = tracker(scope, trace, self.last)
        self.superseded: OrderedDict[int, int] = OrderedDict()


class SupersedingReplayPolicy(FittedReplayPolicy):
    """``wa``'s fitted replay whose evictions take superseded blocks first: the oldest
    superseded, still cached and not accessed since it was superseded.

    Only while ``wa`` is in force: when ``auto`` runs a baseline instead (``in_force``),
    the baseline keeps its own order and nothing is tracked, and tracking starts afresh
    when ``wa`` is back, as the vLLM agent's free queue does on a switch of family
    (``agent.integrations.block_queue``)."""

    def __init__(
        self,
        inner: WAPolicy,
        setup: FittedSetup,
        refits: Refits,
        scope: Scope,
        classes: HitClasses | None = None,
    ) -> None:
        super().__init__(inner, setup, refits, classes)
        self._wa = inner
        self._blocks = setup.trace.blocks
        self._scope = scope
        self._marks: Marks | None = Marks(scope, setup.trace)
        self.demoted = 0
        """Blocks evicted because they were superseded."""

    def arrive(self, request: int) -> None:
        super().arrive(request)
        if self.in_force is not self._wa:
            self._marks = None
            return
        marks = self._marks
        if marks is None:
            marks = self._marks = Marks(self._scope, self.setup.trace)
        offsets = self.setup.offsets
        lo, hi = offsets[request], offsets[request + 1]
        blocks = self._blocks[lo:hi].tolist()
        superseded = marks.superseded
        for block in reversed(marks.tracker.arrive(request, blocks)):
            superseded.pop(block, None)
            superseded[block] = request
        marks.last.accessed(request, blocks)

    def evict(self, n: int) -> list[int]:
        victims = self._superseded_victims(n)
        if victims:
            self._wa.discard(victims)
            self.demoted += len(victims)
            if self.hit_classes is not None:
                self.hit_classes.tracker.evicted(victims)
        if len(victims) < n:
            victims += super().evict(n - len(victims))
        return victims

    def _superseded_victims(self, n: int) -> list[int]:
        """Up to ``n`` superseded blocks still cached and untouched since, oldest first
        (none while a baseline is in force)."""
        victims: list[int] = []
        marks = self._marks
        if marks is None or self.in_force is not self._wa:
            return victims
        superseded, wa, last = marks.superseded, self._wa, marks.last
        while superseded and len(victims) < n:
            block, by = superseded.popitem(last=False)
            if block in wa and last.untouched_since(block, by):
                victims.append(block)
        return victims


@dataclass(frozen=True, eq=False)
class SupersededSetup(FittedSetup):
    """``wa``'s setup whose policies demote what the rule of ``scope`` supersedes."""

    scope: Scope = "tree"

    def driver(
        self, evictor: WAPolicy | WARefPolicy, refits: Refits, classes: HitClasses | None
    ) -> SupersedingReplayPolicy:
        if not isinstance(evictor, WAPolicy):
            raise TypeError("superseded blocks are demoted by wa, not wa-ref")
        return SupersedingReplayPolicy(evictor, self, refits, self.scope, classes)

    def policy(self, shared: Refits | None = None) -> SupersedingReplayPolicy:
        policy = super().policy(shared)
        assert isinstance(policy, SupersedingReplayPolicy)  # ``driver``'s
        return policy


SupersedingFactory = Callable[[int, Trace, ReplayOptions], SupersedingReplayPolicy]
"""A replay factory (``controlplane.replay.catalog``) of ``wa-superseded``."""


def superseding_wa(scope: Scope = "tree") -> SupersedingFactory:
    """``wa-superseded`` under the rule of ``scope``."""
    checked_scope(scope)

    def factory(capacity: int, trace: Trace, options: ReplayOptions) -> SupersedingReplayPolicy:
        plain = replace(options, reuse_class="off", depth="off")
        return superseding(trace, plain, capacity, scope)

    return factory


def superseding(
    trace: Trace, options: ReplayOptions, capacity: int, scope: Scope = "tree"
) -> SupersedingReplayPolicy:
    """``online.build``'s ``wa`` for ``options`` (reuse or depth classes included) whose
    evictions take first what the rule of ``scope`` supersedes: ``auto``'s ``wa`` with
    the policy document's ``supersede: tree`` (``ReplayOptions.auto_supersede``)."""
    setup = SupersededSetup.of("wa", trace, options, None, capacity)
    return replace(setup, scope=checked_scope(scope)).policy()


fitted_wa_superseded = superseding_wa(DEFAULT_SCOPE)
"""``wa-superseded`` under the rule chosen on seed 7 (``DEFAULT_SCOPE``)."""

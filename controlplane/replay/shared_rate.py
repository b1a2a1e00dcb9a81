"""``wa-shared``, replay only: a shared prefix is ranked by its own reuse rate.

Owns ``BlockHistory`` (what one cache knows of each block it holds or recently evicted),
the rate classes (``rate_class``, ``RATE_CLASS_NAMES``), ``SharedRateWA`` (``wa``'s
evictor over them), ``SharedRateFiling`` (the codes a release is filed under, for this
replay and for a shadow's miniature of it) and ``fitted_wa_shared``.

Why: a category's curve is fitted over all its blocks, and a few of them are not like
the rest. A platform's system prompt, or an application's long template, is read by
every request that starts with it, at that traffic's own pace; a template a request
every few minutes reads is filed with the fast returns of busier ones, and its
category's curve, fitted mostly on those, says it is dead a few seconds after each use.
S3-FIFO keeps such a block for its frequency, and on the synthetic to-B trace it beat
``wa`` at 2-20 % of unique blocks for that reason (docs/policy.md).

The rule, from what an engine sees (no conversation ids): a block is *shared* once it,
or a block after it on a prompt, has had ``FAN_OUT`` distinct next blocks: a fan-out
point, where many prompts part (the tree rule of ``wa-superseded`` calls it a block
where branches parted before), and the prefix leading to it. A conversation's history
does not fan out: each turn continues the last (it parts at most in two, where a
turn's partial last block is left behind). A shared block that has been read ``k >= 1``
times before, first at ``t0``, is filed under the rate class of its own mean gap,
``a = k / (now - t0)`` rounded to a half octave; the class's curve is ``p = (k + 1) /
(k + 2)`` (Laplace's rule of succession, ``k`` counted up to ``MAX_READS``) at rate
``a``, with the document's default life window. Every other block is filed as ``wa``
with reuse classes by hit files it (``HitClasses``). Each class is one time-ordered
queue with one ``(lc, a)``, so ``wa``'s key, its per-queue monotonicity in idle time
and its eviction loop hold as they are; only the categories are fitted.

What it remembers is bounded as an agent's would be: the blocks the cache holds and the
last it evicted, as many as the reuse classes' ghost (``ReplayOptions.reuse_ghost``
capacities, 16 by default); a block leaving that ghost is forgotten (its reads, its
children, whether it is shared). The agent, the device
evictor and the shadow do not run this: docs/policy.md ("Shared prefixes at their own
rate") says what it measured. It must never do I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from agent.policies.wa import WAPolicy
from agent.policies.wa_core import Const
from agent.policy_document import BUILTIN_POLICY
from controlplane.replay.accesses import HitClasses
from controlplane.replay.online import FittedReplayPolicy, FittedSetup, Refits, Refitter
from controlplane.replay.options import ReplayOptions
from controlplane.replay.reference.wa_ref import WARefPolicy
from controlplane.traces.model import Trace

FAN_OUT = 3
"""Distinct next blocks that make a block a fan-out point (two is a conversation's turn
leaving its partial last block behind)."""
MAX_READS = 8
"""Earlier reads counted in a rate class (more count as this many)."""
HALF_OCTAVES = range(-24, 13)
"""Rate classes, in half octaves of reads per second: ``2^-12`` to ``2^6``."""
RATE_MARK = "@rate"
"""Starts a rate class's name: ``@rate<half octave>@<reads>``."""
RATE_CLASS_NAMES = tuple(
    f"{RATE_MARK}{step}@{reads}" for reads in range(1, MAX_READS + 1) for step in HALF_OCTAVES
)
"""Every rate class, in code order (after the categories' codes)."""


def rate_class(reads: int, first_read: float, now: float) -> int:
    """The index in ``RATE_CLASS_NAMES`` of a block read ``reads >= 1`` times before
    ``now``, first at ``first_read``."""
    rate = reads / max(now - first_read, 1e-3)
    step = min(max(round(2.0 * math.log2(rate)), HALF_OCTAVES[0]), HALF_OCTAVES[-1])
    return (min(reads, MAX_READS) - 1) * len(HALF_OCTAVES) + step - HALF_OCTAVES[0]


def rate_class_const(name: str, life_s: float) -> Const | None:
    """``(lc, a)`` of rate class ``name`` (None: not a rate class)."""
    if not name.startswith(RATE_MARK):
        return None
    step, reads = (int(part) for part in name.removeprefix(RATE_MARK).split("@"))
    rate = math.pow(2.0, step / 2.0)
    p = (reads + 1) / (reads + 2)
    return math.log(p) + math.log(-math.expm1(-rate * life_s)), rate


class _Seen:
    """One block's history: reads before the latest, its first read, the block before
    it on its prompts, its distinct next blocks (up to ``FAN_OUT``), whether shared."""

    __slots__ = ("children", "first_read", "parent", "reads", "shared")

    def __init__(self, now: float, parent: int | None) -> None:
        self.reads = 0
        self.first_read = now
        self.parent = parent
        self.children: set[int] = set()
        self.shared = False


class BlockHistory:
    """What one cache knows of the blocks it holds and of the last ``ghost_size`` it
    evicted (oldest first): their reads and whether they are shared (module docstring)."""

    def __init__(self, ghost_size: int) -> None:
        self.ghost_size = ghost_size
        self._seen: dict[int, _Seen] = {}
        self._ghost: dict[int, None] = {}

    def read(self, prompt: Sequence[int], now: float) -> None:
        """A request read ``prompt`` (its blocks in prompt order) at ``now``."""
        seen, parent = self._seen, None
        for block in prompt:
            entry = seen.get(block)
            if entry is None:
                seen[block] = _Seen(now, parent)
            else:
                entry.reads += 1
                self._ghost.pop(block, None)
            if parent is not None:
                self._add_child(parent, block)
            parent = block

    def _add_child(self, parent: int, child: int) -> None:
        entry = self._seen.get(parent)
        if entry is None or len(entry.children) >= FAN_OUT or child in entry.children:
            return
        entry.children.add(child)
        if len(entry.children) == FAN_OUT:
            self._mark_shared(parent)

    def _mark_shared(self, block: int | None) -> None:
        """``block`` and the prefix before it, up to the first block already shared."""
        while block is not None:
            entry = self._seen.get(block)
            if entry is None or entry.shared:
                return
            entry.shared = True
            block = entry.parent

    def rate_class(self, block: int, now: float) -> int | None:
        """The rate class of ``block`` if it is shared and was read before, else None."""
        entry = self._seen.get(block)
        if entry is None or not entry.shared or entry.reads < 1:
            return None
        return rate_class(entry.reads, entry.first_read, now)

    def evicted(self, blocks: Sequence[int]) -> None:
        """``blocks`` left the cache: they join the ghost; the oldest past it are forgotten."""
        ghost = self._ghost
        ghost.update(dict.fromkeys(blocks))
        while len(ghost) > self.ghost_size:
            forgotten = next(iter(ghost))
            del ghost[forgotten]
            self._seen.pop(forgotten, None)

    def __len__(self) -> int:
        return len(self._seen)


class SharedRateWA(WAPolicy):
    """``wa`` whose category table ends with the rate classes (``RATE_CLASS_NAMES``)."""

    __slots__ = ()

    def _const_of(self, name: str | None) -> Const:
        if name is not None:
            const = rate_class_const(name, self._doc.default.life_s)
            if const is not None:
                return const
        return super()._const_of(name)


class SharedRateFiling:
    """Files a cache's released blocks under their rate class where ``history`` gives
    one: the codes from ``first_rate_code`` on name ``RATE_CLASS_NAMES``. What the replay
    of ``wa-shared`` and a shadow's miniature of it both run."""

    def __init__(self, history: BlockHistory, first_rate_code: int, capacity: int) -> None:
        self.history = history
        self.first_rate_code = first_rate_code
        self._ghost_per_block = history.ghost_size / capacity if capacity else 0.0

    def resize(self, capacity: int) -> None:
        """The cache holds ``capacity`` blocks now: the ghost keeps its share of them."""
        self.history.ghost_size = round(capacity * self._ghost_per_block)

    def codes(
        self, blocks: Sequence[int], offsets: Sequence[int], codes: list[int], now: float
    ) -> list[int]:
        """The codes of a request's released ``blocks`` (at ``offsets`` in its prompt,
        in any order), ``codes`` as filed without rate classes; the history reads the
        prompt first."""
        in_prompt_order = sorted(range(len(blocks)), key=offsets.__getitem__)
        history = self.history
        history.read([blocks[i] for i in in_prompt_order], now)
        first = self.first_rate_code
        out = list(codes)
        for i, block in enumerate(blocks):
            rate = history.rate_class(block, now)
            if rate is not None:
                out[i] = first + rate
        return out

    def evicted(self, victims: Sequence[int]) -> None:
        self.history.evicted(victims)


class SharedRateReplayPolicy(FittedReplayPolicy):
    """``wa``'s fitted replay with reuse classes by hit, whose shared blocks with reads
    before are filed under their rate class instead (``filing``)."""

    def __init__(
        self,
        inner: SharedRateWA,
        setup: FittedSetup,
        refits: Refits,
        classes: HitClasses | None,
        history: BlockHistory,
    ) -> None:
        if classes is None:
            raise ValueError("wa-shared files the other blocks by reuse class: it needs them")
        super().__init__(inner, setup, refits, classes)
        first_rate_code = len(inner.category_names) - len(RATE_CLASS_NAMES)
        self.filing = SharedRateFiling(history, first_rate_code, setup.capacity)

    def release_codes(
        self, request: int, blocks: Sequence[int], offsets: Sequence[int], now: float
    ) -> list[int]:
        by_class = super().release_codes(request, blocks, offsets, now)
        assert by_class is not None  # the constructor refused a policy without reuse classes
        return self.filing.codes(blocks, offsets, by_class, now)

    def evict(self, n: int) -> list[int]:
        victims = super().evict(n)
        self.filing.evicted(victims)
        return victims


class SharedRateSetup(FittedSetup):
    """``wa``'s setup (reuse classes by hit) with ``wa-shared``'s evictor and history."""

    def evictor(self, names: Sequence[str], refitter: Refitter) -> SharedRateWA:
        return SharedRateWA(
            category_names=(*names, *RATE_CLASS_NAMES),
            doc=BUILTIN_POLICY,
            attribution=self.attribution,
        )

    def driver(
        self, evictor: WAPolicy | WARefPolicy, refits: Refits, classes: HitClasses | None
    ) -> SharedRateReplayPolicy:
        if not isinstance(evictor, SharedRateWA):
            raise TypeError(f"wa-shared drives a SharedRateWA, not {evictor!r}")
        history = BlockHistory(round(self.options.reuse_ghost * self.capacity))
        return SharedRateReplayPolicy(evictor, self, refits, classes, history)


def wa_shared_options(options: ReplayOptions) -> ReplayOptions:
    """The run's options as ``wa-shared`` fits by them: reuse classes by hit, no depth."""
    return replace(options, reuse_class="hit", depth="off")


def fitted_wa_shared(capacity: int, trace: Trace, options: ReplayOptions) -> FittedReplayPolicy:
    """``wa-shared``: ``wa`` with reuse classes by hit, fitted online (or split), its
    shared blocks at their own rate."""
    return SharedRateSetup.of("wa", trace, wa_shared_options(options), None, capacity).policy()

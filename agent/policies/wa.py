"""``wa``: the workload-aware policy (docs/policy.md), fitted parameters swapped in live.

Owns ``WAPolicy``: one time-ordered queue per request category; the victim is the block
least likely to be reused within its category's life window (the key and its full
tie-break order are defined in ``agent.policies.wa_core``). Every access, hit or insert,
stamps the block with the request's time when the request releases it. Eviction looks
only at queue heads, and usually at a few of the W. It must never do I/O or fit
anything: parameters arrive whole, as a ``PolicyDocument``, through ``set_policy``.

Categories: ``free`` receives an int code; ``category_names[code]`` names it and the
document's ``params_for(name)`` gives its parameters (a code with no name, or a name the
document lacks, gets ``doc.default``). ``attribution`` decides a block's category:
``"last"`` (default) the category of the request that accessed it last, ``"creator"``
that of the request that first inserted it (kept until the block is evicted).
"""

from __future__ import annotations

from agent.policies.registry import register
from agent.policies.wa_core import (
    Const,
    Freed,
    WACore,
    log_weight,
    runs,
)
from agent.policies.wa_queue import Run, Tails, TimeQueue


class WALane(TimeQueue):
    """A category's queue and its row in the evictor's arrays."""

    __slots__ = ("idx",)

    def __init__(self, idx: int, tails: Tails | None = None) -> None:
        super().__init__(tails)
        self.idx = idx


@register("wa")
class WAPolicy(WACore[WALane]):
    """Workload-aware eviction: smallest ``ReuseProb`` first, tail first on ties.

    The registry builds it from a capacity alone: built-in parameters and an empty
    category table (every code gets the default curve, i.e. LRU order, tail first, until
    ``set_policy`` and ``add_category`` say otherwise).
    """

    __slots__ = ()

    def _const_of(self, name: str | None) -> Const:
        return log_weight(self._doc.default if name is None else self._doc.params_for(name))

    def _new_lane(self, row: int) -> WALane:
        return WALane(row, self._tails)

    def _file(self, freed: Freed, category: int) -> None:
        if self._by_creator:
            for code, lo, hi in runs(self._codes_of(freed.blocks, category)):
                self._file_lane(code, freed.part(lo, hi))
        else:
            self._file_lane(category, freed.whole())

    def _stale_dropped(self) -> int:
        dropped = 0
        for lane in self._lanes.values():
            dropped += lane.stale_dropped
            lane.stale_dropped = 0
        return dropped

    def _file_lane(self, code: int, run: Run) -> None:
        lane = self._lanes.get(code) or self._lane(code)
        if lane.is_empty():  # stamps never go back: only an empty lane needs a bound
            self._restart_bound(lane.idx, run.t)
        lane.add(run)

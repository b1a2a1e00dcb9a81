"""One engine instance's KV cache: which blocks are cached, pinned or being computed.

Owns ``InstanceCache``: the block bookkeeping around one eviction policy, the way vLLM's
block pool drives its free queue, and the capacity rule. Per block (dense trace ids) it
keeps a reference count (running requests holding it), whether the policy holds it
(``cached``) and whether a request could use it now (``resident``: cached, or computed by
a running request whose prefill is done).

- **admit**: a request's hits are the longest resident prefix of its blocks. Cached blocks
  that no running request holds are touched (in use from now on); every block's count
  goes up; blocks neither cached nor held are the request's *working* blocks (computed
  by it, not yet known to the policy).
- **computed**: at the end of its prefill a request's blocks become resident, so later
  requests can share them.
- **release**: when it finishes, the counts go down and the blocks no other request holds
  are freed to the policy, tail first (vLLM's order); working blocks enter the cache.
- **trim**: the policy evicts until cached plus working blocks fit the capacity, as the
  replay evicts after each request (docs/replay.md); pinned blocks cannot go, so under
  load less room is left for the rest.
- A request may start only while pinned, working and its own new blocks fit the
  capacity, unless nothing else runs (a request larger than the cache runs alone, then
  is trimmed, as in the replay).

Blocks computed by two running requests at once are counted once (vLLM would hold a
duplicate; the replay merges them too). It must never schedule, time or route requests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from agent.policies.base import EvictionPolicy
from controlplane.replay.catalog import TraceIndexed


@dataclass(frozen=True, slots=True)
class Lookup:
    """What admitting a request would take: its hits, the cached blocks it would pin
    (prompt order) and how many new blocks it would add."""

    hits: int
    touch: list[int]
    new_blocks: int


class InstanceCache:
    """The KV cache of one instance under one policy (module docstring)."""

    def __init__(
        self,
        policy: EvictionPolicy,
        capacity: int,
        blocks: NDArray[np.int64],
        offsets: Sequence[int],
        n_blocks: int,
        categories: Sequence[int],
    ) -> None:
        self.policy = policy
        self.capacity = capacity
        self._blocks = blocks
        self._offsets = offsets
        self._categories = categories
        self.indexed = policy if isinstance(policy, TraceIndexed) else None
        self.refs = np.zeros(n_blocks, dtype=np.int32)
        self.cached = np.zeros(n_blocks, dtype=np.bool_)
        self.resident = np.zeros(n_blocks, dtype=np.bool_)
        self.pinned = 0
        """Cached blocks held by running requests."""
        self.evicted = 0
        """Blocks evicted so far."""
        self.working = 0
        """Blocks held by running requests that the policy does not know yet."""

    def request_blocks(self, r: int) -> NDArray[np.int64]:
        return self._blocks[self._offsets[r] : self._offsets[r + 1]]

    def matched(self, r: int) -> int:
        """Length of request ``r``'s resident prefix, in blocks."""
        flags = self.resident[self.request_blocks(r)].tobytes()
        h = flags.find(0)
        return len(flags) if h < 0 else h

    def lookup(self, r: int) -> Lookup:
        req = self.request_blocks(r)
        free = self.refs[req] == 0
        cached = self.cached[req]
        touch = req[cached & free].tolist()
        new_blocks = int(np.count_nonzero(free & ~cached))
        return Lookup(self.matched(r), touch, new_blocks)

    def fits(self, lookup: Lookup) -> bool:
        """Whether the held blocks plus this request's fit the capacity."""
        return self.pinned + len(lookup.touch) + self.working + lookup.new_blocks <= self.capacity

    def admit(self, r: int, lookup: Lookup, now: float) -> None:
        if lookup.touch:
            self.policy.touch(lookup.touch, now)
        self.pinned += len(lookup.touch)
        self.working += lookup.new_blocks
        self.refs[self.request_blocks(r)] += 1

    def computed(self, r: int) -> None:
        self.resident[self.request_blocks(r)] = True

    def release(self, r: int, now: float) -> None:
        """Request ``r`` finished: free what no one else holds, tail first."""
        req = self.request_blocks(r)
        refs = self.refs[req] - 1
        self.refs[req] = refs
        idle = refs == 0
        if idle.all():
            positions: Sequence[int] = range(len(req) - 1, -1, -1)
            freed = req[::-1]
        else:
            at = np.flatnonzero(idle)[::-1]
            positions, freed = at.tolist(), req[at]
        known = int(np.count_nonzero(self.cached[freed]))
        self.pinned -= known
        self.working -= len(freed) - known
        self.cached[freed] = True
        ids = freed.tolist()
        if self.indexed is not None:
            self.indexed.free_request(r, ids, positions, now)
        else:
            self.policy.free(ids, positions, now, self._categories[r])

    def trim(self) -> None:
        """Evict until cached and working blocks fit the capacity (pinned ones stay)."""
        excess = len(self.policy) + self.working - self.capacity
        if excess > 0:
            victims = self.policy.evict(excess)
            self.evicted += len(victims)
            if victims:
                self.cached[victims] = False
                self.resident[victims] = False

"""``DeviceEvictor``: the ``wa`` victim order, with the candidates of each eviction scored
and ordered in one batch on a torch device.

Owns the device half of workload-aware eviction: the scoring and ordering of each
eviction's candidates on the configured device. The block
bookkeeping (category queues in ``(t, -offset, release number)`` order, lazy deletion,
the clock) is ``wa``'s own (``agent.policies.wa``), inherited, so ``touch`` and ``free``
cost what they cost in ``wa`` and nothing is staged for the device.

``evict(n)`` does not score every block. Within one category the queue order is the key
order (``agent.policies.wa_core``), so the ``n`` victims are among the first ``n`` live
blocks of each category's queue. Their stamps and category constants go to the device
in one upload; their scores ``lc - a * (now - t)`` are computed there (three separate
kernels, no fused multiply-add: the CPU's IEEE operations) and sorted; the sorted scores
and the order of the ``n`` best, with every candidate tied with the last of them, come
back, and the host puts those few in the exact victim order
``(score, t, -offset, release number)``. The work per call is thus O(W n) for W
non-empty categories, not O(blocks held).

Same Protocol as the CPU policies (``agent.policies.base``), plus ``set_policy`` and
``add_category`` as ``wa`` has them, so either can sit behind an engine integration.

It must never call ``torch.cuda`` (the device is a setting: ``cpu`` in tests), do I/O,
read settings, or be imported by ``agent.policies`` or ``agent/__init__`` (torch is
optional for the agent).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from agent.policies.wa import WAPolicy
from agent.policies.wa_core import Attribution
from agent.policies.wa_queue import BLOCK, STAMP, Entry
from agent.policy_document import BUILTIN_POLICY, PolicyDocument


class DeviceEvictor(WAPolicy):
    """Workload-aware eviction whose candidates are scored on a torch device; victims
    identical to ``WAPolicy``'s.

    ``capacity`` is the number of blocks the caller sizes it for (the engine's block
    count), reported doubled whenever more blocks are held; nothing is allocated by it.
    """

    __slots__ = ("_capacity", "device")

    def __init__(
        self,
        capacity: int,
        *,
        device: str | torch.device = "cpu",
        category_names: Sequence[str] = (),
        doc: PolicyDocument = BUILTIN_POLICY,
        attribution: Attribution = "last",
    ) -> None:
        super().__init__(category_names=category_names, doc=doc, attribution=attribution)
        self.device = torch.device(device)
        self._capacity = max(int(capacity), 1)

    @classmethod
    def simulated(cls, num_blocks: int, **kwargs: Any) -> DeviceEvictor:
        """The same evictor on the CPU, for tests and machines without an accelerator."""
        return cls(num_blocks, device="cpu", **kwargs)

    @property
    def capacity(self) -> int:
        """The size it was built for, doubled as often as the blocks held require."""
        while len(self) > self._capacity:
            self._capacity *= 2
        return self._capacity

    def flush(self) -> None:
        """Nothing to upload: blocks are kept on the host, candidates go up per ``evict``
        (kept for callers written against an evictor that staged its writes)."""

    def _candidates(self, n: int) -> tuple[list[Entry], torch.Tensor]:
        """The first ``n`` live entries of every category queue, lane after lane, and
        their stamps and category constants ``lc`` and ``a`` as one float64 tensor on
        the device (three rows, one upload)."""
        if self._consts_stale:
            self._refresh_consts()
        evictable = self._ev
        entries: list[Entry] = []
        lane_rows: list[int] = []
        lane_sizes: list[int] = []
        for row, (_, lane) in enumerate(self._rows):
            first = lane.peek(evictable, n)
            if first:
                entries += first
                lane_rows.append(row)
                lane_sizes.append(len(first))
        rows = np.repeat(lane_rows, lane_sizes)
        fields = np.empty((3, len(entries)))
        fields[0] = np.fromiter(map(STAMP, entries), np.float64, len(entries))
        np.take(self._lc, rows, out=fields[1])
        np.take(self._a, rows, out=fields[2])
        return entries, torch.from_numpy(fields).to(self.device)

    def evict(self, n: int) -> list[int]:
        """Remove and return up to ``n`` victims in key order, at the clock's time."""
        if n <= 0 or not self._ev:
            return []
        entries, fields = self._candidates(n)
        stamp, log_constant, rate = fields
        # Exactly the CPU's operations, lc - a * (now - t), one rounding each.
        score = torch.rsub(stamp, self._clock)
        score.mul_(rate)
        torch.sub(log_constant, score, out=score)
        # The n best scores, and every candidate tied with the last of them, come back;
        # the host orders those few by the whole key (score, t, -offset, release).
        ranked, order = torch.sort(score)
        scores = ranked.tolist()
        cut = bisect_right(scores, scores[min(n, len(scores)) - 1])
        tied = map(entries.__getitem__, order[:cut].tolist())
        keyed = sorted(zip(scores[:cut], tied, strict=True))
        victims = [BLOCK(entry) for _, entry in keyed[:n]]
        evictable = self._ev
        for block in victims:
            del evictable[block]
        if self._by_creator:
            creator = self._creator
            for block in victims:
                del creator[block]
        return victims

    def __repr__(self) -> str:
        return f"DeviceEvictor(capacity={self.capacity}, device={self.device}, held={len(self)})"

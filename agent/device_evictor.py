"""``DeviceEvictor``: the ``wa`` victim order, with the categories' bounds scored and
ordered on a torch device.

Owns the device half of workload-aware eviction: the pass over every category's bound
``lc - a (now - t0)`` (``t0`` a lower bound of the category's head stamp, see
``agent.policies.wa_core``) and its sort, on the configured device. The block
bookkeeping (category queues in ``(t, -offset, release number)`` order, lazy deletion,
the clock) and the merge of the few heads that compete are ``wa``'s own
(``agent.policies.wa``), inherited, so ``touch`` and ``free`` cost what they cost in
``wa`` and nothing per block is staged for the device.

``evict(n)`` does not score every block, nor the first ``n`` of every category: within
one category the queue order is the key order, so only the W heads compete, and ``wa``
keys the few whose bounds can beat the best key. The bounds of all W categories are
computed on the device (the stamps' lower bounds go up in one upload, the constants
only when they change; three separate kernels, no fused multiply-add: the CPU's IEEE
operations), sorted there, and come back in one read; ``wa`` reuses them across calls
until the clock passes the time they were computed for, which is ahead of the clock
(farther ahead here than in ``wa``: ``BOUNDS_AHEAD``), or sooner when a category is
refilled from empty, parameters change, or a call keyed many heads. The work per call is
thus O(W) on the
device at most and a few heads on the host, not O(blocks held).

Same Protocol as the CPU policies (``agent.policies.base``), plus ``set_policy`` and
``add_category`` as ``wa`` has them, so either can sit behind an engine integration.

It must never call ``torch.cuda`` (the device is a setting: ``cpu`` in tests), do I/O,
read settings, or be imported by ``agent.policies`` or ``agent/__init__`` (torch is
optional for the agent).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from agent.policies.wa import WALane, WAPolicy
from agent.policies.wa_core import Attribution
from agent.policy_document import BUILTIN_POLICY, PolicyDocument


class DeviceUnusable(RuntimeError):
    """This torch cannot put a tensor on the device named (not built for its kind, no such
    device, no such index)."""


def usable_device(device: str | torch.device) -> torch.device:
    """``device`` as torch's, once a tensor was put on it: an unusable device is found as
    the evictor is built, not at its first eviction inside the engine. Otherwise
    ``DeviceUnusable`` naming it and torch's reason (torch raises a different error for
    each kind of device it cannot use)."""
    try:
        found = torch.device(device)
        torch.empty(1, device=found)
    except (RuntimeError, AssertionError, ImportError) as exc:
        raise DeviceUnusable(
            f"device {str(device)!r} cannot be used by this torch ({torch.__version__}): {exc}"
        ) from None
    return found


class DeviceEvictor(WAPolicy):
    """Workload-aware eviction whose category bounds are scored and sorted on a torch
    device; victims identical to ``WAPolicy``'s.

    ``capacity`` is the number of blocks the caller sizes it for (the engine's block
    count), reported doubled whenever more blocks are held; nothing is allocated by it.
    """

    __slots__ = ("_capacity", "_constants_on_device", "device")

    # Each pass costs an upload and a synchronising read: make them rarer than ``wa`` does.
    BOUNDS_AHEAD = 4.0

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
        self.device = usable_device(device)
        self._capacity = max(int(capacity), 1)
        # Every row's lc and a on the device (None: to upload before the next pass).
        self._constants_on_device: torch.Tensor | None = None

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
        """Nothing to upload: blocks are kept on the host, bounds go up per pass
        (kept for callers written against an evictor that staged its writes)."""

    def _refresh_consts(self) -> None:
        super()._refresh_consts()
        self._constants_on_device = None

    def _lane(self, code: int) -> WALane:
        rows = len(self._rows)
        lane = super()._lane(code)
        if len(self._rows) != rows:
            self._constants_on_device = None
        return lane

    def _sorted_bounds(self, now: float) -> tuple[list[float], list[int]]:
        """Every category's bound at ``now``, sorted on the device (NaN last), and the
        rows in that order: one upload of the stamps' bounds, one read back."""
        constants = self._constants_on_device
        if constants is None:
            both = np.stack((self._lc, self._a))
            constants = self._constants_on_device = torch.from_numpy(both).to(self.device)
        log_constant, rate = constants
        # Exactly the CPU's operations, lc - a * (now - t0), one rounding each.
        bound = torch.rsub(torch.from_numpy(self._t0).to(self.device), now)
        bound.mul_(rate)
        torch.sub(log_constant, bound, out=bound)
        ranked, order = torch.sort(bound)
        ranked_and_rows = torch.stack((ranked, order.to(torch.float64))).tolist()
        return ranked_and_rows[0], list(map(int, ranked_and_rows[1]))

    def __repr__(self) -> str:
        return f"DeviceEvictor(capacity={self.capacity}, device={self.device}, held={len(self)})"

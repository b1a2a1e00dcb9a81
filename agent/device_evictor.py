"""``DeviceEvictor``: the ``wa`` victim order, computed in one vectorised pass on a torch
device.

Owns per-slot block metadata as tensors on the configured device (last access ``t``,
category code, negated prompt offset, release number, evictable flag), a host-side map
from block ids to slots, and the per-category constants table. The table is fixed in size
(the engine's block count); a generic caller that caches more blocks than that makes it
double. ``touch`` and ``free`` are index writes: they are staged on the host (last write
per slot wins) and reach the device in one transfer at the next ``evict`` or ``flush``, so
an engine step costs one upload. ``evict(n)`` scores every evictable block with the
current parameters and takes the ``n`` smallest keys, ``agent.policies.wa_core``'s victim
order exactly: ``(lc - a * (now - t), t, -offset, release number)``.

Same Protocol as the CPU policies (``agent.policies.base``), plus ``set_policy`` and
``add_category`` as ``wa`` has them, so either can sit behind an engine integration.

It must never call ``torch.cuda`` (the device is a setting: ``cpu`` in tests), do I/O,
read settings, or be imported by ``agent.policies`` or ``agent/__init__`` (torch is
optional for the agent).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import count, repeat
from operator import neg
from typing import Any

import torch

from agent.policies.wa_core import Attribution, log_weight
from agent.policy_document import BUILTIN_POLICY, PolicyDocument

_IN_USE = (0.0, 0.0, 0.0, 0.0, 0.0)
"""Staged row of a touched block: not evictable (the other fields are never read)."""
_FLUSH_AT = 1 << 16
"""Staged writes that trigger an upload on their own, to bound host memory."""
_MAX_CODE = 1 << 20
"""Category codes outside ``[0, _MAX_CODE)`` share the default parameters for good."""


class DeviceEvictor:
    """Workload-aware eviction on a torch device; victims identical to ``WAPolicy``'s.

    ``capacity`` is the number of slots (blocks cached at once). Block ids are any ints;
    each cached block holds one slot until it is evicted.
    """

    def __init__(
        self,
        capacity: int,
        *,
        device: str | torch.device = "cpu",
        category_names: Sequence[str] = (),
        doc: PolicyDocument = BUILTIN_POLICY,
        attribution: Attribution = "last",
    ) -> None:
        if attribution not in ("creator", "last"):
            raise ValueError(f"attribution must be 'creator' or 'last', got {attribution!r}")
        self.device = torch.device(device)
        self._by_creator = attribution == "creator"
        self._doc = doc
        self._names: list[str] = []
        self._codes: dict[str, int] = {}
        self._clock = -math.inf
        self._seq = 0
        self._slot: dict[int, int] = {}  # cached block -> slot
        self._ids: list[int] = []  # slot -> block id (stale for unused slots)
        self._spare: list[int] = []  # unused slots, popped from the end
        self._creator: dict[int, int] = {}  # cached block -> creator's code ("creator")
        self._staged: dict[int, tuple[float, float, float, float, float]] = {}
        self._max_code = -1
        self._consts: tuple[torch.Tensor, torch.Tensor] | None = None
        self._alloc(max(int(capacity), 1))
        for name in category_names:
            self.add_category(name)

    @classmethod
    def simulated(cls, num_blocks: int, **kwargs: Any) -> DeviceEvictor:
        """The same evictor on the CPU, for tests and machines without an accelerator."""
        return cls(num_blocks, device="cpu", **kwargs)

    # --- storage -------------------------------------------------------------------------
    def _alloc(self, capacity: int) -> None:
        """(Re)allocate the slot tensors for ``capacity`` slots, keeping existing rows."""
        old = getattr(self, "capacity", 0)

        def grow(name: str, dtype: torch.dtype) -> torch.Tensor:
            new = torch.zeros(capacity, dtype=dtype, device=self.device)
            if old:
                new[:old] = getattr(self, name)
            return new

        self._t: torch.Tensor = grow("_t", torch.float64)
        self._code: torch.Tensor = grow("_code", torch.int64)
        self._noff: torch.Tensor = grow("_noff", torch.int64)
        self._q: torch.Tensor = grow("_q", torch.int64)
        self._ev: torch.Tensor = grow("_ev", torch.bool)
        self._ids.extend(repeat(0, capacity - old))
        self._spare.extend(range(capacity - 1, old - 1, -1))
        self.capacity = capacity

    def _slot_of(self, block: int) -> int:
        """The slot of ``block``, giving it a fresh one if it is not cached."""
        slot = self._slot.get(block)
        if slot is None:
            if not self._spare:
                self.flush()
                self._alloc(self.capacity * 2)
            slot = self._slot[block] = self._spare.pop()
            self._ids[slot] = block
        return slot

    # --- parameters and categories -------------------------------------------------------
    @property
    def policy(self) -> PolicyDocument:
        """The parameter document in force."""
        return self._doc

    @property
    def attribution(self) -> Attribution:
        return "creator" if self._by_creator else "last"

    @property
    def category_names(self) -> tuple[str, ...]:
        return tuple(self._names)

    def set_policy(self, doc: PolicyDocument) -> None:
        """Use ``doc`` from the next eviction on (the constants are rebuilt then)."""
        if not isinstance(doc, PolicyDocument):
            raise TypeError(f"expected a PolicyDocument, got {type(doc).__name__}")
        self._doc = doc
        self._consts = None

    def add_category(self, name: str) -> int:
        """The code of category ``name``, given the next free code on first sight."""
        code = self._codes.get(name)
        if code is None:
            code = self._codes[name] = len(self._names)
            self._names.append(name)
            self._consts = None
        return code

    def _constants(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(lc, a)`` per stored code (row ``code + 1``; row 0: codes out of range)."""
        if self._consts is None:
            doc, names = self._doc, self._names
            rows = [log_weight(doc.default)]
            for code in range(self._max_code + 1):
                params = doc.params_for(names[code]) if code < len(names) else doc.default
                rows.append(log_weight(params))
            table = torch.tensor(rows, dtype=torch.float64).to(self.device)
            self._consts = (table[:, 0].contiguous(), table[:, 1].contiguous())
        return self._consts

    def _row(self, code: int) -> int:
        """Where ``code``'s constants sit in the table (0 = the default, for good)."""
        if not 0 <= code < _MAX_CODE:
            return 0
        if code > self._max_code:
            self._max_code = code
            self._consts = None
        return code + 1

    # --- the Protocol ----------------------------------------------------------------------
    def _tick(self, now: float) -> float:
        if now > self._clock:
            self._clock = float(now)
        return self._clock

    def touch(self, blocks: Sequence[int], now: float) -> None:
        self._tick(now)
        if not len(blocks):
            return
        slot_of, staged = self._slot_of, self._staged
        staged.update(zip(map(slot_of, blocks), repeat(_IN_USE)))
        if len(staged) >= _FLUSH_AT:
            self.flush()

    def free(
        self, blocks: Sequence[int], offsets: Sequence[int], now: float, category: int
    ) -> None:
        stamp = self._tick(now)  # even for no blocks: the clock is the largest time passed
        if not len(blocks):
            return
        seq0 = self._seq
        self._seq += len(blocks)
        slots = list(map(self._slot_of, blocks))
        if self._by_creator:
            setdefault = self._creator.setdefault
            rows = [float(self._row(setdefault(block, category))) for block in blocks]
            codes: Any = rows
        else:
            codes = repeat(float(self._row(category)))
        # Evictable, stamped t, with -offset and the release number; a block named twice
        # keeps its last entry, as in ``wa``.
        self._staged.update(
            zip(
                slots,
                zip(repeat(1.0), repeat(stamp), codes, map(float, map(neg, offsets)), count(seq0)),
                strict=False,
            )
        )
        if len(self._staged) >= _FLUSH_AT:
            self.flush()

    def flush(self) -> None:
        """Upload the staged writes: one host-to-device copy, one scatter per field."""
        staged = self._staged
        if not staged:
            return
        slots = torch.tensor(list(staged), dtype=torch.int64).to(self.device)
        rows = torch.tensor(list(staged.values()), dtype=torch.float64).to(self.device)
        staged.clear()
        self._ev[slots] = rows[:, 0] > 0
        self._t[slots] = rows[:, 1]
        self._code[slots] = rows[:, 2].to(torch.int64)
        self._noff[slots] = rows[:, 3].to(torch.int64)
        self._q[slots] = rows[:, 4].to(torch.int64)

    def evict(self, n: int) -> list[int]:
        """Remove and return up to ``n`` victims in key order, at the clock's time."""
        if n <= 0 or not self._slot:
            return []
        self.flush()
        evictable = self._ev
        log_constant, rate = self._constants()
        code = self._code
        # Exactly the CPU's operations, lc - a * (now - t), one rounding each and no fused
        # multiply-add: three separate elementwise kernels.
        score = torch.rsub(self._t, self._clock)
        score.mul_(rate.index_select(0, code))
        torch.sub(log_constant.index_select(0, code), score, out=score)
        score.masked_fill_(~evictable, math.inf)  # never +inf for an evictable block
        k = min(n, self.capacity)
        if k < self.capacity:
            kth = torch.topk(score, k, largest=False, sorted=False).values.max()
            cand = (evictable & (score <= kth)).nonzero().squeeze(1)
        else:
            cand = evictable.nonzero().squeeze(1)
        # Exact order among the candidates (all ties included): stable sorts, last key
        # first. Release numbers are unique, so the order is total.
        order = torch.argsort(self._q[cand])
        for key in (self._noff[cand], self._t[cand], score[cand]):
            order = order[torch.argsort(key[order], stable=True)]
        victims = cand[order[:n]]
        self._ev[victims] = False
        return self._release(victims.tolist())

    def _release(self, slots: list[int]) -> list[int]:
        ids = self._ids
        victims = [ids[slot] for slot in slots]
        pop = self._slot.pop
        for block in victims:
            pop(block)
        if self._by_creator:
            pop_creator = self._creator.pop
            for block in victims:
                pop_creator(block, None)
        self._spare.extend(slots)
        return victims

    def __len__(self) -> int:
        return len(self._slot)

    def __contains__(self, block: object) -> bool:
        return block in self._slot

    def __repr__(self) -> str:
        return f"DeviceEvictor(capacity={self.capacity}, device={self.device}, held={len(self)})"

"""Which evictor family to run, chosen from the shadow's figures with hysteresis.

Owns ``FamilySelector``, written once for the controller (``controlplane.service``) and
for ``kvwise replay --policy auto`` (``controlplane.shadow.auto_replay``). It is fed one
``Reading`` per full window: the shadow hit ratio of every candidate family at the
workers' capacity over that window, and says which family should be in force. The rule:

- a family other than the one in force must lead it by more than ``margin`` (absolute hit
  ratio) in ``windows`` consecutive readings; the switch goes to the family that leads in
  the last of them. A reading where no family leads by the margin starts the count again;
- a reading with fewer than ``min_accesses`` sampled accesses is no evidence either way
  (the count neither grows nor restarts);
- switching back is judged by the same rule, so a family that won once must be beaten
  again by the margin, ``windows`` times in a row, before it goes. A switch costs the
  moved blocks their history (docs/shadow.md), which the margin and the count pay for.

It must never read a clock, do I/O or know where readings come from.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

Margin = Annotated[float, Field(ge=0, le=1)]
"""The range of the rule's ``margin`` (an absolute hit ratio), wherever it is declared."""
Windows = Annotated[int, Field(ge=1, le=1000)]
"""The range of the rule's ``windows``."""
MinAccesses = Annotated[int, Field(ge=0)]
"""The range of the rule's ``min_accesses``."""


class SelectionSettings(BaseModel):
    """How much evidence a switch of evictor family needs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    margin: Margin = Field(
        default=0.002, description="A family must lead the one in force by more than this hit ratio"
    )
    windows: Windows = Field(default=2, description="...in this many consecutive full windows")
    min_accesses: MinAccesses = Field(
        default=5000, description="Sampled accesses a window needs to count as evidence"
    )


@dataclass(frozen=True)
class Reading:
    """One full window of the shadow: each candidate family's hit ratio at the workers'
    capacity, over ``accesses`` sampled accesses, from ``start`` to ``end`` (seconds)."""

    hit_ratios: Mapping[str, float]
    accesses: int
    start: float
    end: float


@dataclass(frozen=True)
class SelectionView:
    """The selector's last word: the family it wants in force and why."""

    in_force: str
    """The family in force when the reading came."""
    chosen: str
    """The family the selector wants in force (``in_force`` unless it switches now)."""
    leader: str | None
    """The family that led ``in_force`` by more than the margin in this reading."""
    lead: float
    """Its lead (hit ratio; 0 when none led)."""
    streak: int
    """Consecutive readings in which some family led by the margin."""
    hit_ratios: dict[str, float]
    accesses: int
    window_end: float
    reason: str

    @property
    def switches(self) -> bool:
        return self.chosen != self.in_force


class FamilySelector:
    """The hysteresis rule over successive readings (one instance per deployment)."""

    def __init__(self, settings: SelectionSettings) -> None:
        self.settings = settings
        self._streak = 0
        self._in_force: str | None = None
        self.last: SelectionView | None = None

    def observe(self, reading: Reading, in_force: str) -> SelectionView:
        """Judge ``reading`` with ``in_force`` the family running now."""
        s = self.settings
        if in_force != self._in_force:  # a switch (ours or an operator's): count afresh
            self._in_force, self._streak = in_force, 0
        ratios = dict(reading.hit_ratios)
        own = ratios.get(in_force)
        others = {f: r for f, r in ratios.items() if f != in_force}
        if reading.accesses < s.min_accesses or own is None or not others:
            why = (
                f"{reading.accesses:,} sampled accesses, fewer than {s.min_accesses:,}"
                if reading.accesses < s.min_accesses
                else f"{in_force} is not among the shadow's families ({', '.join(ratios)})"
            )
            return self._said(reading, in_force, in_force, None, 0.0, f"no evidence: {why}")
        leader = max(others, key=lambda f: (others[f], f == "wa"))
        lead = others[leader] - own
        if lead <= s.margin:
            self._streak = 0
            why = f"{in_force} holds: best other {leader} {others[leader]:.4f} vs {own:.4f}"
            return self._said(reading, in_force, in_force, None, 0.0, why)
        self._streak += 1
        figures = f"{leader} {others[leader]:.4f} vs {in_force} {own:.4f} (+{lead:.4f})"
        if self._streak < s.windows:
            why = f"{figures}: lead {self._streak} of {s.windows} windows, margin {s.margin}"
            return self._said(reading, in_force, in_force, leader, lead, why)
        windows = "1 window" if s.windows == 1 else f"{s.windows} windows"
        why = f"switch to {leader}: {figures}, {windows} past margin {s.margin}"
        view = self._said(reading, in_force, leader, leader, lead, why)
        self._in_force, self._streak = leader, 0
        return view

    def _said(
        self,
        reading: Reading,
        in_force: str,
        chosen: str,
        leader: str | None,
        lead: float,
        reason: str,
    ) -> SelectionView:
        self.last = SelectionView(
            in_force=in_force,
            chosen=chosen,
            leader=leader,
            lead=lead,
            streak=self._streak,
            hit_ratios=dict(reading.hit_ratios),
            accesses=reading.accesses,
            window_end=reading.end,
            reason=reason,
        )
        return self.last

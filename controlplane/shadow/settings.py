"""The shadow evaluation's knobs: ``ShadowSettings``, a plain value with declared defaults.

Owns every number that decides what the shadow samples, which policies it replays at which
capacities, over what window, and how the refit guard judges a candidate. The controller's
settings extend it (each knob is read from ``KVWISE_*`` there and declared once here). It
must never read the environment or files.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveFloat, field_validator

from agent.policies import names as policy_names
from controlplane.shadow.selection import Margin, MinAccesses, SelectionSettings, Windows

DEFAULT_RATE = 0.05
"""Default sampling rate (chosen on one seed, reported on another: docs/shadow.md)."""

PerWorkerBound = Annotated[int, Field(ge=1)]
"""The most the shadow models, keeps or replays for one worker: one at least."""


class ShadowSettings(BaseModel):
    """What the shadow evaluation samples and replays, and how the guard uses it."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    shadow_enabled: bool = Field(
        default=True, description="Replay sampled traffic through candidate policies"
    )
    shadow_rate: float = Field(
        default=DEFAULT_RATE,
        gt=0,
        le=1,
        description="Share of prefix subtrees sampled (by a hash of a request's key block)",
    )
    shadow_key_depth: int = Field(
        default=4,
        ge=0,
        le=4096,
        description="Prompt offset of the key block (a shorter request: its last block); "
        "past the prompts that most conversations share",
    )
    shadow_policies: str = Field(
        default="lru,s3fifo,arc",
        description="Baselines replayed beside the published wa document (comma-separated)",
    )
    shadow_ladder: str = Field(
        default="0.25,0.5,1,2,4",
        description="Capacities replayed, as multiples of the worker's (comma-separated)",
    )
    shadow_max_capacity: PerWorkerBound = Field(
        default=2**23,
        description="Largest worker capacity modeled (blocks): a heartbeat's larger one is "
        "modeled at this, its worker listed in its group's capped_workers",
    )
    shadow_window_s: PositiveFloat = Field(
        default=3600.0, description="Sliding window of the shadow hit ratios (s)"
    )
    shadow_buckets: int = Field(
        default=60, ge=1, le=10_000, description="Time buckets of the shadow window"
    )
    shadow_max_requests: PerWorkerBound = Field(
        default=5_000,
        description="Sampled requests kept per worker for the refit guard, at most",
    )
    shadow_max_kept_blocks: PerWorkerBound = Field(
        default=1_000_000,
        description="Blocks of the sampled requests kept per worker, at most (about 40 "
        "bytes each); the oldest are let go first, counted in kept_requests_dropped",
    )
    guard_max_accesses: PerWorkerBound = Field(
        default=50_000,
        description="Sampled accesses the refit guard replays per worker, newest first, at most",
    )
    guard_margin: float = Field(
        default=0.005,
        ge=0,
        le=1,
        description="A fit whose shadow hit ratio is lower than the version in force's by "
        "more than this is not published",
    )
    guard_min_accesses: NonNegativeInt = Field(
        default=5000,
        description="Sampled accesses the guard needs; fewer: it waits and the fit is published",
    )

    select_enabled: bool = Field(
        default=True,
        description="Select the evictor family from the shadow (wa or a shadowed baseline)",
    )
    select_margin: Margin = Field(
        default=SelectionSettings().margin,
        description="A family is selected when it leads the one in force by more than this "
        "shadow hit ratio at the workers' capacity...",
    )
    select_windows: Windows = Field(
        default=SelectionSettings().windows,
        description="...over this many consecutive full shadow windows",
    )
    select_min_accesses: MinAccesses = Field(
        default=SelectionSettings().min_accesses,
        description="Sampled accesses a window needs to count as evidence for the selection",
    )

    @field_validator("shadow_policies")
    @classmethod
    def _known_policies(cls, value: str) -> str:
        known = set(policy_names())
        for name in _items(value):
            if name not in known:
                raise ValueError(f"unknown policy {name!r}; known: {', '.join(sorted(known))}")
        return value

    @field_validator("shadow_ladder")
    @classmethod
    def _positive_multiples(cls, value: str) -> str:
        for item in _items(value):
            try:
                multiple = float(item)
            except ValueError:
                raise ValueError(f"{item!r} is not a number") from None
            if not 0 < multiple <= 64:
                raise ValueError(f"multiple {item} not in (0, 64]")
        if not _items(value):
            raise ValueError("needs at least one multiple")
        return value

    @property
    def baselines(self) -> tuple[str, ...]:
        """The baseline policies, in the order given, without ``wa`` (always replayed)."""
        return tuple(dict.fromkeys(n for n in _items(self.shadow_policies) if n != "wa"))

    @property
    def multiples(self) -> tuple[float, ...]:
        """The capacity ladder, ascending, each multiple once."""
        return tuple(sorted({float(x) for x in _items(self.shadow_ladder)}))

    @property
    def selection(self) -> SelectionSettings:
        """The family selection's rule."""
        return SelectionSettings(
            margin=self.select_margin,
            windows=self.select_windows,
            min_accesses=self.select_min_accesses,
        )

    def shadow_only(self) -> ShadowSettings:
        """These knobs alone, as a plain ``ShadowSettings`` (from a subclass's instance)."""
        fields = set(ShadowSettings.model_fields)
        return ShadowSettings.model_validate(self.model_dump(include=fields))


def _items(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]

"""The fitter's knobs: ``FitSettings``, a plain value with declared defaults.

Owns every number that decides how reuse observations become fitted parameters: the
statistics window, the samples a category needs for a fit of its own, shrinkage, the
life-window rule, the bounds of fitted values and the change a refit must make to be
published. The controller's settings extend it
(so each knob is read from ``KVWISE_*`` there and declared once here); replays build one
from its defaults. It must never read the environment or files.
"""

from __future__ import annotations

from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

NONE_WORDS = frozenset({"", "none", "null"})
"""Strings that mean "not set" for an optional knob (any case): how an environment
variable, which holds only text, says null."""


class FitSettings(BaseModel):
    """How the fitter turns a window of reuse observations into parameters."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    window_s: float = Field(default=3600.0, gt=0, description="Sliding window of reuse data")
    min_samples: int = Field(default=200, ge=1, description="Fewer accesses: no own fit")
    near_concurrent_s: float = Field(
        default=0.0, ge=0, description="Reuse gaps below this are not reuse observations"
    )
    life_rule: Literal["quantile", "fixed"] = Field(
        default="quantile", description="How each category's life window is chosen"
    )
    life_quantile: float = Field(
        default=0.9, gt=0, lt=1, description="Reuse-time quantile used as the life window"
    )
    life_s_override: float | None = Field(
        default=0.1,
        gt=0,
        description="One life window for every category (seconds); none, null or empty = "
        "per category (life_rule). The short default ranks blocks by reuse density "
        "(measured: docs/policy.md)",
    )
    window_buckets: int = Field(
        default=120, ge=1, le=10_000, description="Time buckets of the window (its slide step)"
    )
    shrinkage_samples: float = Field(
        default=50.0, ge=0, description="Pseudo-samples of the pooled fit in each category fit"
    )
    rate_min: float = Field(
        default=1e-6, gt=0, description="Lowest fitted reuse rate (1/s); at most rate_max"
    )
    rate_max: float = Field(
        default=1e3, gt=0, description="Highest fitted reuse rate (1/s); equal to rate_min pins it"
    )
    life_min_s: float = Field(
        default=0.1, gt=0, description="Shortest fitted life window; at most life_max_s"
    )
    life_max_s: float = Field(
        default=3600.0, gt=0, description="Longest fitted life window; equal to life_min_s pins it"
    )
    change_threshold: float = Field(
        default=0.05, ge=0, description="Relative change below which no version is published"
    )

    @field_validator("life_s_override", mode="before")
    @classmethod
    def _none_word_is_none(cls, value: object) -> object:
        """``none``, ``null`` or an empty string (from the environment) select life_rule."""
        if isinstance(value, str) and value.strip().lower() in NONE_WORDS:
            return None
        return value

    @model_validator(mode="after")
    def _bounds_in_order(self) -> Self:
        """Each lower bound at most its upper bound; equal bounds pin every fitted value to
        that one (a deliberate fixed rate or life window), inverted ones are a mistake."""
        for low, high in (("rate_min", "rate_max"), ("life_min_s", "life_max_s")):
            if getattr(self, low) > getattr(self, high):
                raise ValueError(
                    f"{self._setting_name(low)} ({getattr(self, low):g}) must not exceed "
                    f"{self._setting_name(high)} ({getattr(self, high):g})"
                )
        return self

    @classmethod
    def _setting_name(cls, field: str) -> str:
        """``field`` as its reader knows it: the environment variable where there is one."""
        prefix = str(cls.model_config.get("env_prefix", ""))
        return f"{prefix}{field}".upper() if prefix else field

    def fit_only(self) -> FitSettings:
        """These knobs alone, as a plain ``FitSettings`` (from a subclass's instance)."""
        return FitSettings.model_validate(self.model_dump(include=set(FitSettings.model_fields)))

"""The policy document: fitted per-category parameters, immutable and versioned.

Owns ``CategoryParams`` and ``PolicyDocument`` (pydantic, frozen) and their validation:
every number finite, rates and life windows positive, probabilities in [0, 1]. The
controller produces documents, agents validate and swap them in; a document that fails
validation is rejected whole. It must never do I/O.
"""

from __future__ import annotations

import math
import time
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

SCHEMA_VERSION: Literal[1] = 1


def _no_negative_zero(value: float) -> float:
    """``-0.0`` passes ``ge=0``; it becomes ``0.0``, so a document says one zero only."""
    return value + 0.0


PositiveFinite = Annotated[float, Field(gt=0, allow_inf_nan=False)]
Probability = Annotated[
    float, Field(ge=0, le=1, allow_inf_nan=False), AfterValidator(_no_negative_zero)
]

ParamSource = Literal["default", "fit", "pooled", "override"]

EvictorFamily = Literal["wa", "lru", "fifo", "lfu", "s3fifo", "sieve", "arc"]
"""The evictor families a document may name: ``wa`` (its parameters are the document's)
or a baseline of the agent registry (which ignores the parameters)."""
EVICTOR_FAMILIES: tuple[EvictorFamily, ...] = ("wa", "lru", "fifo", "lfu", "s3fifo", "sieve", "arc")
DEFAULT_FAMILY: EvictorFamily = "wa"


class CategoryParams(BaseModel):
    """Reuse model of one request category: ``F(t) = p_reuse * (1 - exp(-rate * t))``.

    ``life_s`` is the life window L: the priority looks only that far ahead.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    rate: PositiveFinite = Field(description="Exponential reuse rate a_w, per second")
    p_reuse: Probability = Field(description="Probability an access is ever reused, p_w")
    life_s: PositiveFinite = Field(description="Life window L in seconds")
    samples: int = Field(default=0, ge=0, description="Accesses the fit saw")
    fit_quality: Probability | None = Field(
        default=None, description="Kolmogorov-Smirnov distance of the fit (0 = perfect)"
    )
    source: ParamSource = "default"

    def reuse_prob(self, idle_s: float) -> float:
        """``F(d + L) - F(d)``: probability of a reuse in the next ``life_s`` seconds
        for a block idle ``idle_s`` seconds."""
        return (
            self.p_reuse
            * -math.expm1(-self.rate * self.life_s)
            * math.exp(-self.rate * max(idle_s, 0.0))
        )


MODEL_PARAMS: tuple[str, ...] = ("rate", "p_reuse", "life_s")
"""The fields of ``CategoryParams`` that a fit produces and an operator may override."""

DEFAULT_PARAMS = CategoryParams(rate=1 / 60, p_reuse=0.5, life_s=60.0, source="default")
"""Cold-start parameters: one shared curve, so every category ranks by idle time alone
(LRU order with the tail first) until a fit says otherwise."""


class PolicyDocument(BaseModel):
    """One immutable version of the fitted policy, as published by the controller."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = SCHEMA_VERSION
    version: int = Field(ge=0, description="Strictly increasing; 0 = built-in default")
    created_at: float = Field(default_factory=time.time, allow_inf_nan=False)
    categories: dict[str, CategoryParams] = Field(default_factory=dict)
    default: CategoryParams = DEFAULT_PARAMS
    note: str = Field(default="", max_length=500, description="Why this version exists")
    evictor: EvictorFamily = Field(
        default=DEFAULT_FAMILY,
        description="The evictor family in force on agents that follow the document "
        "(omitted from the stored JSON when it is wa, so agents that predate it read it)",
    )

    def params_for(self, category: str) -> CategoryParams:
        """Parameters of ``category``, or the default for an unseen one."""
        return self.categories.get(category, self.default)


BUILTIN_POLICY = PolicyDocument(version=0, created_at=0.0, note="built-in default")

"""What the API accepts that the domain has no type for: request bodies and path names.

Owns the request bodies (``OverrideBody``, ``RollbackBody``; ``P_REUSE_MESSAGE``, what the
API answers a bad ``p_reuse``, the example its description quotes), the bounds of a category
name in a path (any name an agent can send, pinned or read alike; ``{name:category}``
routes it whole) and in a query (``CategoryInQuery``: the form that also names ``.`` and
``..``), the spelling of a version in a path, and ``HealthOut``. Responses are the
domain's own types (``PolicyDocument``, ``VersionInfo``, ``RefitOutcome``,
``CategorySummary``, ``AgentStatus``): a model here never copies one. Bodies take JSON
numbers and booleans only (pydantic's lax mode would also take ``"1"`` and ``true`` for a
number). It must never reach the controller.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Path, Query
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    field_validator,
)
from pydantic.json_schema import SkipJsonSchema
from starlette.convertors import Convertor, register_url_convertor

from agent.policy_document import EvictorFamily, PositiveFinite, Probability
from agent.wire import MAX_CATEGORY_NAME_CHARS
from controlplane.api.field_messages import expectation

_ANY_CATEGORY = (
    "A category as an agent names it: any name of 1 to "
    f"{MAX_CATEGORY_NAME_CHARS} characters (agents send no longer one)"
)
CategoryInPath = Annotated[
    str,
    Path(
        min_length=1,
        max_length=MAX_CATEGORY_NAME_CHARS,
        description=f"{_ANY_CATEGORY}, percent-encoded "
        "as one path segment (`/` as `%2F`, a space as `%20`: JavaScript's "
        "`encodeURIComponent`); the rest of the path is the name, `/` included. A name of "
        "exactly `.` or `..` cannot be named here: HTTP clients resolve it as a path step "
        "(browsers even as `%2E`); the route's query form names it",
    ),
]
"""Routed as ``{name:category}`` (``CategoryName``): Starlette decodes ``%2F`` before
routing, so a name holding ``/`` (a reuse class, ``<category>/re``) reaches no one-segment
parameter."""
CategoryInQuery = Annotated[
    str,
    Query(
        min_length=1,
        max_length=MAX_CATEGORY_NAME_CHARS,
        description=f"{_ANY_CATEGORY}, percent-encoded (JavaScript's "
        "`encodeURIComponent`). No client resolves a query as a path, so this form names "
        "every category, `.` and `..` included",
    ),
]
"""The query form of a route that names a category in its path: a path segment ``.`` or
``..`` is resolved away by the client before it is sent."""


class CategoryName(Convertor[str]):
    """The rest of a path as a category name: every character, ``/`` and line breaks
    included (Starlette's ``path`` matches no line break, so a name holding one found no
    route: a 404 where its bounds answer)."""

    regex = r"[\s\S]*"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("category", CategoryName())


def _json_number(v: object) -> object:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ValueError("expected a JSON number")
    return v


def _json_integer(v: object) -> object:
    """A JSON Schema integer: an int, or a float with no fraction (1.0)."""
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError("expected a JSON integer")
    return v


def _decimal_digits(v: object) -> object:
    """A number in a path as plain decimal digits: ``int()`` alone would also read ``1_0``
    as 10 and ``+1`` as 1, and pydantic ``1.0`` as 1 (one version, several spellings)."""
    if isinstance(v, str) and not (v.isascii() and v.isdigit()):
        raise ValueError("expected decimal digits")
    return v


def _no_negative_zero(v: float) -> float:
    return v + 0.0  # -0.0 + 0.0 == 0.0: one zero in stored documents


JsonInt = Annotated[int, BeforeValidator(_json_integer)]
VersionInPath = Annotated[
    int,
    Path(ge=1, description="A kept version (GET /v1/policy/versions), in decimal digits"),
    BeforeValidator(_decimal_digits),
]
_Number = BeforeValidator(_json_number)
MIN_OVERRIDE_RATE = 1e-9
"""Per second: a mean reuse time of about 32 years, "never again" for any cache, and far
from the subnormal floats (1e-320) whose products with a life window underflow to 0."""
MAX_OVERRIDE_RATE = 1e6
"""Per second: a mean reuse time of a microsecond. Far past any fit, and low enough that
rate x life stays finite in the evictor's arithmetic."""
MIN_OVERRIDE_LIFE_S = 1e-3
"""A millisecond: shorter than one decode step, so the priority looks no way ahead; a
smaller window would be clock noise."""
MAX_OVERRIDE_LIFE_S = 1e9
"""About 31 years."""
# Absent means "keep the fitted value"; an explicit null is refused (below), not absence.
_Rate = (
    Annotated[PositiveFinite, Field(ge=MIN_OVERRIDE_RATE, le=MAX_OVERRIDE_RATE), _Number]
    | SkipJsonSchema[None]
)
_Life = (
    Annotated[PositiveFinite, Field(ge=MIN_OVERRIDE_LIFE_S, le=MAX_OVERRIDE_LIFE_S), _Number]
    | SkipJsonSchema[None]
)
_Share = Annotated[Probability, _Number, AfterValidator(_no_negative_zero)] | SkipJsonSchema[None]


class OverrideBody(BaseModel):
    """Any of the three parameters; the rest keep their fitted values."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"minProperties": 1})
    rate: _Rate = Field(default=None, description="Reuse rate, per second")
    p_reuse: _Share = Field(default=None, description="Probability of any reuse")
    life_s: _Life = Field(default=None, description="Life window, seconds")

    @field_validator("rate", "p_reuse", "life_s", mode="before")
    @classmethod
    def _no_null(cls, value: Any) -> Any:
        if value is None:
            raise ValueError("must be a number, not null")
        return value

    def given(self) -> dict[str, float]:
        """The parameters given, by name."""
        return self.model_dump(exclude_none=True)


P_REUSE_MESSAGE = str(expectation(OverrideBody.model_json_schema()["properties"]["p_reuse"]))
"""The ``message`` of a 422 for a bad ``p_reuse``, worded from the schema as the errors
are: the example the API's description and ``FieldErrorBody`` quote."""


class EvictorBody(BaseModel):
    """The evictor family to pin."""

    model_config = ConfigDict(extra="forbid")
    family: EvictorFamily = Field(
        description="wa, or a baseline: lru, fifo, lfu, s3fifo, sieve, arc",
        examples=["s3fifo"],
    )


class RollbackBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    # 2.0 is taken as 2: JSON Schema's integer is a value, not a spelling, so the published
    # schema could not refuse it and a client that follows the schema must be served.
    version: JsonInt = Field(ge=1, description="A kept version (GET /v1/policy/versions)")
    hold: StrictBool = Field(
        default=False, description="Stop automatic refits from publishing until POST /refit"
    )


class HealthOut(BaseModel):
    status: str = Field(description="ok, or unavailable")
    leader: bool = Field(default=False, description="This replica holds the leader lease")
    reason: str = Field(default="", description="Why not ready")

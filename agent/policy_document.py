"""The policy document: fitted per-category parameters, immutable and versioned.

Owns ``CategoryParams`` and ``PolicyDocument`` (pydantic, frozen) and their validation:
every number finite, rates and life windows positive, probabilities in [0, 1]. The
controller produces documents, agents validate and swap them in; a document that fails
validation is rejected whole. Also owns the bounds of a document's JSON shape
(``json_shape_fault``), judged from its bytes before any parse: a parse builds an object
for each value, so a document cheap in bytes but rich in values (hundreds of thousands of
empty arrays) is refused before it costs that. It must never do I/O.
"""

from __future__ import annotations

import math
import time
from typing import Annotated, Final, Literal

import numpy as np
from numpy.typing import NDArray
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

SupersedeRule = Literal["tree", "off"]
"""Whether ``wa`` evicts first the cached branches newer requests have left: ``tree``
(the prefix-tree rule of the replay's ``wa-superseded``, docs/policy.md) or ``off``."""
SUPERSEDE_RULES: tuple[SupersedeRule, ...] = ("tree", "off")
DEFAULT_SUPERSEDE: SupersedeRule = "tree"


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
    categories: dict[str, CategoryParams] = Field(
        default_factory=dict,
        fail_fast=True,  # a bad category ends it: thousands more add nothing but cost
    )
    default: CategoryParams = DEFAULT_PARAMS
    note: str = Field(default="", max_length=500, description="Why this version exists")
    evictor: EvictorFamily = Field(
        default=DEFAULT_FAMILY,
        description="The evictor family in force on agents that follow the document "
        "(omitted from the stored JSON when it is wa, so agents that predate it read it)",
    )
    supersede: SupersedeRule = Field(
        default=DEFAULT_SUPERSEDE,
        description="Whether agents whose engine reports request boundaries (vLLM) evict "
        "superseded branches first, under a wa evictor (omitted from the stored JSON at "
        "its default, so agents that predate it read it)",
    )

    def params_for(self, category: str) -> CategoryParams:
        """Parameters of ``category``, or the default for an unseen one."""
        return self.categories.get(category, self.default)


BUILTIN_POLICY = PolicyDocument(version=0, created_at=0.0, note="built-in default")


MAX_JSON_DEPTH: Final = 3
"""How deep objects nest in a document's JSON: the document, ``categories`` (or
``default``), one category's parameters. No field holds an array."""

_NESTING = np.zeros(256, np.int8)
_NESTING[[ord("{"), ord("[")]] = 1
_NESTING[[ord("}"), ord("]")]] = -1
_QUOTE, _OBJECT, _ARRAY, _KEY = (ord(c) for c in '"{[:')
_MARKS = tuple(ord(c) for c in '"{}[]:')


def json_shape_fault(raw: bytes | str, max_categories: int | None = None) -> str | None:
    """Why ``raw`` cannot be a document's JSON, judged from its bytes outside strings
    before any parse; None if it may be (validation says the rest). Refused: an array,
    objects nested deeper than ``MAX_JSON_DEPTH`` or closed unopened, and, with
    ``max_categories``, more categories or keys than a document of that many holds. What a
    parse then builds, and the errors validation lists, are bounded by ``max_categories``;
    this scan costs a few numpy passes over the bytes, whatever they hold."""
    data = raw if isinstance(raw, bytes) else raw.encode("utf-8", "surrogatepass")
    offsets, marks = _marks_outside_strings(data)
    arrays = offsets[marks == _ARRAY]
    if len(arrays):
        return f"an array {_at(data, arrays[0])}: a policy document holds none"
    depth = np.cumsum(_NESTING[marks], dtype=np.int32)
    if int(depth.min(initial=0)) < 0:
        return f"a bracket that closes nothing {_at(data, offsets[np.argmax(depth < 0)])}"
    if int(depth.max(initial=0)) > MAX_JSON_DEPTH:
        at = offsets[np.argmax(depth > MAX_JSON_DEPTH)]
        return (
            f"objects nested {int(depth.max())} deep {_at(data, at)} > limit "
            f"{MAX_JSON_DEPTH} (the document, categories, a category's parameters)"
        )
    if max_categories is None:
        return None
    return _count_fault(data, offsets, marks, depth, max_categories)


def _count_fault(
    data: bytes,
    offsets: NDArray[np.intp],
    marks: NDArray[np.uint8],
    depth: NDArray[np.int32],
    max_categories: int,
) -> str | None:
    """Too many categories (objects at a category's depth), or too many keys where they
    sit: the document's fields, the category names with the default's parameters, one
    category's parameters."""
    category_opens = (marks == _OBJECT) & (depth == MAX_JSON_DEPTH)
    categories = int(np.count_nonzero(category_opens))
    if categories > max_categories:
        return f"{categories} categories > limit {max_categories}"
    keys = marks == _KEY
    key_offsets, key_depth = offsets[keys], depth[keys]
    params = len(CategoryParams.model_fields)
    levels = (
        (1, len(PolicyDocument.model_fields), "the document's fields"),
        (2, max_categories + params, "category names and the default's parameters"),
    )
    for level, most, what in levels:
        at_level = key_offsets[key_depth == level]
        if len(at_level) > most:
            return (
                f"{len(at_level)} keys at depth {level} > limit {most} ({what}); "
                f"the first past it {_at(data, at_level[most])}"
            )
    owners = np.cumsum(category_opens, dtype=np.int32)[keys][key_depth == MAX_JSON_DEPTH]
    per_category = np.bincount(owners)
    if len(per_category) and int(per_category.max()) > params:
        opened_at = offsets[category_opens][per_category.argmax() - 1]
        return (
            f"a category of {int(per_category.max())} keys {_at(data, opened_at)} > limit "
            f"{params} (its parameters)"
        )
    return None


def _marks_outside_strings(data: bytes) -> tuple[NDArray[np.intp], NDArray[np.uint8]]:
    """The offsets and bytes of the brackets and colons of ``data`` outside its JSON
    strings. An escaped backslash or quote never ends a string: both are blanked first
    (left to right, as JSON pairs them, at the same length), so the quotes left pair up."""
    if b"\\" in data:
        data = data.replace(b"\\\\", b"__").replace(b'\\"', b"__")
    chars = np.frombuffer(data, np.uint8)
    is_mark = chars == _MARKS[0]
    for mark in _MARKS[1:]:
        is_mark |= chars == mark
    offsets = np.flatnonzero(is_mark)
    marks = chars[offsets]
    quotes = marks == _QUOTE
    inside = (np.cumsum(quotes, dtype=np.uint8) & 1).view(np.bool_)  # parity: wraps at 256
    outside = ~(inside | quotes)
    return offsets[outside], marks[outside]


def _at(data: bytes, offset: np.integer | int) -> str:
    """Where ``offset`` is, for a reason: the byte and a few bytes before it."""
    at = int(offset)
    return f"at byte {at} (after {data[max(0, at - 24) : at]!r})"

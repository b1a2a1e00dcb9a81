"""Routes of the ``overrides`` tag: pin or release parameters of one category, or the
evictor family of every worker that follows the document.

Each change publishes a new policy version (the store composes it); one that changes
nothing (the same pin again, or releasing no pin) publishes nothing and answers with the
document in force, which the ``Kvwise-Published`` header of every answer says (``false``):
a release is idempotent, never a 404. Names and counts
are bounded here, at the edge: a category is any name an agent can send
(``CategoryInPath``: the rest of the path, ``/`` included; or ``CategoryInQuery``,
``?category=``, for a name a client would resolve as a path step: ``.``, ``..``), and at
most ``max_overrides`` categories are pinned. It must never write Redis itself.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response

from agent.policy_document import PolicyDocument
from controlplane.api.errors import ApiError, FieldError
from controlplane.api.field_messages import FieldProblem
from controlplane.api.models import CategoryInPath, CategoryInQuery, EvictorBody, OverrideBody
from controlplane.api.routes import (
    NEEDS_REDIS,
    NO_BODY,
    ControllerDep,
    answer,
    publishing,
)
from controlplane.service.store import StoreError
from controlplane.service.store_terms import EvictorState, TooManyOverrides

TAG = "overrides"
reads = APIRouter(tags=[TAG], dependencies=[NEEDS_REDIS])
writes = APIRouter(tags=[TAG], dependencies=[NEEDS_REDIS])


@reads.get("/v1/policy/overrides", response_model=dict[str, dict[str, float]])
def list_overrides(controller: ControllerDep) -> dict[str, dict[str, float]]:
    """Pinned parameters by category."""
    return controller.store.overrides()


_PIN: dict[str, Any] = {"response_model": PolicyDocument, "responses": publishing(409, 422)}
_RELEASE: dict[str, Any] = {
    "response_model": PolicyDocument,
    "responses": publishing(422),
    "dependencies": [NO_BODY],
}


@writes.put("/v1/policy/overrides/{category:category}", **_PIN)
def put_override(
    category: CategoryInPath, body: OverrideBody, controller: ControllerDep, response: Response
) -> PolicyDocument:
    """Pin any of ``rate``, ``p_reuse``, ``life_s`` for a category; publishes a version,
    unless the category's override is exactly that already: then nothing is published, the
    document in force comes back and the ``Kvwise-Published`` header says ``false``."""
    return _pin(category, body, controller, response)


@writes.put("/v1/policy/overrides", **_PIN)
def put_override_named_in_query(
    category: CategoryInQuery, body: OverrideBody, controller: ControllerDep, response: Response
) -> PolicyDocument:
    """``PUT /v1/policy/overrides/{category}`` with the category in the query
    (``?category=NAME``): it names any category, ``.`` and ``..`` too, which clients resolve
    in a path as a step."""
    return _pin(category, body, controller, response)


REPLACEMENT_CHARACTER = "\ufffd"
"""What a percent-encoded byte that is not UTF-8 decodes to."""


def _pinnable(category: str) -> str:
    """``category``, refused if a percent-encoded byte in it was not UTF-8: the pin would
    go to a U+FFFD name no agent sends, and say it succeeded. (Releasing such a name stays
    allowed: it removes a pin made before this check.)"""
    if REPLACEMENT_CHARACTER in category:
        message = "is not UTF-8 once percent-decoded (a byte that is not UTF-8 reads as U+FFFD)"
        raise FieldError(FieldProblem("invalid_value", "category", message))
    return category


def _pin(
    category: str, body: OverrideBody, controller: ControllerDep, response: Response
) -> PolicyDocument:
    category = _pinnable(category)
    values = body.given()
    if not values:
        raise FieldError(FieldProblem("invalid_value", "body", "give rate, p_reuse or life_s"))
    try:
        return answer(controller.store.set_override(category, values), response)
    except TooManyOverrides as exc:  # judged in the publication's transaction
        raise ApiError(409, "too_many_overrides", str(exc)) from None
    except StoreError as exc:
        raise FieldError(FieldProblem("invalid_value", "body", str(exc))) from None


@writes.delete("/v1/policy/overrides/{category:category}", **_RELEASE)
def delete_override(
    category: CategoryInPath, controller: ControllerDep, response: Response
) -> PolicyDocument:
    """Release a category's pinned parameters; publishes a version, unless the category
    has none pinned (``Kvwise-Published: false``, as releasing no evictor pin)."""
    return _release(category, controller, response)


@writes.delete("/v1/policy/overrides", **_RELEASE)
def delete_override_named_in_query(
    category: CategoryInQuery, controller: ControllerDep, response: Response
) -> PolicyDocument:
    """``DELETE /v1/policy/overrides/{category}`` with the category in the query
    (``?category=NAME``): it names any category, ``.`` and ``..`` too."""
    return _release(category, controller, response)


def _release(category: str, controller: ControllerDep, response: Response) -> PolicyDocument:
    return answer(controller.store.delete_override(category), response)


@reads.get("/v1/policy/evictor", response_model=EvictorState)
def get_evictor(controller: ControllerDep) -> EvictorState:
    """The evictor family in force, the operator's pin (if any) and the controller's
    selection (what applies without a pin)."""
    return controller.store.evictor()


@writes.put(
    "/v1/policy/evictor",
    response_model=PolicyDocument,
    responses=publishing(422),
)
def put_evictor(body: EvictorBody, controller: ControllerDep, response: Response) -> PolicyDocument:
    """Pin the evictor family; publishes a version, unless that family is pinned already
    (``Kvwise-Published: false``). The controller's selection no longer applies until the
    pin is released."""
    try:
        return answer(controller.store.pin_evictor(body.family), response)
    except StoreError as exc:
        raise FieldError(FieldProblem("invalid_value", "family", str(exc))) from None


@writes.delete(
    "/v1/policy/evictor",
    response_model=PolicyDocument,
    responses=publishing(422),
    dependencies=[NO_BODY],
)
def delete_evictor(controller: ControllerDep, response: Response) -> PolicyDocument:
    """Release the evictor family's pin; publishes a version with the controller's
    selection, unless no family is pinned (``Kvwise-Published: false``)."""
    return answer(controller.store.pin_evictor(None), response)

"""The API's routes, one module per OpenAPI tag: ``policy``, ``overrides``, ``observe``, ``ops``.

Each module offers a ``reads`` router (GET) and, where it changes state, a ``writes``
router; ``controlplane.api.app`` attaches the access each needs. Routes reach the
``Controller`` through ``ControllerDep`` and declare their ``response_model`` and error
responses; a route that takes no body declares ``NO_BODY``, which refuses one, and every
``/v1`` route refuses query parameters it does not declare (``KNOWN_QUERY_ONLY``, which
``controlplane.api.app`` adds to their routers). Every
change that answers with a document says in ``PUBLISHED_HEADER`` whether it published a
version (``answer``). They must never check tokens (the access guard did) or build Redis
keys.
"""

from __future__ import annotations

from typing import Annotated, Any, cast

from fastapi import Depends, Request, Response

from agent.policy_document import PolicyDocument
from controlplane.api.errors import FieldError, documented
from controlplane.api.field_messages import FieldProblem, unwanted_body
from controlplane.service.controller import Controller
from controlplane.service.store_terms import Change

PUBLISHED_HEADER = "Kvwise-Published"
"""In a change's answer: ``true`` if it published a version, ``false`` if the change was
in force already (the answer is then the document in force, its version unchanged)."""


def publishing(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI ``responses`` of a change answered by ``answer``: the error
    ``statuses`` (``documented``), and ``PUBLISHED_HEADER`` on its 200."""
    header = {
        "description": "true: the change published a version; false: it was in force "
        "already, and this is the document in force, its version unchanged",
        "schema": {"type": "string", "enum": ["true", "false"]},
    }
    success = {"description": "The document in force", "headers": {PUBLISHED_HEADER: header}}
    return {200: success, **documented(*statuses)}


async def _controller(request: Request) -> Controller:
    # async: resolved on the event loop, never queued behind the server's thread pool
    # (which requests hung on a stalled Redis can fill).
    return cast(Controller, request.app.state.controller)


ControllerDep = Annotated[Controller, Depends(_controller)]


async def _redis_not_known_down(controller: ControllerDep) -> None:
    """A route that needs Redis answers its 503 at once while Redis is known unreachable:
    its calls would wait out their timeouts and retries (20 s or more) on a thread of the
    server's shared pool, and clients that retry would fill it."""
    down = controller.health.known_down()
    if down is not None:
        raise down


NEEDS_REDIS = Depends(_redis_not_known_down)


async def _takes_no_body(request: Request) -> None:
    """A route that takes no body refuses one (422, each field ``unknown_field``, as a
    body route refuses a field it does not know): a field it would ignore, such as
    ``{"force": true}`` on a refit, must not look accepted."""
    problems = unwanted_body(await request.body())
    if problems:
        raise FieldError(*problems)


NO_BODY = Depends(_takes_no_body)


async def _known_query_only(request: Request) -> None:
    """A route refuses query parameters it does not declare (422, each ``unknown_field``,
    as a body refuses a field it does not know): ignored, a misspelt or stray parameter
    would look accepted."""
    route = request.scope.get("route")
    declared = {p.alias for p in getattr(getattr(route, "dependant", None), "query_params", [])}
    taken = ", ".join(sorted(declared)) or "none"
    problems = [
        FieldProblem("unknown_field", name or "query", f"is not a query parameter here ({taken})")
        for name in dict.fromkeys(request.query_params.keys())
        if name not in declared
    ]
    if problems:
        raise FieldError(*problems)


KNOWN_QUERY_ONLY = Depends(_known_query_only)


def answer(change: Change, response: Response) -> PolicyDocument:
    """The document a change left in force, its ``PUBLISHED_HEADER`` set on ``response``."""
    response.headers[PUBLISHED_HEADER] = "true" if change.published else "false"
    return change.document

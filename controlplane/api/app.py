"""The REST API (FastAPI): read fitted policies and categories, override, roll back, refit.

Owns the assembly of the app: its OpenAPI description, the error handlers
(``controlplane.api.errors``), the access guard in front of every route
(``controlplane.api.access``) and the routers by tag (``controlplane.api.routes``),
each included with the access it needs. All state lives in the ``Controller``
(``controlplane.service.controller``); this package must never touch Redis keys itself.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from controlplane.api.access import BODY_TOO_LARGE, MAX_BODY_BYTES, Access, AccessGuard, AccessRules
from controlplane.api.errors import documented, install_error_handlers
from controlplane.api.head import HeadAsGet
from controlplane.api.models import P_REUSE_MESSAGE
from controlplane.api.routes import KNOWN_QUERY_ONLY, observe, ops, overrides, policy
from controlplane.service.controller import Controller

API_DESCRIPTION = f"""
kvwise fits per-category reuse models (``F(t) = p_reuse * (1 - exp(-rate * t))`` and a
life window) from live block-access events and publishes them as immutable, strictly
increasing policy versions that every worker hot-reloads.

Mutations (``POST``, ``PUT``, ``DELETE``) need ``Authorization: Bearer <token>`` when the
controller runs with ``KVWISE_API_TOKEN``; reads under ``/v1/`` and ``/metrics`` need a
token too when it runs with ``KVWISE_API_READ_TOKEN`` (the API token also reads). The
probes and this description are always open. Request bodies are limited to
{MAX_BODY_BYTES} bytes.

Every error is JSON: ``{{"error": code, "reason": text}}``; a bad value adds ``field``
and ``message`` (``{{"error": "invalid_value", "field": "p_reuse", "message":
"{P_REUSE_MESSAGE}", ...}}``). While Redis is unavailable, routes that need it answer
503.
"""

_TAGS = [
    {"name": policy.TAG, "description": "The current policy, kept versions, refit, rollback"},
    {"name": overrides.TAG, "description": "Parameters pinned by an operator, per category"},
    {"name": observe.TAG, "description": "Categories (fit and published) and live agents"},
    {"name": ops.TAG, "description": "Probes and Prometheus metrics"},
]


def _store_route_options(rules: AccessRules, access: Access) -> dict[str, Any]:
    """The ``include_router`` options of the ``/v1`` routes: ``access``, the 503 of a
    store that cannot be reached, and no query parameter the route does not declare
    (``KNOWN_QUERY_ONLY``: ``POST /v1/policy/refit?force=1`` ran a plain refit)."""
    options = rules.route_options(access, 503)
    return {**options, "dependencies": [*options["dependencies"], KNOWN_QUERY_ONLY]}


def create_app(controller: Controller) -> FastAPI:
    """The API bound to ``controller`` (started and stopped by ``server.build_app``)."""
    app = FastAPI(
        title="kvwise controller",
        version="1",
        description=API_DESCRIPTION,
        openapi_tags=_TAGS,
        responses=documented(BODY_TOO_LARGE),  # the access guard answers it on any route
    )
    app.state.controller = controller
    install_error_handlers(app)
    rules = AccessRules.from_settings(controller.settings)
    app.add_middleware(AccessGuard, rules=rules, max_body_bytes=MAX_BODY_BYTES)
    app.add_middleware(HeadAsGet)  # outermost: the guard judges a HEAD as its GET
    for module in (policy, overrides, observe):
        app.include_router(module.reads, **_store_route_options(rules, Access.READ))
    for module in (policy, overrides):
        app.include_router(module.writes, **_store_route_options(rules, Access.WRITE))
    app.include_router(ops.probes)
    app.include_router(ops.reads, **rules.route_options(Access.READ))
    return app

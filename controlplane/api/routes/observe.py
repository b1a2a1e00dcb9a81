"""Routes of the ``observe`` tag: categories (fit beside published; one by name in the path
or, for any name, ``.`` and ``..`` included, in the query), live agents and the shadow
evaluation.

Responses are the controller's ``CategorySummary``/``CategoryDetail``, ``AgentView``
(each agent's heartbeat with what ingest did with its events) and ``ShadowView``.
Read-only: it must never change state.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response

from controlplane.api.errors import ApiError, documented
from controlplane.api.models import CategoryInPath, CategoryInQuery
from controlplane.api.routes import NEEDS_REDIS, ControllerDep
from controlplane.service.agents import AgentView
from controlplane.service.categories import CategoryDetail, CategorySummary
from controlplane.shadow.view import ShadowView

TAG = "observe"
reads = APIRouter(tags=[TAG])
_store_reads = APIRouter(dependencies=[NEEDS_REDIS])
"""The routes that read Redis, part of ``reads`` (the shadow view is the leader's own)."""


@_store_reads.get("/v1/categories", response_model=list[CategorySummary])
def list_categories(controller: ControllerDep) -> list[CategorySummary]:
    """Per category: samples, fitted and published parameters, fit quality."""
    return controller.categories()


@_store_reads.get(
    "/v1/categories/{name:category}", response_model=CategoryDetail, responses=documented(404, 422)
)
def get_category(name: CategoryInPath, controller: ControllerDep) -> CategoryDetail:
    """One category with its empirical and fitted reuse-time CDF points."""
    detail = controller.category(name)
    if detail is None:
        raise ApiError(404, "unknown_category", f"category {name!r} has not been seen")
    return detail


@_store_reads.get(
    "/v1/category",
    response_model=CategoryDetail,
    responses=documented(404, 422),
)
def get_category_named_in_query(name: CategoryInQuery, controller: ControllerDep) -> CategoryDetail:
    """``GET /v1/categories/{name}`` with the name in the query (``?name=NAME``): it names
    any category, ``.`` and ``..`` too, which clients resolve in a path as a step."""
    return get_category(name, controller)


AGENTS_NOT_LISTED_HEADER = "Kvwise-Agents-Not-Listed"
"""Response header of GET /v1/agents: heartbeat keys found past KVWISE_MAX_WORKERS."""
HEARTBEATS_REFUSED_HEADER = "Kvwise-Heartbeats-Refused"
"""Response header of GET /v1/agents: heartbeats unreadable (too large, ...)."""
LEDGERS_REFUSED_HEADER = "Kvwise-Ledgers-Refused"
"""Response header of GET /v1/agents: agents listed whose ledger was unreadable."""


def _counted_header(what: str) -> dict[str, Any]:
    return {"description": what, "schema": {"type": "integer", "minimum": 0}}


_AGENTS_HEADERS = {
    AGENTS_NOT_LISTED_HEADER: _counted_header(
        "Heartbeat keys found past KVWISE_MAX_WORKERS, not listed"
    ),
    HEARTBEATS_REFUSED_HEADER: _counted_header("Heartbeats unreadable (too large, malformed)"),
    LEDGERS_REFUSED_HEADER: _counted_header("Agents listed whose ingest ledger was unreadable"),
}


@_store_reads.get(
    "/v1/agents",
    response_model=list[AgentView],
    responses={200: {"description": "Live agents", "headers": _AGENTS_HEADERS}},
)
def list_agents(controller: ControllerDep, response: Response) -> list[AgentView]:
    """Live agents (heartbeat not expired): the policy version each has in force
    (`applied_version`) and the one it received (`staged_version`), which an engine
    applies at its next call into the agent (an idle vLLM engine makes none); and the
    controller's counts of their events (ingested, dropped for their clock, refused,
    dead-lettered, batches missing). `id_conflict`: agent processes found alive under the
    worker's id at once, by their events or (`heartbeat_id_conflict`) the instances
    their heartbeats record; 0 when none. `*_unexpected_errors`: steps of the agent's publisher,
    subscriber and heartbeat threads failed by an error not Redis's (0 from an agent that
    predates them). At most `KVWISE_MAX_WORKERS` agents, the workers
    ingested first, then by id: header `Kvwise-Agents-Not-Listed` counts the heartbeats
    left out, `Kvwise-Heartbeats-Refused` those unreadable (too large, corrupt, ...),
    `Kvwise-Ledgers-Refused` the agents listed with `counts_known` false (their ledger
    unreadable: not a hash, a count not a number).
    `ingest_refused`: on the leader, whether it leaves the worker's stream unread; null on
    a standby, which does not know (refused streams: the leader's log and
    `kvwise_ingest_streams_refused`)."""
    listing = controller.agent_listing()
    response.headers[AGENTS_NOT_LISTED_HEADER] = str(listing.not_listed)
    response.headers[HEARTBEATS_REFUSED_HEADER] = str(listing.refused)
    response.headers[LEDGERS_REFUSED_HEADER] = str(listing.ledgers_refused)
    return listing.agents


reads.include_router(_store_reads)


@reads.get("/v1/shadow", response_model=ShadowView)
def get_shadow(controller: ControllerDep) -> ShadowView:
    """What other policies and other cache sizes would have scored on the workers' own
    traffic: per worker group (workers of one capacity), per policy (`wa` is the published
    document) and per capacity multiple, the hit ratio over the shadow window with its
    95 % interval, estimated from a sample of prefix subtrees replayed in miniature
    (docs/shadow.md); and the refit guard's last verdict. Served by the leader (a standby
    answers with no groups)."""
    return controller.shadow_view()

"""Routes of the ``observe`` tag: categories (fit beside published), live agents and the
shadow evaluation.

Responses are the controller's ``CategorySummary``/``CategoryDetail``, ``AgentView``
(each agent's heartbeat with what ingest did with its events) and ``ShadowView``.
Read-only: it must never change state.
"""

from __future__ import annotations

from fastapi import APIRouter

from controlplane.api.errors import ApiError, documented
from controlplane.api.models import CategoryInPath
from controlplane.api.routes import NEEDS_REDIS, ControllerDep
from controlplane.service.agents import AgentView
from controlplane.service.controller import CategoryDetail, CategorySummary
from controlplane.shadow.view import ShadowView

TAG = "observe"
reads = APIRouter(tags=[TAG])


@reads.get("/v1/categories", response_model=list[CategorySummary], dependencies=[NEEDS_REDIS])
def list_categories(controller: ControllerDep) -> list[CategorySummary]:
    """Per category: samples, fitted and published parameters, fit quality."""
    return controller.categories()


@reads.get(
    "/v1/categories/{name}",
    response_model=CategoryDetail,
    responses=documented(404, 422),
    dependencies=[NEEDS_REDIS],
)
def get_category(name: CategoryInPath, controller: ControllerDep) -> CategoryDetail:
    """One category with its empirical and fitted reuse-time CDF points."""
    detail = controller.category(name)
    if detail is None:
        raise ApiError(404, "unknown_category", f"category {name!r} has not been seen")
    return detail


@reads.get("/v1/agents", response_model=list[AgentView], dependencies=[NEEDS_REDIS])
def list_agents(controller: ControllerDep) -> list[AgentView]:
    """Live agents (heartbeat not expired): the policy version each has in force
    (`applied_version`) and the one it received (`staged_version`), which an engine
    applies at its next call into the agent (an idle vLLM engine makes none); and the
    controller's counts of their events (ingested, dropped for their clock, refused,
    dead-lettered, batches missing)."""
    return controller.agents()


@reads.get("/v1/shadow", response_model=ShadowView)
def get_shadow(controller: ControllerDep) -> ShadowView:
    """What other policies and other cache sizes would have scored on the workers' own
    traffic: per worker group (workers of one capacity), per policy (`wa` is the published
    document) and per capacity multiple, the hit ratio over the shadow window with its
    95 % interval, estimated from a sample of prefix subtrees replayed in miniature
    (docs/shadow.md); and the refit guard's last verdict. Served by the leader (a standby
    answers with no groups)."""
    return controller.shadow_view()

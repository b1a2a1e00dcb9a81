"""Routes of the ``policy`` tag: the current document, kept versions, refit and rollback.

Reads return the store's own types (``PolicyDocument``, ``VersionInfo``); a refit returns
the controller's ``RefitOutcome``. Only the leader refits; a standby says who leads. It
must never compose documents itself (``controlplane.service.store`` does).
"""

from __future__ import annotations

from fastapi import APIRouter, Response

from agent.policy_document import PolicyDocument
from controlplane.api.errors import ApiError, documented
from controlplane.api.models import RollbackBody, VersionInPath
from controlplane.api.routes import NEEDS_REDIS, NO_BODY, ControllerDep, answer, publishing
from controlplane.service.refit import RefitOutcome, RefitStatus
from controlplane.service.store import StoreError
from controlplane.service.store_terms import Change, VersionInfo

TAG = "policy"
reads = APIRouter(tags=[TAG], dependencies=[NEEDS_REDIS])
writes = APIRouter(tags=[TAG], dependencies=[NEEDS_REDIS])


@reads.get("/v1/policy", response_model=PolicyDocument, responses=documented(404))
def get_policy(controller: ControllerDep) -> PolicyDocument:
    """The current policy document: what every worker should be applying."""
    version = controller.store.current_version()
    if version is None:
        raise ApiError(404, "no_policy", "no policy version has been published yet")
    doc = controller.store.get(version)
    if doc is None:  # the pointer outlived its document, or it is refused: never "no policy"
        refused = controller.store.refusal(version)
        if refused is not None:
            said = f"stored version {version} refused: {refused}; the next publication replaces it"
            raise ApiError(503, "policy_refused", said)
        raise ApiError(503, "policy_missing", f"current names version {version}, not stored")
    return doc


@reads.get("/v1/policy/versions", response_model=list[VersionInfo])
def list_versions(controller: ControllerDep) -> list[VersionInfo]:
    """Kept versions, newest first."""
    return controller.store.versions()


@reads.get(
    "/v1/policy/versions/{version}",
    response_model=PolicyDocument,
    responses=documented(404, 422),
)
def get_version(version: VersionInPath, controller: ControllerDep) -> PolicyDocument:
    """One kept version."""
    try:
        return controller.store.kept(version)
    except StoreError as exc:
        raise ApiError(404, "unknown_version", str(exc)) from None


@reads.get("/v1/policy/refit", response_model=RefitStatus)
def refit_status(controller: ControllerDep) -> RefitStatus:
    """Why the workers have the version they have: the last refit's outcome on this
    replica (null on a standby, or before the first) and whether a rollback holds
    automatic refits back (until ``POST /v1/policy/refit``)."""
    return controller.refit_status()


@writes.post(
    "/v1/policy/refit",
    response_model=RefitOutcome,
    responses=documented(409, 422),
    dependencies=[NO_BODY],
)
def refit(controller: ControllerDep) -> RefitOutcome:
    """Fit now and publish if the guard passes (also releases a rollback hold)."""
    if not controller.lease.is_leader:
        holder = controller.lease.holder_now() or "nobody"
        raise ApiError(409, "not_leader", f"this replica does not refit; leader: {holder}")
    return controller.refit(manual=True)


@writes.post(
    "/v1/policy/rollback",
    response_model=PolicyDocument,
    responses=publishing(404, 422),
)
def rollback(body: RollbackBody, controller: ControllerDep, response: Response) -> PolicyDocument:
    """Publish a new version with an earlier version's parameters (always: it also
    records the hold, ``Kvwise-Published: true``)."""
    try:
        doc = controller.store.rollback(body.version, hold=body.hold)
        return answer(Change(doc, published=True), response)
    except StoreError as exc:
        raise ApiError(404, "unknown_version", str(exc)) from None

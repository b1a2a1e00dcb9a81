"""Routes of the ``ops`` tag: liveness, readiness and Prometheus metrics.

The probes are always open (a kubelet sends no token) and answer even while Redis is
down: readiness then says why not. ``/metrics`` is a read like any other. It must never
fail because a gauge could not be refreshed.
"""

from __future__ import annotations

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse, RedirectResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from controlplane.api.models import HealthOut
from controlplane.api.routes import ControllerDep

TAG = "ops"
probes = APIRouter(tags=[TAG])
reads = APIRouter(tags=[TAG])


@probes.get("/", include_in_schema=False)
def root() -> RedirectResponse:
    return RedirectResponse("/docs")


@probes.get("/healthz", response_model=HealthOut)
def healthz(controller: ControllerDep) -> HealthOut:
    """Liveness: the process serves HTTP."""
    return HealthOut(status="ok", leader=controller.lease.is_leader)


@probes.get(
    "/readyz",
    response_model=HealthOut,
    responses={503: {"model": HealthOut, "description": "Not ready; `reason` says why"}},
)
def readyz(controller: ControllerDep) -> JSONResponse:
    """Readiness: Redis answers and a policy version exists."""
    ok, reason = controller.ready()
    body = HealthOut(
        status="ok" if ok else "unavailable", leader=controller.lease.is_leader, reason=reason
    )
    return JSONResponse(body.model_dump(), status_code=200 if ok else 503)


# response_class=Response (no media type of its own): the 200 is documented as the
# Prometheus text format, and the errors the guard may add as JSON.
@reads.get(
    "/metrics",
    response_class=Response,
    responses={
        200: {
            "content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}},
            "description": "Prometheus text exposition format",
        }
    },
)
def metrics(controller: ControllerDep) -> Response:
    """Prometheus metrics of the controller."""
    controller.refresh_gauges()
    return Response(generate_latest(controller.metrics.registry), media_type=CONTENT_TYPE_LATEST)

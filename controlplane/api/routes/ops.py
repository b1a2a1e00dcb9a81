"""Routes of the ``ops`` tag: liveness, readiness and Prometheus metrics.

The probes are always open (a kubelet sends no token) and answer even while Redis is
down: readiness then says why not. ``/metrics`` is a read like any other. It must never
fail because a gauge could not be refreshed. None of the three waits for the server's
shared thread pool: requests hung on a stalled Redis can fill it, and a liveness probe
that waits behind them gets a healthy controller restarted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse, RedirectResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from controlplane.api.models import HealthOut
from controlplane.api.routes import ControllerDep

TAG = "ops"
probes = APIRouter(tags=[TAG])
reads = APIRouter(tags=[TAG])

PROBE_LANE = ThreadPoolExecutor(max_workers=4, thread_name_prefix="kvwise-probe")
"""Where readiness and scrapes make their Redis calls (each bounded by the controller's
probe timeout): threads of their own, beside the shared pool."""
T = TypeVar("T")


async def _in_probe_lane(call: Callable[[], T]) -> T:
    return await asyncio.get_running_loop().run_in_executor(PROBE_LANE, call)


@probes.get("/", include_in_schema=False)
def root() -> RedirectResponse:
    return RedirectResponse("/docs")


@probes.get("/healthz", response_model=HealthOut)
async def healthz(controller: ControllerDep) -> HealthOut:
    """Liveness: the process serves HTTP."""
    return HealthOut(status="ok", leader=controller.lease.is_leader)


@probes.get(
    "/readyz",
    response_model=HealthOut,
    responses={503: {"model": HealthOut, "description": "Not ready; `reason` says why"}},
)
async def readyz(controller: ControllerDep) -> JSONResponse:
    """Readiness: Redis answers and a policy version exists."""
    ok, reason = await _in_probe_lane(controller.ready)
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
async def metrics(controller: ControllerDep) -> Response:
    """Prometheus metrics of the controller."""

    def exposition() -> bytes:
        controller.refresh_gauges()
        return generate_latest(controller.metrics.registry)

    return Response(await _in_probe_lane(exposition), media_type=CONTENT_TYPE_LATEST)

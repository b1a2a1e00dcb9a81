"""The ASGI application of the controller: the API bound to a running ``Controller``.

Owns the lifespan: the controller starts with the server and stops (releasing its lease
and flushing nothing half-done) when the server stops. It must never contain routes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from controlplane.api.app import create_app
from controlplane.service.controller import Controller
from controlplane.service.settings import ControllerSettings


def build_app(settings: ControllerSettings, controller: Controller | None = None) -> FastAPI:
    ctl = controller or Controller(settings)
    app = create_app(ctl)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        ctl.start()
        try:
            yield
        finally:
            ctl.stop()

    app.router.lifespan_context = lifespan
    app.state.controller = ctl
    return app

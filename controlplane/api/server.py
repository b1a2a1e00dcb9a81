"""The ASGI application of the controller: the API bound to a running ``Controller``, and
the dashboard beside it (``controlplane.api.ui``).

Owns the lifespan: the exposure check before anything starts, the controller started
with the server (after saying who may call the API) and stopped (releasing its lease
and flushing nothing half-done) when the server stops. It must never contain routes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from controlplane.api.app import create_app
from controlplane.api.exposure import announce_exposure, check_exposure
from controlplane.api.ui import mount_ui
from controlplane.service.controller import Controller
from controlplane.service.settings import ControllerSettings


def build_app(settings: ControllerSettings, controller: Controller | None = None) -> FastAPI:
    """The app to serve; raises ``UnsafeExposure`` for an open API the settings forbid."""
    check_exposure(settings)
    ctl = controller or Controller(settings)
    app = create_app(ctl)
    mount_ui(app)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        announce_exposure(settings)
        ctl.start()
        try:
            yield
        finally:
            ctl.stop()

    app.router.lifespan_context = lifespan
    return app

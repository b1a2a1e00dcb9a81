"""``kvwise controller``: run the control plane service (REST API + ingest + refit).

Owns the command's options and the process lifecycle (uvicorn, signals). Settings come
from the environment (``KVWISE_*``, see docs/configuration.md); options override them.
"""

from __future__ import annotations

from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    app.command("controller")(controller)


def controller(
    host: Annotated[str | None, typer.Option(help="Bind address (KVWISE_HOST)")] = None,
    port: Annotated[int | None, typer.Option(help="Port (KVWISE_PORT)")] = None,
) -> None:
    """Run the controller: ingest agents' events, refit on a schedule, serve the REST API.

    Every setting is an environment variable with the KVWISE_ prefix, e.g.
    KVWISE_REDIS_URL, KVWISE_API_TOKEN, KVWISE_REFIT_INTERVAL_S (docs/configuration.md).
    OpenAPI docs are served at /docs, Prometheus metrics at /metrics.
    """
    import logging

    import uvicorn
    from pydantic import ValidationError

    from controlplane.api.exposure import UnsafeExposure
    from controlplane.api.server import build_app
    from controlplane.cli.common import fail
    from controlplane.service.settings import ControllerSettings

    try:
        settings = ControllerSettings()
    except ValidationError as exc:
        first = exc.errors()[0]
        name = f"KVWISE_{str(first['loc'][0]).upper()}" if first["loc"] else "settings"
        fail(f"bad controller setting {name}: {first['msg'].removeprefix('Value error, ')}")
    if host is not None:
        settings.host = host
    if port is not None:
        settings.port = port
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        app = build_app(settings)
    except UnsafeExposure as exc:
        fail(str(exc))
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        access_log=settings.log_level == "debug",
    )

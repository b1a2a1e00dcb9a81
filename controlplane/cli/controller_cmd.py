"""``kvwise controller``: run the control plane service (REST API + ingest + refit).

Owns the command's options, the checks on the settings before anything starts (a bad
value or a malformed Redis URL is one error line naming its variable, exit code 2) and
the process lifecycle (the API's socket bound first, then uvicorn, signals: a graceful stop
on SIGINT or SIGTERM exits 0; the controller's stop begins with the server's, so requests
waiting on a Redis that hangs are given up with the rest, see ``Controller.begin_stop``).
Settings
come from the environment (``KVWISE_*``, see docs/configuration.md); options override
them.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    import uvicorn


def register(app: typer.Typer) -> None:
    app.command("controller")(controller)


def _overriding(field: str, help_text: str, fallback: str) -> Any:
    """The option that overrides the controller setting ``field``, its value named
    ``FIELD``; its help names the variable (``KVWISE_FIELD``) and ``fallback``, the
    setting's default in ``ControllerSettings`` (a test holds them equal; importing the
    settings here would slow every command's start)."""
    name = field.upper()
    return typer.Option(metavar=name, help=f"{help_text} [default: KVWISE_{name}, else {fallback}]")


HostOpt = Annotated[str | None, _overriding("host", "Bind address", fallback="127.0.0.1")]
PortOpt = Annotated[int | None, _overriding("port", "Port of the API", fallback="8080")]


def controller(host: HostOpt = None, port: PortOpt = None) -> None:
    """Run the controller: ingest agents' events, refit on a schedule, serve the REST API.

    Every setting is an environment variable with the `KVWISE_` prefix, e.g.
    `KVWISE_REDIS_URL`, `KVWISE_API_TOKEN`, `KVWISE_REFIT_INTERVAL_S` (`kvwise config`
    lists them all; docs/configuration.md). OpenAPI docs are served at /docs, Prometheus
    metrics at /metrics.

    Examples:

        kvwise controller
        KVWISE_REDIS_URL=redis://127.0.0.1:6379/0 kvwise controller --port 8080
    """
    import logging

    import uvicorn

    from controlplane.api.exposure import UnsafeExposure
    from controlplane.api.server import build_app
    from controlplane.cli.common import (
        check_redis_url,
        fail,
        settings_or_fail,
        warn_unknown_variables,
    )
    from controlplane.cli.signals import SignalFlag, stop_on_signals
    from controlplane.service.settings import ControllerSettings

    settings = settings_or_fail(
        ControllerSettings,
        {"host": host, "port": port},
        {"host": "--host", "port": "--port"},
        what="controller",
    )
    check_redis_url(settings.redis_url, "KVWISE_REDIS_URL")
    warn_unknown_variables()
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        app = build_app(settings)
    except UnsafeExposure as exc:
        fail(str(exc))
    listening = _bound_socket(settings.host, settings.port)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        access_log=settings.log_level == "debug",
    )
    # uvicorn handles SIGINT/SIGTERM itself (a graceful shutdown: the lifespan stops the
    # controller), then raises the signal again under the handlers it found: these, so a
    # graceful stop exits 0 on either signal instead of dying of SIGTERM (143).
    with stop_on_signals(SignalFlag()):
        _server_class(app.state.controller.begin_stop)(config).run(sockets=[listening])


def _serving_line(host: str, port: int) -> str:
    """What the controller says once it serves: where (uvicorn says nothing of a socket
    handed to it), and the paths a user looks for first."""
    from controlplane.api.exposure import host_port

    return (
        f"serving the API on http://{host_port(host, port)} (OpenAPI docs at /docs, "
        "dashboard at /ui/, metrics at /metrics)"
    )


def _server_class(begin_stop: Callable[[], None]) -> type[uvicorn.Server]:
    """uvicorn's server, imported here as the command runs (not when the CLI loads)."""
    import logging

    import uvicorn

    class SayingWhere(uvicorn.Server):
        """uvicorn's server that logs ``_serving_line`` once its startup is complete, and
        calls ``begin_stop`` as its shutdown begins: uvicorn waits for the requests in
        flight before the lifespan stops the controller, and one waiting on a Redis that
        hangs would hold it for its calls' timeouts and retries (a minute and more)."""

        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            begin_stop()
            await super().shutdown(sockets=sockets)

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets=sockets)
            if not self.should_exit:
                config = self.config
                logging.getLogger("controlplane.cli.controller").info(
                    _serving_line(config.host, config.port)
                )

    return SayingWhere


def _bound_socket(host: str, port: int) -> socket.socket:
    """The API's socket, bound before the controller starts: a port already taken fails
    here (exit code 2), before this replica leads or writes anything to Redis."""
    from controlplane.api.exposure import host_port
    from controlplane.cli.common import fail

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listening = socket.socket(family, socket.SOCK_STREAM)
    listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listening.bind((host, port))
    except OSError as exc:
        listening.close()
        fail(f"cannot listen on {host_port(host, port)}: {exc.strerror or exc}")
    return listening

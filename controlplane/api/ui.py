"""The operator dashboard at ``/ui``: static files shipped in the package, served as they are.

Owns the mount of ``controlplane/api/static/`` (hand-written HTML, CSS and ES modules: no
build step) and the headers they go out with. A Content-Security-Policy of ``'self'``
makes the browser refuse anything from elsewhere, so the page can only ever talk to the
controller that served it. The page is a client of the public REST API like any other;
this module must never define API routes or read the controller's state.
"""

from __future__ import annotations

import os
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import RedirectResponse
from starlette.requests import Request
from starlette.responses import Response
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

UI_PATH = "/ui"
STATIC_DIR = Path(__file__).with_name("static")

# Everything from this origin only; inline code is refused too, so an injected string can
# never run. data: images are the SVG charts' own downloads, none today but harmless.
UI_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # Revalidate each load (ETag): an upgraded controller never runs a stale script.
    "Cache-Control": "no-cache",
}


class _DashboardFiles(StaticFiles):
    """The static files with the dashboard's security and cache headers."""

    def file_response(
        self,
        full_path: str | os.PathLike[str],
        stat_result: os.stat_result,
        scope: Scope,
        status_code: int = 200,
    ) -> Response:
        response = super().file_response(full_path, stat_result, scope, status_code)
        response.headers.update(UI_HEADERS)
        return response


def mount_ui(app: FastAPI) -> None:
    """Serve the dashboard at ``/ui/`` (``/ui`` redirects there); kept out of OpenAPI."""

    async def to_index(_: Request) -> Response:
        return RedirectResponse(UI_PATH + "/", status_code=307)

    app.add_route(UI_PATH, to_index, include_in_schema=False)
    app.mount(UI_PATH, _DashboardFiles(directory=STATIC_DIR, html=True), name="ui")

"""HEAD on every route that answers GET, as HTTP asks.

Owns ``HeadAsGet``: ASGI middleware that runs a HEAD request as its GET and sends the
answer's status and headers without its body. FastAPI's routes answer only the methods
they declare, so without it every read answered HEAD with a 405 whose ``Allow`` header
named HEAD. It must never change what a GET answers.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class HeadAsGet:
    """Answers HEAD as GET without the body (module docstring)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return

        async def send_headers_only(message: Message) -> None:
            if message["type"] == "http.response.body":
                message = {**message, "body": b""}
            await send(message)

        await self.app({**scope, "method": "GET"}, receive, send_headers_only)

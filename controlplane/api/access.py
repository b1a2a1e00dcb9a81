"""Who may call what, decided before a route reads a byte of the request body.

Owns ``AccessRules`` (the API token, the optional read token, which request needs which,
tokens compared in constant time), ``AccessGuard`` (pure ASGI middleware that answers
401/403 and 413 from the request line and headers alone, and cuts a body off once it
streams past ``MAX_BODY_BYTES``; a refusal sent while the client is still sending its
body is followed by a bounded linger, ``LINGER_S``, so that the server's close does not
reset the connection before the client has read the answer) and the OpenAPI declaration
of the bearer scheme on the routes that need one. The checks sit in front of the app
because FastAPI reads a body before it runs a route's dependencies. Rules: mutations
(any method but GET, HEAD, OPTIONS) need the API token when one is set; reads under
``/v1/`` and ``/metrics`` need the read token (or the API token) when a read token is
set; probes and the API's own description stay open. It must never log per request (a
flood of bad tokens must not flood the log) or know what a route does.
"""

from __future__ import annotations

import enum
import hmac
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio
from fastapi import Security
from fastapi.security import HTTPBearer
from pydantic import SecretStr
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from controlplane.api.errors import ApiError, documented
from controlplane.service.settings import ControllerSettings

MAX_BODY_BYTES = 16 * 1024
"""Largest request body accepted (the API's bodies are a few dozen bytes)."""
BODY_TOO_LARGE = 413
"""What the guard answers a body over ``MAX_BODY_BYTES``, on any route (the app declares
it on every one)."""

LINGER_S = 2.0
"""After refusing a body the client is still sending, how long the guard goes on reading
and dropping it before the server closes. Closing on unread bytes makes the kernel send a
reset, which can destroy the answer before the client reads it (curl then shows the 413
with no body); a client that reads while it sends stops within a round trip."""
LINGER_BYTES = 64 << 20
"""The most body bytes dropped while lingering."""

_READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_REALM = 'Bearer realm="kvwise"'
_BEARER = HTTPBearer(
    auto_error=False,
    scheme_name="bearer",
    description="KVWISE_API_TOKEN for everything; KVWISE_API_READ_TOKEN, when set, for reads",
)


class Access(enum.IntEnum):
    """What a request needs, or what a token grants; a higher level includes the lower."""

    OPEN = 0
    READ = 1
    WRITE = 2


def required_access(method: str, path: str) -> Access:
    """The access a request needs, from its method and path alone."""
    if method not in _READ_METHODS:
        return Access.WRITE
    if path.startswith("/v1/") or path == "/metrics":
        return Access.READ
    return Access.OPEN


@dataclass(frozen=True)
class AccessRules:
    """The configured tokens (None: that access is open)."""

    api_token: bytes | None
    read_token: bytes | None

    @classmethod
    def from_settings(cls, settings: ControllerSettings) -> AccessRules:
        def raw(secret: SecretStr | None) -> bytes | None:
            return None if secret is None else secret.get_secret_value().encode()

        return cls(raw(settings.api_token), raw(settings.api_read_token))

    def guarded(self, access: Access) -> bool:
        """Whether ``access`` needs a token under these rules."""
        if access is Access.WRITE:
            return self.api_token is not None
        return access is Access.READ and self.read_token is not None

    def granted(self, token: bytes) -> Access:
        """What ``token`` may do. Both tokens are always compared, each in constant time,
        so the answer's timing says nothing about either."""
        write = _same(token, self.api_token)
        read = _same(token, self.read_token)
        return Access.WRITE if write else Access.READ if read else Access.OPEN

    def refusal(self, method: str, path: str, authorization: str | None) -> ApiError | None:
        """The 401/403 for this request, or None when it may go on."""
        needed = required_access(method, path)
        if not self.guarded(needed):
            return None
        token = _bearer_token(authorization)
        if token is None:
            return ApiError(
                401, "unauthorized", _no_token(authorization), {"WWW-Authenticate": _REALM}
            )
        granted = self.granted(token)
        if granted >= needed:
            return None
        if granted is Access.OPEN:
            challenge = f'{_REALM}, error="invalid_token"'
            return ApiError(
                401, "unauthorized", "wrong bearer token", {"WWW-Authenticate": challenge}
            )
        challenge = f'{_REALM}, error="insufficient_scope"'
        reason = "the read token cannot change anything; send the API token"
        return ApiError(403, "forbidden", reason, {"WWW-Authenticate": challenge})

    def route_options(self, access: Access, *also: int) -> dict[str, Any]:
        """``include_router`` options declaring ``access`` in OpenAPI: the bearer scheme
        (only where a token is needed), the token errors the guard may answer and
        ``also`` (the app declares ``BODY_TOO_LARGE`` on every route)."""
        statuses = [401] if self.guarded(access) else []
        if access is Access.WRITE and self.read_token is not None:
            statuses.append(403)
        # Declares the scheme; AccessGuard has enforced it before the route runs.
        dependencies = [Security(_BEARER)] if self.guarded(access) else []
        return {"dependencies": dependencies, "responses": documented(*statuses, *also)}


class AccessGuard:
    """ASGI middleware enforcing ``AccessRules`` and the body bound (module docstring)."""

    def __init__(self, app: ASGIApp, rules: AccessRules, max_body_bytes: int) -> None:
        self.app, self.rules, self.max_body_bytes = app, rules, max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        refusal = self.rules.refusal(
            scope["method"], scope["path"], headers.get("authorization")
        ) or self._oversized(headers.get("content-length"))
        if refusal is not None:
            # Answered without a call to receive, and the server closes the connection
            # after the answer instead of draining the body to keep it alive.
            if "content-length" in headers or "transfer-encoding" in headers:
                refusal = refusal.closing()
                if headers.get("expect", "").lower() != "100-continue":  # body under way
                    send = _lingering(send, receive)
            await refusal.response()(scope, receive, send)
            return
        bound = _BodyBound(receive, send, self.max_body_bytes, self._too_large)
        await self.app(scope, bound.receive, bound.send)

    def _oversized(self, content_length: str | None) -> ApiError | None:
        # The server has checked the header's syntax; digits only reach here.
        if content_length is not None and int(content_length) > self.max_body_bytes:
            return self._too_large()
        return None

    def _too_large(self) -> ApiError:
        reason = f"request bodies are limited to {self.max_body_bytes} bytes"
        return ApiError(413, "body_too_large", reason).closing()


class _BodyBound:
    """One request's body against the bound: ``receive`` raises the 413 once the body
    (e.g. chunked, whose size no header says) passes it; ``send`` then sends the answer
    lingering (``_lingering``) if the client is still sending."""

    def __init__(
        self, receive: Receive, send: Send, limit: int, too_large: Callable[[], ApiError]
    ) -> None:
        self._receive, self._send, self._limit, self._too_large = receive, send, limit, too_large
        self._seen = 0

    async def receive(self) -> Message:
        message = await self._receive()
        if message["type"] == "http.request":
            self._seen += len(message.get("body", b""))
            if self._seen > self._limit:
                if message.get("more_body", False):  # the client is still sending
                    self._send = _lingering(self._send, self._receive)
                raise self._too_large()
        return message

    async def send(self, message: Message) -> None:
        await self._send(message)


def _lingering(send: Send, receive: Receive) -> Send:
    """``send`` that holds the end of the answer: the answer's bytes go out, then what the
    client still sends is read and dropped (``LINGER_S``, ``LINGER_BYTES``, or until the
    body ends or the client leaves), then the answer ends and the server closes."""

    async def send_then_linger(message: Message) -> None:
        if message["type"] != "http.response.body" or message.get("more_body", False):
            await send(message)
            return
        await send({**message, "more_body": True})
        dropped = 0
        with anyio.move_on_after(LINGER_S):
            while dropped <= LINGER_BYTES:
                sent = await receive()
                if sent["type"] != "http.request" or not sent.get("more_body", False):
                    break
                dropped += len(sent.get("body", b""))
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    return send_then_linger


def _no_token(authorization: str | None) -> str:
    """Why a request carries no token: none sent, or an ``Authorization`` header of another
    form (the bare token, ``Basic``, an empty one), which says how to send it (never what
    the header held: it may be a secret)."""
    if authorization is None:
        return "missing bearer token"
    return "missing bearer token: the Authorization header is not 'Bearer <token>'"


def _bearer_token(authorization: str | None) -> bytes | None:
    if authorization is None:
        return None
    scheme, _, credentials = authorization.partition(" ")
    credentials = credentials.strip()
    if scheme.lower() != "bearer" or not credentials:
        return None
    # Starlette decodes header bytes as latin-1: encoding back gives the bytes sent.
    return credentials.encode("latin-1")


def _same(token: bytes, expected: bytes | None) -> bool:
    return expected is not None and hmac.compare_digest(token, expected)

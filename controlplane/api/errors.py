"""Errors of the REST API: one JSON shape for every failure, declared where it can happen.

Owns ``ApiError`` (what a route or the access guard raises), the bodies a client reads
(``ErrorBody``: ``{"error": code, "reason": text}``; ``FieldErrorBody`` adds the ``field``
at fault and the ``message`` saying what it must be), the exception handlers that give
validation errors, HTTP errors, Redis failures and bugs that shape, and ``documented``
(the error responses a route declares in its OpenAPI entry). No error leaves as plain
text, and an expected failure (Redis down, bad input) never logs a traceback. It must
never decide who may call a route (``controlplane.api.access``) or talk to Redis.
"""

from __future__ import annotations

import logging
import sys
from http import HTTPStatus
from typing import Any

import redis
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import compile_path

from agent.runtime.connection import RedisState, describe_redis_error, redis_state
from controlplane.api.field_messages import NOT_JSON, FieldProblem, field_problems
from controlplane.api.models import P_REUSE_MESSAGE
from controlplane.service.store_terms import PolicyLost

log = logging.getLogger(__name__)


class ErrorBody(BaseModel):
    """Every error response: a stable code and a sentence for a person."""

    error: str = Field(description="Stable machine-readable code, e.g. redis_unavailable")
    reason: str = Field(description="What went wrong, for a person")


class FieldErrorBody(ErrorBody):
    """A request that names a bad value: which field, and what it must be."""

    field: str = Field(description="The body field or path parameter at fault; 'body': all")
    message: str = Field(description=f"What that field must be, e.g. '{P_REUSE_MESSAGE}'")


class ApiError(StarletteHTTPException):
    """A failure a client can act on; leaves as ``ErrorBody`` with ``status``. An HTTP
    exception, so that FastAPI passes one raised while it reads a body through as is."""

    def __init__(
        self, status: int, error: str, reason: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(status_code=status, detail=reason, headers=dict(headers or {}))
        self.status, self.error, self.reason = status, error, reason

    def response(self) -> JSONResponse:
        body = ErrorBody(error=self.error, reason=self.reason)
        return JSONResponse(body.model_dump(), status_code=self.status, headers=self.headers)

    def closing(self) -> ApiError:
        """The same error, telling the server to close the connection after it."""
        headers = {**(self.headers or {}), "Connection": "close"}
        return ApiError(self.status, self.error, self.reason, headers)


class FieldError(ApiError):
    """Bad values in a request (422, ``FieldErrorBody`` naming the first; ``reason`` has
    up to five)."""

    def __init__(self, *problems: FieldProblem) -> None:
        reason = "; ".join(f"{p.field}: {p.message}" for p in problems[:5])
        super().__init__(422, problems[0].error, reason)
        self.problem = problems[0]

    def response(self) -> JSONResponse:
        p = self.problem
        body = FieldErrorBody(error=p.error, reason=self.reason, field=p.field, message=p.message)
        return JSONResponse(body.model_dump(), status_code=422)


_DESCRIPTIONS = {
    401: "No bearer token, or a wrong one (`WWW-Authenticate` says which)",
    403: "The read token was sent where the API token is needed",
    404: "The named thing does not exist",
    409: "The request conflicts with the controller's state",
    413: "The request body is larger than the API accepts",
    422: "A field of the request is invalid; `field` names it",
    503: "Redis is unavailable, out of memory or refusing, the stored policy is "
    "inconsistent, or Redis lost it and the leader is restoring it; `error` and `reason` "
    "say which",
}


def documented(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI ``responses`` entry for these error statuses of one route."""
    return {
        s: {"model": FieldErrorBody if s == 422 else ErrorBody, "description": _DESCRIPTIONS[s]}
        for s in statuses
    }


def install_error_handlers(app: FastAPI) -> None:
    """Give every failure the JSON error shape (module docstring)."""
    app.add_exception_handler(ApiError, _api_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _invalid_request)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _http_error)  # type: ignore[arg-type]
    app.add_exception_handler(redis.RedisError, _redis_error)  # type: ignore[arg-type]
    app.add_exception_handler(PolicyLost, _policy_lost)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, _internal_error)


async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
    return exc.response()


async def _invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
    return FieldError(*field_problems(exc.errors(), request)).response()


async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    if exc.status_code == 400 and exc.__cause__ is not None:
        # FastAPI's answer to a body it could not parse (not UTF-8, nested too deep for
        # the parser): the same 422 as any bad JSON.
        return FieldError(_unparsed(exc.__cause__)).response()
    headers = dict(exc.headers or {})
    reason = str(exc.detail)
    if exc.status_code == 404:
        reason = f"no route {request.url.path} (GET /openapi.json lists them)"
    if exc.status_code == 405:
        allowed = ", ".join(_allowed_methods(request))
        headers["Allow"] = allowed
        reason = f"{request.method} is not allowed on {request.url.path}; allowed: {allowed}"
    code = HTTPStatus(exc.status_code).phrase.lower().replace(" ", "_")
    return ApiError(exc.status_code, code, reason, headers).response()


def _unparsed(cause: BaseException) -> FieldProblem:
    """Why a body could not be read: ``NOT_JSON``, unless it is valid JSON holding an
    integer longer than Python reads (``sys.get_int_max_str_digits``)."""
    if isinstance(cause, ValueError) and "integer string conversion" in str(cause):
        limit = f"{sys.get_int_max_str_digits():,}"
        message = f"holds an integer of more than {limit} digits, which no field takes"
        return FieldProblem("invalid_value", NOT_JSON.field, message)
    return NOT_JSON


async def _policy_lost(_: Request, exc: PolicyLost) -> JSONResponse:
    return ApiError(503, "policy_restoring", str(exc)).response()


async def _redis_error(_: Request, exc: redis.RedisError) -> JSONResponse:
    # Expected while Redis is down: no traceback per request (the controller's own log
    # says when Redis goes away and comes back).
    log.debug("answered 503: %s", exc)
    return redis_unavailable(exc).response()


_REDIS_ERROR_CODES = {
    RedisState.UNREACHABLE: "redis_unavailable",
    RedisState.OUT_OF_MEMORY: "redis_out_of_memory",
}


def redis_unavailable(exc: redis.RedisError) -> ApiError:
    """The 503 of a Redis failure, named for what the operator has to fix, in the words
    the controller's log and readiness use (``agent.runtime.connection``)."""
    code = _REDIS_ERROR_CODES.get(redis_state(exc), "redis_error")
    return ApiError(503, code, describe_redis_error(exc))


async def _internal_error(_: Request, exc: Exception) -> JSONResponse:
    # A bug: the server logs its traceback once; the client gets JSON, not plain text.
    return ApiError(500, "internal_error", f"unexpected {type(exc).__name__}").response()


def _allowed_methods(request: Request) -> list[str]:
    """Every method any route offers on the request's path, from the OpenAPI document
    (FastAPI's own 405 names only the first route it matched)."""
    methods: set[str] = set()
    for template, operations in request.app.openapi()["paths"].items():
        if compile_path(template)[0].match(request.url.path):
            methods |= {m.upper() for m in operations}
    return sorted(methods | ({"HEAD"} if "GET" in methods else set()))

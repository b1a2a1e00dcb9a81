"""The REST API (FastAPI): read fitted policies and categories, override, roll back, refit.

Owns routes, request/response models, bearer-token checks on mutations and the JSON
error shape ``{"error": code, "reason": text}``. All state lives in the ``Controller``
(``controlplane.service.controller``); this module must never touch Redis keys itself.
"""

from __future__ import annotations

import secrets
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, RedirectResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    model_validator,
)
from pydantic.json_schema import SkipJsonSchema
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from agent.policy_document import PolicyDocument, PositiveFinite, Probability
from controlplane.service.controller import Controller, RefitOutcome
from controlplane.service.store import StoreError

API_DESCRIPTION = """
kvwise fits per-category reuse models (``F(t) = p_reuse * (1 - exp(-rate * t))`` and a
life window) from live block-access events and publishes them as immutable, strictly
increasing policy versions that every worker hot-reloads.

Mutations (``POST``, ``PUT``, ``DELETE``) need ``Authorization: Bearer <token>`` when the
controller runs with ``KVWISE_API_TOKEN``. Errors are JSON: ``{"error": ..., "reason": ...}``.
"""


class ApiError(Exception):
    def __init__(self, status: int, error: str, reason: str) -> None:
        super().__init__(reason)
        self.status, self.error, self.reason = status, error, reason


class ErrorBody(BaseModel):
    error: str
    reason: str


def _json_number(v: object) -> object:
    """JSON numbers only: pydantic's lax mode would also take "1" and true."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ValueError("expected a JSON number")
    return v


def _json_integer(v: object) -> object:
    """A JSON Schema integer: an int, or a float with no fraction (1.0)."""
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError("expected a JSON integer")
    return v


JsonInt = Annotated[int, BeforeValidator(_json_integer)]


class OverrideBody(BaseModel):
    """Any of the three parameters; the rest keep their fitted values."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"minProperties": 1})
    # Absent means "keep the fitted value"; an explicit null is an error, not absence.
    rate: Annotated[PositiveFinite, BeforeValidator(_json_number)] | SkipJsonSchema[None] = None
    p_reuse: Annotated[Probability, BeforeValidator(_json_number)] | SkipJsonSchema[None] = None
    life_s: Annotated[PositiveFinite, BeforeValidator(_json_number)] | SkipJsonSchema[None] = None

    @model_validator(mode="before")
    @classmethod
    def _no_nulls(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key, value in data.items():
                if value is None:
                    raise ValueError(f"{key}: expected a number, got null")
        return data


class RollbackBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: JsonInt = Field(ge=1, description="A kept version (GET /v1/policy/versions)")
    hold: StrictBool = Field(
        default=False, description="Stop automatic refits from publishing until POST /refit"
    )


class VersionOut(BaseModel):
    version: int
    created_at: float
    note: str
    categories: int


class RefitOut(BaseModel):
    published: bool
    version: int | None
    reason: str
    seconds: float


class HealthOut(BaseModel):
    status: str
    leader: bool = False
    reason: str = ""


_BEARER = HTTPBearer(auto_error=False)

ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorBody},
    401: {"model": ErrorBody},
    404: {"model": ErrorBody},
    409: {"model": ErrorBody},
    422: {"model": ErrorBody},
    503: {"model": ErrorBody},
}


def create_app(controller: Controller) -> FastAPI:
    app = FastAPI(
        title="kvwise controller",
        version="1",
        description=API_DESCRIPTION,
        responses=ERRORS,
    )
    token = controller.settings.api_token

    # Annotations are strings here (future import): the dependency must name a module global.
    def require_token(
        creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_BEARER)],
    ) -> None:
        if token is None:
            return
        if creds is None or not secrets.compare_digest(
            creds.credentials.encode(), token.get_secret_value().encode()
        ):
            raise ApiError(401, "unauthorized", "missing or wrong bearer token")

    auth = [Depends(require_token)]

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse({"error": exc.error, "reason": exc.reason}, status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        reason = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()[:5]
        )
        return JSONResponse({"error": "invalid_request", "reason": reason}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            # Starlette names only the first route on the path; RFC 9110 wants them all.
            headers["Allow"] = ", ".join(_allowed_methods(app, request))
        return JSONResponse(
            {"error": "http_error", "reason": str(exc.detail)},
            status_code=exc.status_code,
            headers=headers,
        )

    @app.get("/", include_in_schema=False)
    def root() -> RedirectResponse:
        return RedirectResponse("/docs")

    # --- policy ----------------------------------------------------------------------------
    @app.get("/v1/policy", response_model=PolicyDocument, tags=["policy"])
    def get_policy() -> PolicyDocument:
        """The current policy document: what every worker should be applying."""
        doc = controller.store.current()
        if doc is None:
            raise ApiError(404, "no_policy", "no policy version has been published yet")
        return doc

    @app.get("/v1/policy/versions", response_model=list[VersionOut], tags=["policy"])
    def list_versions() -> list[VersionOut]:
        """Kept versions, newest first."""
        return [VersionOut(**v.__dict__) for v in controller.store.versions()]

    @app.get("/v1/policy/versions/{version}", response_model=PolicyDocument, tags=["policy"])
    def get_version(version: int) -> PolicyDocument:
        doc = controller.store.get(version)
        if doc is None:
            raise ApiError(404, "unknown_version", f"version {version} is not kept")
        return doc

    @app.post("/v1/policy/refit", response_model=RefitOut, tags=["policy"], dependencies=auth)
    def refit() -> RefitOut:
        """Fit now and publish if the guard passes (also releases a rollback hold)."""
        if not controller.lease.is_leader:
            holder = controller.lease.holder_now() or "nobody"
            raise ApiError(409, "not_leader", f"this replica does not refit; leader: {holder}")
        return _refit_out(controller.refit(manual=True))

    @app.post(
        "/v1/policy/rollback", response_model=PolicyDocument, tags=["policy"], dependencies=auth
    )
    def rollback(body: RollbackBody) -> PolicyDocument:
        """Publish a new version with an earlier version's parameters."""
        try:
            return controller.store.rollback(body.version, hold=body.hold)
        except StoreError as exc:
            raise ApiError(404, "unknown_version", str(exc)) from None

    @app.get("/v1/policy/overrides", tags=["policy"])
    def list_overrides() -> dict[str, dict[str, float]]:
        return controller.store.overrides()

    @app.put(
        "/v1/policy/overrides/{category}",
        response_model=PolicyDocument,
        tags=["policy"],
        dependencies=auth,
    )
    def put_override(category: str, body: OverrideBody) -> PolicyDocument:
        """Pin any of ``rate``, ``p_reuse``, ``life_s`` for a category; publishes a version."""
        values = body.model_dump(exclude_none=True)
        if not values:
            raise ApiError(422, "invalid_request", "give at least one of rate, p_reuse, life_s")
        try:
            return controller.store.set_override(category, values)
        except StoreError as exc:
            raise ApiError(422, "invalid_request", str(exc)) from None
        except ValueError as exc:
            raise ApiError(422, "invalid_request", str(exc).splitlines()[0]) from None

    @app.delete(
        "/v1/policy/overrides/{category}",
        response_model=PolicyDocument,
        tags=["policy"],
        dependencies=auth,
    )
    def delete_override(category: str) -> PolicyDocument:
        try:
            return controller.store.delete_override(category)
        except StoreError as exc:
            raise ApiError(404, "no_override", str(exc)) from None

    # --- categories and agents -------------------------------------------------------------
    @app.get("/v1/categories", tags=["observe"])
    def list_categories() -> list[dict[str, Any]]:
        """Per category: samples, fitted and published parameters, fit quality."""
        return controller.categories()

    @app.get("/v1/categories/{name}", tags=["observe"])
    def get_category(name: str) -> dict[str, Any]:
        """One category with its empirical and fitted reuse-time CDF points."""
        detail = controller.category(name)
        if detail is None:
            raise ApiError(404, "unknown_category", f"category {name!r} has not been seen")
        return detail

    @app.get("/v1/agents", tags=["observe"])
    def list_agents() -> list[dict[str, Any]]:
        """Live agents (heartbeat not expired): the policy version each has in force
        (`applied_version`) and the one it received (`staged_version`), which an engine
        applies at its next call into the agent (an idle vLLM engine makes none)."""
        return [a.__dict__ for a in controller.agents()]

    # --- operations ------------------------------------------------------------------------
    @app.get("/healthz", response_model=HealthOut, tags=["ops"])
    def healthz() -> HealthOut:
        """Liveness: the process serves HTTP."""
        return HealthOut(status="ok", leader=controller.lease.is_leader)

    @app.get("/readyz", response_model=HealthOut, tags=["ops"])
    def readyz() -> JSONResponse:
        """Readiness: Redis answers and a policy version exists."""
        ok, reason = controller.ready()
        body = HealthOut(
            status="ok" if ok else "unavailable", leader=controller.lease.is_leader, reason=reason
        )
        return JSONResponse(body.model_dump(), status_code=200 if ok else 503)

    @app.get("/metrics", response_class=PlainTextResponse, tags=["ops"])
    def metrics() -> PlainTextResponse:
        controller.refresh_gauges()
        return PlainTextResponse(
            generate_latest(controller.metrics.registry), media_type=CONTENT_TYPE_LATEST
        )

    return app


def _allowed_methods(app: FastAPI, request: Request) -> list[str]:
    methods: set[str] = set()
    for route in app.router.routes:
        match, _ = route.matches(request.scope)
        if match != Match.NONE:
            methods |= set(getattr(route, "methods", None) or ())
    return sorted(methods)


def _refit_out(o: RefitOutcome) -> RefitOut:
    return RefitOut(published=o.published, version=o.version, reason=o.reason, seconds=o.seconds)

"""A stand-in controller for page tests of what a real one rarely does on cue: the
dashboard's own static files (``mount_ui``) beside REST answers a test sets, path by path
(a body, an HTTP status, a delay), counting the requests and the most in flight at once.
A read that names a category in its query is answered and counted by path and query
(``curve_path``).

``captured_answers`` takes every answer the page reads from a real controller on a real
Redis, so the bodies a test starts from have the API's own shapes; a test then changes
what it probes (a 503, a slow read, a shadow curve without a step). It must never stand
in for what a real controller can be made to do in a test (tests/e2e/test_dashboard.py).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import quote, urlencode

import redis
from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from agent.wire import Keys
from controlplane.api.ui import mount_ui
from controlplane.service.controller import Controller
from controlplane.traces.synth import synthesize
from tests.agent_stream import agent_batches
from tests.integration.controller_fixtures import (
    AUTH,
    TOKEN,
    live_settings,
    reuse_batch,
    running_controller,
    send,
)
from tests.loopback_server import serving
from tests.waiting import wait_until
from tests.wire_samples import agent_status

READ_PATHS = (
    "/healthz",
    "/readyz",
    "/openapi.json",
    "/v1/policy",
    "/v1/policy/versions",
    "/v1/policy/overrides",
    "/v1/policy/refit",
    "/v1/categories",
    "/v1/agents",
)
CATEGORY = "text_1"


def curve_path(name: str) -> str:
    """Where the page reads ``name``'s curve, as the stand-in answers and counts it."""
    return _with_query("/v1/category", [("name", name)])


def _with_query(path: str, params: list[tuple[str, str]]) -> str:
    """``path`` and its query parameters, percent-encoded one way however a request encoded
    them (``encodeURIComponent`` leaves ``!'()*`` as they are, ``quote`` does not)."""
    return f"{path}?{urlencode(params, quote_via=quote)}" if params else path


@dataclass
class Answer:
    """What the stand-in answers on one path."""

    body: Any
    status: int = 200
    delay_s: float = 0.0
    media_type: str = "application/json"
    """Any other: ``body`` is sent as it is (a proxy's HTML page)."""


@dataclass
class ScriptedApi:
    """The answers by path (and query: ``curve_path``; ``POST /v1/policy/refit`` for a
    method other than GET) and what was asked, counted the same way."""

    answers: dict[str, Answer]
    url: str = ""
    asked: Counter[str] = field(default_factory=Counter)
    in_flight: Counter[str] = field(default_factory=Counter)
    most_in_flight: Counter[str] = field(default_factory=Counter)

    def set(
        self,
        path: str,
        body: Any = None,
        status: int = 200,
        delay_s: float = 0.0,
        media_type: str = "application/json",
    ) -> None:
        """Answer ``path`` with ``body`` (its current body when None)."""
        kept = self.answers[path].body if body is None and path in self.answers else body
        self.answers[path] = Answer(kept, status, delay_s, media_type)

    async def serve(self, request: Request) -> Response:
        # A read goes by its path and query, any other method by "METHOD path".
        method = request.method
        path = _with_query(request.url.path, request.query_params.multi_items())
        path = path if method == "GET" else f"{method} {path}"
        self.asked[path] += 1
        self.in_flight[path] += 1
        self.most_in_flight[path] = max(self.most_in_flight[path], self.in_flight[path])
        try:
            answer = self.answers.get(path)
            if answer is None:
                return JSONResponse({"error": "not_found", "reason": path}, status_code=404)
            if answer.delay_s:
                await asyncio.sleep(answer.delay_s)
            if answer.media_type != "application/json":
                return Response(answer.body, answer.status, media_type=answer.media_type)
            return JSONResponse(answer.body, status_code=answer.status)
        finally:
            self.in_flight[path] -= 1


def captured_answers(redis_url: str, key_prefix: str) -> dict[str, Answer]:
    """Every read the page makes, as a real controller answers it: one fitted category
    (``CATEGORY``), one live worker and the shadow's curves of a worker's trace."""
    settings = live_settings(
        redis_url=redis_url, key_prefix=key_prefix, api_token=TOKEN, min_samples=20, shadow_rate=1.0
    )
    r = redis.Redis.from_url(redis_url)
    keys = Keys(key_prefix)
    with running_controller(settings) as rc:
        # The shadow first: its window ends at the newest event it saw, and the fit's
        # events (now) would leave the trace's (its own clock) out of it.
        _replay_in_the_shadow(rc.controller, r, keys)
        shadow = rc.client.get("/v1/shadow", headers=AUTH).json()
        t0 = time.time() - 60
        fit_events = reuse_batch("w0", 1, category=CATEGORY, n=400, rate=0.5, p=0.6, t0=t0, seed=1)
        send(r, keys, fit_events)
        wait_until(lambda: rc.controller.ingestor.counters.batches >= 1, what="the batch")
        assert rc.client.post("/v1/policy/refit", headers=AUTH).json()["published"]
        paths = (*READ_PATHS, curve_path(CATEGORY))
        answers = {p: Answer(rc.client.get(p, headers=AUTH).json()) for p in paths}
        return {**answers, "/v1/shadow": Answer(shadow)}


def _replay_in_the_shadow(controller: Controller, r: redis.Redis, keys: Keys) -> None:
    """Worker ``w1`` live, its trace replayed in the controller's shadow."""
    trace = synthesize("to-c", duration_s=120, qps=3, seed=5)
    capacity = max(50, trace.n_unique // 10)
    status = agent_status(id="w1", capacity=capacity, whole_requests=True, updated_at=time.time())
    r.set(keys.agent("w1"), status.to_json(), ex=60)
    shadow = controller.shadow.evaluator
    assert shadow is not None
    shadow.set_capacities({"w1": capacity}, {"w1": True})
    for batch in agent_batches(trace, capacity, worker="w1"):
        shadow.apply(batch)
    shadow.flush("w1")


@contextmanager
def scripted_api(answers: dict[str, Answer], port: int | None = None) -> Iterator[ScriptedApi]:
    """The stand-in served on ``port`` (a free loopback port when None) until the block
    ends."""
    api = ScriptedApi({path: replace(a) for path, a in answers.items()})
    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)
    mount_ui(app)
    app.add_route("/{path:path}", api.serve, methods=["GET", "PUT", "POST", "DELETE"])
    with serving(app, port, what="the stand-in") as url:
        api.url = url
        yield api

"""A small OpenAI-compatible completions server with a real prefix cache, for testing the
load generator over real HTTP (uvicorn on a loopback port, in a thread).

``/v1/completions`` takes token-id prompts and streams one chunk per output token, then a
usage chunk (``prompt_tokens_details.cached_tokens``) and ``[DONE]``, like vLLM. The cache
holds the hash chains of full ``block_size``-token blocks, LRU, ``capacity`` blocks; a
request reuses its longest cached prefix of blocks, at most ``len(prompt) - 1`` tokens (the
last prompt token is always computed). ``/metrics`` exports vLLM's two prefix-cache
counters. Prompts longer than ``max_len`` get vLLM's 400 error body. Every request body is
kept in ``bodies``; ``max_in_flight`` is the most requests served at once. With ``api_key``
set, ``/v1/`` answers 401 to a request without ``Authorization: Bearer <api_key>``, as
vLLM started with ``--api-key`` does (``/metrics`` stays open).
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.loopback_server import serving

MODEL = "toy-model"
Endpoint = Callable[[Request], Awaitable[Response]]


@dataclass
class ToyServer:
    block_size: int = 4
    capacity: int = 1000
    max_len: int = 4096
    token_delay_s: float = 0.002
    export_metrics: bool = True
    endless_line_bytes: int = 0
    """When set, every stream is one line of this many bytes that never ends."""
    api_key: str | None = None
    bodies: list[dict[str, Any]] = field(default_factory=list)
    hits: int = 0
    queries: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    cache: OrderedDict[tuple[int, ...], None] = field(default_factory=OrderedDict)
    url: str = ""

    def cached_tokens(self, prompt: list[int]) -> int:
        """Tokens of the longest cached prefix of full blocks; caches the prompt's blocks."""
        b = self.block_size
        full = (len(prompt) - 1) // b  # blocks that may be reused
        cached = 0
        for i in range(full):
            key = tuple(prompt[: (i + 1) * b])
            if key not in self.cache:
                break
            self.cache.move_to_end(key)
            cached += b
        for i in range(len(prompt) // b):
            self.cache[tuple(prompt[: (i + 1) * b])] = None
            self.cache.move_to_end(tuple(prompt[: (i + 1) * b]))
        while len(self.cache) > self.capacity:
            self.cache.popitem(last=False)
        return cached

    async def completions(self, request: Request) -> Response:
        body = await request.json()
        self.bodies.append(body)
        prompt = body["prompt"]
        if len(prompt) > self.max_len:
            message = f"prompt of {len(prompt)} tokens is longer than {self.max_len}"
            return JSONResponse(
                {"error": {"message": message, "type": "BadRequestError", "code": 400}}, 400
            )
        cached = self.cached_tokens(prompt)
        self.hits += cached
        self.queries += len(prompt)
        n = int(body["max_tokens"])
        return StreamingResponse(
            self._stream(len(prompt), cached, n), media_type="text/event-stream"
        )

    async def _stream(self, prompt_len: int, cached: int, n: int) -> AsyncIterator[bytes]:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.endless_line_bytes:
                yield b"data: "
                for _ in range(self.endless_line_bytes // 4096):
                    yield b"x" * 4096
                return
            for i in range(n):
                await asyncio.sleep(self.token_delay_s)
                choice = {"index": 0, "text": "", "finish_reason": "length" if i == n - 1 else None}
                yield _event({"object": "text_completion", "choices": [choice]})
            usage = {
                "prompt_tokens": prompt_len,
                "completion_tokens": n,
                "total_tokens": prompt_len + n,
                "prompt_tokens_details": {"cached_tokens": cached},
            }
            yield _event({"object": "text_completion", "choices": [], "usage": usage})
            yield b"data: [DONE]\n\n"
        finally:
            self.in_flight -= 1

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def metrics(self, request: Request) -> Response:
        if not self.export_metrics:
            return PlainTextResponse("not found", 404)
        lines = []
        for name, value in (("hits", self.hits), ("queries", self.queries)):
            lines += [
                f"# HELP vllm:prefix_cache_{name} Prefix cache {name} in tokens.",
                f"# TYPE vllm:prefix_cache_{name} counter",
                f'vllm:prefix_cache_{name}_total{{engine="0",model_name="{MODEL}"}} {value}.0',
            ]
        return PlainTextResponse("\n".join(lines) + "\n")

    def _keyed(self, endpoint: Endpoint) -> Endpoint:
        """``endpoint`` behind ``api_key`` (vLLM's answer to a missing or wrong key)."""

        async def keyed(request: Request) -> Response:
            sent = request.headers.get("Authorization")
            if self.api_key is not None and sent != f"Bearer {self.api_key}":
                return JSONResponse({"error": "Unauthorized"}, 401)
            return await endpoint(request)

        return keyed

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/completions", self._keyed(self.completions), methods=["POST"]),
                Route("/v1/models", self._keyed(self.models)),
                Route("/metrics", self.metrics),
            ]
        )


def _event(obj: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(obj)}\n\n".encode()


@contextmanager
def running_toy_server(server: ToyServer) -> Iterator[ToyServer]:
    with serving(server.app(), what="the toy server") as url:
        server.url = url
        yield server

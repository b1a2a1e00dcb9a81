"""Sending a planned run to a server: ``run_bench``.

Owns the clock of a run: each request leaves at its planned time unless ``concurrency``
requests are already in flight, in which case it (and every later one) waits for a free
slot, as a client with a bounded connection pool would (the wait is recorded as the gap
between ``scheduled_s`` and ``sent_s``). Each request has ``timeout_s`` in all. The server's
prefix-cache counters are read before the first request and after the last, so their
difference covers the run; a ``/metrics`` that cannot be read before stops the run before
anything is sent, one that cannot be read after, or counters that went down (a restart),
leave the run whole and say why (``counters_error``). It must never retry a request or
change the plan.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import httpx

from controlplane.loadgen.client import Completion, RequestResult, send_completion
from controlplane.loadgen.observe import (
    CacheCounters,
    ServerUnreachable,
    bearer_headers,
    cache_counters,
)
from controlplane.loadgen.plan import PlannedRequest
from controlplane.loadgen.prompts import TokenSpace


@dataclass(frozen=True)
class ServerOptions:
    """Where and how hard to send."""

    base_url: str
    """The server's root (``http://host:8000``); requests go to ``/v1/completions``."""
    model: str
    """The ``model`` of every request (a name the server serves)."""
    concurrency: int = 64
    """Requests in flight at most; a request due while all are taken waits for one."""
    timeout_s: float = 600.0
    """Time each request has in all, from its send to the end of its response (the wait
    for a free slot not counted)."""
    api_key: str | None = field(default=None, repr=False)
    """Sent as ``Authorization: Bearer`` with every request to the server (None: no
    ``Authorization``); never shown."""

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if not self.timeout_s > 0:
            raise ValueError(f"timeout must be > 0 s, got {self.timeout_s}")


@dataclass(frozen=True)
class BenchRun:
    """A finished run: one result per planned request, in send order."""

    results: list[RequestResult]
    started_at: float
    """Unix time of the run's start."""
    wall_s: float
    counters_before: CacheCounters | None
    counters_after: CacheCounters | None
    unread_after: str | None = None
    """Why the counters after the run could not be read (None: read, or not exported)."""

    @property
    def server_counters(self) -> CacheCounters | None:
        """The server's prefix-cache counters over the run (None if it exports none, or
        ``counters_error`` says why not)."""
        if self.counters_before is None or self.counters_after is None:
            return None
        return self.counters_after.since(self.counters_before)

    @property
    def counters_error(self) -> str | None:
        """Why the server's counters over the run are unknown though it exports them."""
        if self.unread_after is not None or self.counters_after is None:
            return self.unread_after
        if self.counters_before is not None and self.server_counters is None:
            return (
                f"the server's prefix-cache counters went down during the run (hits "
                f"{self.counters_before.hits:g} -> {self.counters_after.hits:g}, queries "
                f"{self.counters_before.queries:g} -> {self.counters_after.queries:g}): it "
                "restarted, so they do not cover the run"
            )
        return None


def run_bench(
    plan: Sequence[PlannedRequest],
    space: TokenSpace,
    server: ServerOptions,
    on_result: Callable[[RequestResult], None] | None = None,
) -> BenchRun:
    """Send ``plan`` to ``server``; ``on_result`` is called as each request ends."""
    with httpx.Client(timeout=30, headers=bearer_headers(server.api_key)) as sync:
        before = cache_counters(sync, server.base_url)
        started_at = time.time()
        start = time.perf_counter()
        results = asyncio.run(_send_all(plan, space, server, on_result))
        wall_s = time.perf_counter() - start
        try:
            after, error = cache_counters(sync, server.base_url), None
        except ServerUnreachable as exc:  # the run's results are kept whatever it says
            after, error = None, str(exc)
    return BenchRun(results, started_at, wall_s, before, after, error)


async def _send_all(
    plan: Sequence[PlannedRequest],
    space: TokenSpace,
    server: ServerOptions,
    on_result: Callable[[RequestResult], None] | None,
) -> list[RequestResult]:
    url = f"{server.base_url}/v1/completions"
    slots = asyncio.Semaphore(server.concurrency)
    limits = httpx.Limits(
        max_connections=server.concurrency, max_keepalive_connections=server.concurrency
    )
    results: list[RequestResult] = []
    tasks: list[asyncio.Task[None]] = []

    async def one(
        client: httpx.AsyncClient, request: PlannedRequest, result: RequestResult
    ) -> None:
        completion = Completion(
            server.model, request.prompt(space), request.max_tokens, request.category
        )
        try:
            async with asyncio.timeout(server.timeout_s):
                await send_completion(client, url, completion, result)
        except TimeoutError:
            result.error = f"timeout after {server.timeout_s:g} s"
        finally:
            slots.release()
            if on_result is not None:
                on_result(result)

    # The run's deadline is per request (asyncio.timeout); httpx's own timeouts only stop
    # a connection that hangs longer than that.
    timeout = httpx.Timeout(server.timeout_s + 5)
    headers = bearer_headers(server.api_key)
    async with httpx.AsyncClient(limits=limits, timeout=timeout, headers=headers) as client:
        start = time.perf_counter()
        for request in plan:
            delay = start + request.send_at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            await slots.acquire()
            result = RequestResult(
                index=request.index,
                category=request.category,
                scheduled_s=request.send_at,
                cut_blocks=request.cut_blocks,
            )
            result.sent_s = time.perf_counter() - start
            results.append(result)
            tasks.append(asyncio.create_task(one(client, request, result)))
        await asyncio.gather(*tasks)
    return results

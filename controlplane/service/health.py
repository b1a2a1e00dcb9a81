"""What the controller knows of Redis right now, told once per change.

Owns ``RedisHealth``: the state (``RedisState``: ok, unreachable, out of memory, ...) as the
last Redis call of any controller thread left it, with the reason and since when; a warning
(or, on recovery, an info line) is logged on each change of state and never per request;
the ``kvwise_redis_state`` gauge follows it. The service's public methods that touch Redis
are ``guarded``: a failure is recorded here, then raised as the ``redis.RedisError`` it was
(the API answers it as a JSON 503, by its kind), so the state is said once however many
requests fail. Every failure of the controller's clients comes here, so a read-only
refusal (a failover behind one address) drops their idle pooled connections here, once
for all its threads (``follow``; the agent's loops do the same, with the same code). It
must never retry or wait: callers own their loops.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Concatenate, ParamSpec, Protocol, TypeVar

import redis

from agent.runtime.connection import (
    RedisClient,
    RedisState,
    describe_redis_error,
    reconnect_after_read_only,
    redis_state,
    state_phrase,
)
from controlplane.service.metrics import ControllerMetrics

log = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True)
class RedisReport:
    """Redis as this controller last saw it."""

    state: RedisState
    reason: str
    """One line: the state and the server's (or the socket's) words; "" when ok."""
    since: float
    """Unix time of the last change of state."""

    @property
    def ok(self) -> bool:
        return self.state is RedisState.OK


class RedisHealth:
    """The controller's view of Redis, shared by all its threads."""

    def __init__(self, url: str, metrics: ControllerMetrics | None = None) -> None:
        self.url = url
        self._metrics = metrics
        self._lock = threading.Lock()
        self._report = RedisReport(RedisState.OK, "", time.time())
        self._last_failure = -SETTLE_S
        self._probe_down: str | None = None  # the last probe's failure, while unreachable
        self._clients: list[RedisClient] = []
        self._set_gauge(RedisState.OK)

    def follow(self, *clients: RedisClient) -> None:
        """Drop the idle pooled connections of ``clients`` whenever a call is refused as
        read-only (``reconnect_after_read_only``): the address now names a replica, and
        the next call of each connects to whatever it names now."""
        self._clients.extend(clients)

    @property
    def report(self) -> RedisReport:
        return self._report

    def failed(self, exc: BaseException) -> RedisReport:
        """Record a failed call; returns the report it leaves."""
        for client in self._clients:
            reconnect_after_read_only(client, exc)
        state = redis_state(exc)
        reason = describe_redis_error(exc)
        self._last_failure = time.monotonic()
        self._change(state, reason)
        return self._report

    def known_down(self) -> redis.ConnectionError | None:
        """While the last probe found Redis unreachable (the probe key shares the policy
        keys' shard), an error that says so in its words, for a caller that would rather
        answer now than wait out another timeout and its retries; None otherwise. The
        lease tick and readiness keep probing: the first probe that gets through ends it."""
        down = self._probe_down
        return None if down is None else redis.ConnectionError(down)

    def answered(self) -> None:
        """Record a call that succeeded. Reads still succeed on a Redis that refuses writes:
        out of memory and read-only stay until ``probe`` finds them over."""
        if not self._report.ok and self._report.state not in _STICKY:
            self._recovered()

    def probe(self, client: RedisClient, key: str) -> RedisReport:
        """Write one expiring ``key`` of ``PROBE_BYTES`` (a write that needs memory):
        the only sure way to learn whether Redis refuses writes (out of memory, a read-only
        replica) while reads still succeed. Records and returns the outcome."""
        try:
            client.set(key, _PROBE_VALUE, px=PROBE_TTL_MS)
            if self._report.state is RedisState.OUT_OF_MEMORY and _near_full(client):
                return self._report  # a write got through, but others will not: no flapping
        except redis.RedisError as exc:
            self.failed(exc)
            if redis_state(exc) is RedisState.UNREACHABLE:
                self._probe_down = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            return self._report
        self._probe_down = None
        if not self._report.ok:
            self._recovered()
        return self._report

    def _recovered(self) -> None:
        """Back to ok, once calls have succeeded for ``SETTLE_S`` with no failure between
        (on a cluster some shards answer while one fails over: no flapping)."""
        if time.monotonic() - self._last_failure >= SETTLE_S:
            self._change(RedisState.OK, "")

    def guard(self, fn: Callable[P, R]) -> Callable[P, R]:
        """``fn`` with its ``redis.RedisError`` recorded (then raised as it was)."""

        @functools.wraps(fn)
        def guarded(*args: P.args, **kwargs: P.kwargs) -> R:
            try:
                out = fn(*args, **kwargs)
            except redis.RedisError as exc:
                self.failed(exc)
                raise
            self.answered()
            return out

        return guarded

    def _change(self, state: RedisState, reason: str) -> None:
        with self._lock:
            old = self._report
            if old.state is state:
                return
            self._report = RedisReport(state, reason, time.time())
        self._set_gauge(state)
        if state is RedisState.OK:
            log.warning(
                "Redis at %s answers again (%s for %.0f s)",
                self.url,
                state_phrase(old.state),
                time.time() - old.since,
            )
        else:
            log.warning(
                "%s at %s; the API answers 503 and ingest waits until it recovers",
                reason,
                self.url,
            )

    def _set_gauge(self, state: RedisState) -> None:
        if self._metrics is None:
            return
        for s in RedisState:
            self._metrics.redis_state.labels(state=s.value).set(1 if s is state else 0)


_STICKY = frozenset({RedisState.OUT_OF_MEMORY, RedisState.READ_ONLY})
SETTLE_S = 2.0
"""Calls must succeed this long after the last failure before Redis is said to be back."""
PROBE_TTL_MS = 60_000
PROBE_BYTES = 64 << 10
"""Size of the probe write: Redis refuses a write that would pass maxmemory, so a tiny
probe still passes when the agents' batches (hundreds of KB) are refused."""
_PROBE_VALUE = b"\0" * PROBE_BYTES


def _near_full(client: RedisClient) -> bool:
    """Whether any node is within a few probe sizes of its maxmemory (INFO memory)."""
    info = client.info("memory")
    nodes = [info] if "used_memory" in info else [v for v in info.values() if isinstance(v, dict)]
    return any(
        0 < int(n.get("maxmemory", 0)) < int(n["used_memory"]) + 4 * PROBE_BYTES for n in nodes
    )


class HasHealth(Protocol):
    """Something whose Redis calls report to a ``RedisHealth`` (store, controller)."""

    @property
    def health(self) -> RedisHealth: ...


S = TypeVar("S", bound=HasHealth)


def guarded(fn: Callable[Concatenate[S, P], R]) -> Callable[Concatenate[S, P], R]:
    """Method decorator: a Redis failure inside is recorded in ``self.health`` (and raised
    as it was); a success marks Redis as answering."""

    def method(self: S, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.health.guard(fn)(self, *args, **kwargs)

    method.__doc__, method.__name__ = fn.__doc__, fn.__name__
    return method

"""The one Redis client factory of kvwise, and the one reading of what a Redis error means.

Owns how every process connects (``connect``: one pooled, thread-safe client per URL, with
explicit timeouts and retries, standalone or Redis Cluster, and optionally a switch that
gives its calls up when the process stops), the clear error for a URL that
is not a Redis URL (``RedisUrlError``), and ``RedisState``: whether an error means Redis is
unreachable, out of memory, read-only, loading or refusing our credentials, so that every
log line and readiness answer names the real cause. The agent's threads and the controller
both use it (the controller may import this module; it imports nothing of the controller).
It must never be called from an engine thread: every call through a client may wait on the
network.
"""

from __future__ import annotations

import copy
import re
import threading
from collections.abc import Callable
from enum import StrEnum
from typing import Any, Final, TypeAlias, TypeVar, cast
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.backoff import AbstractBackoff, ExponentialBackoff
from redis.cluster import RedisCluster
from redis.commands.core import Script
from redis.exceptions import RedisClusterException
from redis.retry import Retry

RedisClient: TypeAlias = redis.Redis | RedisCluster
"""What ``connect`` returns: a standalone client or a cluster client (same commands)."""

URL_SCHEMES: Final = ("redis://", "rediss://", "unix://")

GIVEN_UP: Final = "call given up: the process is stopping and Redis does not answer"
"""The error of a call made through a client whose ``give_up`` is set."""

T = TypeVar("T")

AGENT_CALL_RETRIES: Final = 1
"""Retries of one Redis call inside redis-py before an agent thread sees the error; one,
because every agent thread has its own outer loop (the next flush, poll or heartbeat), and
a hung server costs ``redis_timeout_s`` per attempt on that thread."""


class RedisUrlError(ValueError):
    """A Redis URL that cannot be used; the message says why in one line (no secrets)."""


class RedisState(StrEnum):
    """What a Redis failure means for kvwise."""

    OK = "ok"
    UNREACHABLE = "unreachable"
    OUT_OF_MEMORY = "out_of_memory"
    READ_ONLY = "read_only"
    LOADING = "loading"
    AUTH = "auth_refused"
    ERROR = "error"


_PHRASES: Final = {
    RedisState.OK: "redis answers",
    RedisState.UNREACHABLE: "redis unavailable",
    RedisState.OUT_OF_MEMORY: "redis out of memory (maxmemory reached: writes refused)",
    RedisState.READ_ONLY: "redis is a read-only replica (writes refused)",
    RedisState.LOADING: "redis is loading its dataset",
    RedisState.AUTH: "redis refused our credentials",
    RedisState.ERROR: "redis error",
}


_STATE_OF_ERROR: Final[tuple[tuple[tuple[type[BaseException], ...], RedisState], ...]] = (
    ((redis.exceptions.OutOfMemoryError,), RedisState.OUT_OF_MEMORY),
    ((redis.exceptions.ReadOnlyError,), RedisState.READ_ONLY),
    ((redis.exceptions.BusyLoadingError,), RedisState.LOADING),
    (
        (
            redis.exceptions.AuthenticationError,
            redis.exceptions.AuthorizationError,
            redis.exceptions.NoPermissionError,
        ),
        RedisState.AUTH,
    ),
    (
        (
            redis.ConnectionError,
            redis.TimeoutError,
            OSError,
            redis.exceptions.ClusterDownError,
            redis.exceptions.MasterDownError,
        ),
        RedisState.UNREACHABLE,
    ),
)


def redis_state(exc: BaseException) -> RedisState:
    """The state a Redis error reveals (``ERROR`` for one that says nothing of the server).
    A transaction aborted by a refused write (``EXECABORT ... OOM``) is out of memory too."""
    if "OOM command not allowed" in str(exc):
        return RedisState.OUT_OF_MEMORY
    for types, state in _STATE_OF_ERROR:
        if isinstance(exc, types):
            return state
    return RedisState.ERROR


def describe_redis_error(exc: BaseException) -> str:
    """One line naming the state and the server's words, e.g. ``redis out of memory (...):
    OOM command not allowed ...``."""
    detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return f"{_PHRASES[redis_state(exc)]}: {detail[:300]}"


def reconnect_after_read_only(client: RedisClient, exc: BaseException) -> None:
    """After a read-only refusal, drop ``client``'s idle pooled connections: the address
    now names a replica (a failover behind a Service or a DNS name), and redis-py
    reconnects only after connection errors, so every write would be refused on them until
    the process restarts. The next call connects to whatever the address names now. A
    cluster client follows failovers itself."""
    if redis_state(exc) is RedisState.READ_ONLY and isinstance(client, redis.Redis):
        client.connection_pool.disconnect(inuse_connections=False)


def state_phrase(state: RedisState) -> str:
    """The words for ``state`` used in logs and readiness reasons."""
    return _PHRASES[state]


def redact(url: str) -> str:
    """``url`` with any password replaced by ``***`` (for messages): the one before the
    host (up to the last ``@``, as the client reads it) and a ``password=`` query value.
    A URL too malformed to split shows its scheme only."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url.split("://", 1)[0] + "://***"
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        if ":" in userinfo:
            netloc = f"{userinfo.split(':', 1)[0]}:***@{host}"
    query = re.sub(r"(^|&)(password=)[^&]*", r"\1\2***", parts.query)
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def connect(
    url: str,
    *,
    timeout_s: float,
    retries: int,
    cluster: bool = False,
    health_check_s: int = 0,
    give_up: threading.Event | None = None,
) -> RedisClient:
    """A pooled client for ``url`` returning bytes; ``cluster`` for Redis Cluster (the URL
    names any one node; the client discovers the rest and follows MOVED/ASK and failovers).

    Each call is retried ``retries`` times with capped exponential backoff on connection
    errors and timeouts. Once ``give_up`` is set, calls fail at once (``redis.ConnectionError``,
    ``GIVEN_UP``) and none is retried: a call waiting on the socket then ends within its one
    attempt (``timeout_s``). Raises ``RedisUrlError`` for a URL that is not a Redis URL.
    """
    if not url.startswith(URL_SCHEMES):
        raise RedisUrlError(
            f"Redis URL {redact(url)!r} must start with {', '.join(URL_SCHEMES)} "
            "(e.g. redis://127.0.0.1:6379/0)"
        )
    backoff = ExponentialBackoff(cap=1.0, base=0.02)
    retry = Retry(backoff, retries) if give_up is None else _GivingUp(backoff, retries, give_up)
    try:
        if cluster:
            return cast(RedisCluster, _LazyCluster(url, timeout_s, retry))
        return redis.Redis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=retry,
            retry_on_error=[redis.ConnectionError, redis.TimeoutError],
            health_check_interval=health_check_s,
            # RESP2 and no CLIENT SETINFO: connecting costs no round trip before the
            # command, so a hung server costs one timeout per attempt, not three.
            protocol=2,
            driver_info=None,
        )
    except ValueError as exc:
        raise RedisUrlError(f"Redis URL {redact(url)!r} is malformed: {exc}") from None


class _GivingUp(Retry):
    """``Retry`` that makes no attempt once ``give_up`` is set, and retries no failure after.
    redis-py gives each connection a deep copy of its client's retry: the copies share
    ``give_up`` (an event cannot be copied, and a copy of it would never be set)."""

    def __init__(self, backoff: AbstractBackoff, retries: int, give_up: threading.Event):
        super().__init__(backoff, retries)
        self.give_up = give_up

    def __deepcopy__(self, memo: dict[int, Any]) -> _GivingUp:
        twin = _GivingUp(copy.deepcopy(self._backoff, memo), self._retries, self.give_up)
        twin._supported_errors = self._supported_errors
        return twin

    def call_with_retry(
        self,
        do: Callable[[], T],
        fail: Callable[..., Any],
        is_retryable: Callable[[Exception], bool] | None = None,
        with_failure_count: bool = False,
    ) -> T:
        if self.give_up.is_set():
            raise redis.ConnectionError(GIVEN_UP)

        def retryable(error: Exception) -> bool:
            return not self.give_up.is_set() and (is_retryable is None or is_retryable(error))

        return super().call_with_retry(do, fail, retryable, with_failure_count)


class _LazyCluster:
    """A cluster client made on first use. redis-py's ``RedisCluster`` connects when it is
    made (to learn the slots) and raises if no node answers; made here instead from the
    first call of a background thread, a cluster that is down at start is a failed call
    (retried with backoff), never a process that cannot start. Every attribute is the real
    client's."""

    def __init__(self, url: str, timeout_s: float, retry: Retry) -> None:
        from redis.connection import parse_url

        parse_url(url)  # type: ignore[no-untyped-call]  # a malformed URL fails now (ValueError), not at the first call
        self._url = url
        self._kwargs: dict[str, Any] = {
            "socket_timeout": timeout_s,
            "socket_connect_timeout": timeout_s,
            "retry": retry,
            "protocol": 2,
            "driver_info": None,
        }
        self._client: RedisCluster | None = None
        self._lock = threading.Lock()

    def _get(self) -> RedisCluster:
        with self._lock:
            if self._client is None:
                try:
                    self._client = RedisCluster.from_url(self._url, **self._kwargs)
                except RedisClusterException as exc:
                    where = redact(self._url)
                    raise redis.ConnectionError(f"Redis Cluster at {where}: {exc}") from exc
            return self._client

    def register_script(self, script: str) -> Script:
        """A Lua script run through this client, made without connecting: the controller
        registers its scripts as it starts, and a cluster down then was a traceback at
        start. Given as bytes, its SHA needs no encoder of the real client."""
        return Script(cast(RedisCluster, self), script.encode())

    def close(self) -> None:
        if self._client is not None:
            self._client.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._get(), name)

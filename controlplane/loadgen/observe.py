"""What the server and the kvwise controller say about themselves, read over HTTP.

Owns finding the model a server serves (``/v1/models``), reading its prefix-cache counters
from its Prometheus ``/metrics`` (vLLM's ``vllm:prefix_cache_hits_total`` and
``..._queries_total``, in tokens, summed over engines), and the controller's view of the
kvwise agents (``/v1/policy`` and ``/v1/agents``). A server that exports no such counters
yields ``None``, never an error: the generator works against any OpenAI-compatible server.
Every answer is read in chunks up to a bound (``MAX_METRICS_BYTES``, ``MAX_JSON_BYTES``);
one over it is an error naming its URL (``AnswerTooLarge``), never held whole. Answers are
asked for uncompressed (``Accept-Encoding: identity``) and one compressed anyway is
refused: a chunk of gzip inflates a thousandfold before any bound can see it. An answer
must end within ``ANSWER_DEADLINE_S`` in all (the client's timeout bounds each read only,
so a server trickling bytes would hold the run for ever); the check runs as each chunk
arrives, so it stops at most one read timeout past the deadline. A service that wants a
token is given one by the caller's client (``bearer_headers``); an answer other than 200
is an ``HttpStatus`` carrying the URL and status, so the caller can say which token to
give. It must never write to either service, nor put a token in a message.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
from prometheus_client.parser import text_string_to_metric_families

PREFIX_CACHE_COUNTERS = {
    "hits": "vllm:prefix_cache_hits_total",
    "queries": "vllm:prefix_cache_queries_total",
}
"""Sample names of the server's prefix-cache counters (tokens), by role."""
MAX_METRICS_BYTES = 16 << 20
"""Bytes of ``/metrics`` read at most (vLLM's is tens of KiB)."""
MAX_JSON_BYTES = 16 << 20
"""Bytes of a JSON answer (``/v1/models``, the controller's) read at most."""
ANSWER_DEADLINE_S = 30.0
"""Seconds one answer may take in all, from the request to its last byte."""


class ServerUnreachable(RuntimeError):
    """The server (or controller) did not answer as expected; the message says how."""


class HttpStatus(ServerUnreachable):
    """A JSON answer with a status other than 200 (``status``, from ``url``)."""

    def __init__(self, url: str, status: int) -> None:
        super().__init__(f"{url} answered HTTP {status}")
        self.url, self.status = url, status


class AnswerTooLarge(ServerUnreachable):
    """An answer went on past its bound (bytes, or ``ANSWER_DEADLINE_S``); the message
    names the URL and the bound."""


@dataclass(frozen=True)
class CacheCounters:
    """Prefix-cache tokens looked up (``queries``) and found cached (``hits``)."""

    hits: float
    queries: float

    def since(self, before: CacheCounters) -> CacheCounters | None:
        """What was counted from ``before`` to these; None when a counter went down (the
        server restarted and counted from 0 again: the difference means nothing)."""
        if self.hits < before.hits or self.queries < before.queries:
            return None
        return CacheCounters(self.hits - before.hits, self.queries - before.queries)

    @property
    def hit_ratio(self) -> float | None:
        return self.hits / self.queries if self.queries > 0 else None


def bearer_headers(token: str | None) -> dict[str, str]:
    """The headers that send ``token`` as a bearer token (none when it is None)."""
    return {} if token is None else {"Authorization": f"Bearer {token}"}


def served_model(client: httpx.Client, base_url: str) -> str:
    """The first model id ``/v1/models`` lists."""
    url = f"{base_url}/v1/models"
    body = _get_json(client, url)
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list) or not data or not isinstance(data[0], dict):
        raise ServerUnreachable(f"{url} lists no model; pass --model")
    return str(data[0].get("id"))


def cache_counters(client: httpx.Client, base_url: str) -> CacheCounters | None:
    """The server's prefix-cache counters now, or None if ``/metrics`` has none."""
    try:
        status, body = _get_bounded(client, f"{base_url}/metrics", MAX_METRICS_BYTES)
    except AnswerTooLarge:
        raise
    except ServerUnreachable:
        return None
    if status != 200:
        return None
    totals = dict.fromkeys(PREFIX_CACHE_COUNTERS.values(), 0.0)
    seen = set()
    try:
        for family in text_string_to_metric_families(body.decode(errors="replace")):
            for sample in family.samples:
                if sample.name in totals:
                    totals[sample.name] += sample.value
                    seen.add(sample.name)
    except ValueError:
        return None  # not Prometheus text
    if len(seen) < len(totals):
        return None
    return CacheCounters(
        hits=totals[PREFIX_CACHE_COUNTERS["hits"]],
        queries=totals[PREFIX_CACHE_COUNTERS["queries"]],
    )


def kvwise_state(client: httpx.Client, controller_url: str) -> dict[str, Any]:
    """The controller's current policy version and each live agent's versions."""
    policy = _get_json(client, f"{controller_url}/v1/policy")
    agents = _get_json(client, f"{controller_url}/v1/agents")
    if not isinstance(policy, dict) or not isinstance(agents, list):
        raise ServerUnreachable(f"{controller_url} does not answer as a kvwise controller")
    keep = ("id", "engine", "applied_version", "staged_version", "hit_ratio", "events_dropped")
    return {
        "policy_version": policy.get("version"),
        "agents": [{k: a.get(k) for k in keep} for a in agents if isinstance(a, dict)],
    }


def _get_json(client: httpx.Client, url: str) -> Any:
    status, body = _get_bounded(client, url, MAX_JSON_BYTES)
    if status != 200:
        raise HttpStatus(url, status)
    try:
        return orjson.loads(body)
    except ValueError:
        raise ServerUnreachable(f"{url} did not answer JSON") from None


def _get_bounded(client: httpx.Client, url: str, limit: int) -> tuple[int, bytes]:
    """The status of ``GET url`` and, when it is 200, its body, read in chunks: a body
    over ``limit`` bytes, or past the deadline, raises ``AnswerTooLarge`` as soon as it
    passes the bound; a compressed one, ``ServerUnreachable`` (module docstring)."""
    deadline = time.monotonic() + ANSWER_DEADLINE_S
    try:
        with client.stream("GET", url, headers={"Accept-Encoding": "identity"}) as response:
            if response.status_code != 200:
                return response.status_code, b""
            encoding = response.headers.get("Content-Encoding", "identity").lower()
            if encoding != "identity":
                raise ServerUnreachable(f"{url} answered compressed ({encoding}), unasked")
            body = bytearray()
            for part in response.iter_raw():
                body += part
                if len(body) > limit:
                    raise AnswerTooLarge(f"{url} answered more than {limit:,} bytes")
                if time.monotonic() > deadline:
                    raise AnswerTooLarge(
                        f"{url} did not finish answering within {ANSWER_DEADLINE_S:g} s"
                    )
            return 200, bytes(body)
    except httpx.HTTPError as exc:
        raise ServerUnreachable(f"cannot reach {url}: {exc}") from None

"""What the server and the kvwise controller say about themselves, read over HTTP.

Owns finding the model a server serves (``/v1/models``), reading its prefix-cache counters
from its Prometheus ``/metrics`` (vLLM's ``vllm:prefix_cache_hits_total`` and
``..._queries_total``, in tokens, summed over engines), and the controller's view of the
kvwise agents (``/v1/policy`` and ``/v1/agents``). A server that exports no such counters
yields ``None``, never an error: the generator works against any OpenAI-compatible server.
It must never write to either service.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

PREFIX_CACHE_COUNTERS = {
    "hits": "vllm:prefix_cache_hits_total",
    "queries": "vllm:prefix_cache_queries_total",
}
"""Sample names of the server's prefix-cache counters (tokens), by role."""
MAX_METRICS_BYTES = 16 << 20


class ServerUnreachable(RuntimeError):
    """The server (or controller) did not answer as expected; the message says how."""


@dataclass(frozen=True)
class CacheCounters:
    """Prefix-cache tokens looked up (``queries``) and found cached (``hits``)."""

    hits: float
    queries: float

    def since(self, before: CacheCounters) -> CacheCounters:
        return CacheCounters(self.hits - before.hits, self.queries - before.queries)

    @property
    def hit_ratio(self) -> float | None:
        return self.hits / self.queries if self.queries > 0 else None


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
        response = client.get(f"{base_url}/metrics")
    except httpx.HTTPError:
        return None
    if response.status_code != 200 or len(response.content) > MAX_METRICS_BYTES:
        return None
    totals = dict.fromkeys(PREFIX_CACHE_COUNTERS.values(), 0.0)
    seen = set()
    try:
        for family in text_string_to_metric_families(response.text):
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
    try:
        response = client.get(url)
    except httpx.HTTPError as exc:
        raise ServerUnreachable(f"cannot reach {url}: {exc}") from None
    if response.status_code != 200:
        raise ServerUnreachable(f"{url} answered HTTP {response.status_code}")
    try:
        return response.json()
    except ValueError:
        raise ServerUnreachable(f"{url} did not answer JSON") from None

"""How requests and files reach the chart's pods: the workers' Service routing, the Redis
TLS files a non-root engine must read, a controller Service opened outside the cluster
under the API NetworkPolicy, and the Redis memory headroom the docs and example give.

Every case renders the chart with Helm's Go SDK (helm_support); nothing here needs a
cluster.
"""

from __future__ import annotations

import pytest

from tests.integration import helm_support as hs

WORKERS = {"enabled": True, "model": {"name": "m"}}


# --- the workers' Service ---------------------------------------------------------------------
def test_the_worker_service_spreads_requests_by_default() -> None:
    spec = hs.render(hs.chart(), {"workers": WORKERS}).component("Service", "worker")["spec"]
    assert spec.get("sessionAffinity", "None") == "None"
    assert "sessionAffinityConfig" not in spec


@pytest.mark.parametrize("timeout", [60, 10800, 86400])
def test_client_ip_affinity_keeps_a_client_on_one_worker(timeout: int) -> None:
    """Each replica's prefix cache helps only the requests routed to it: ClientIP affinity
    keeps a client address on one replica for the timeout Kubernetes takes (1 to 86400 s)."""
    service = {"sessionAffinity": "ClientIP", "sessionAffinityTimeoutSeconds": timeout}
    values = {"workers": {**WORKERS, "replicaCount": 2, "service": service}}
    spec = hs.render(hs.chart(), values).component("Service", "worker")["spec"]
    assert spec["sessionAffinity"] == "ClientIP"
    assert spec["sessionAffinityConfig"] == {"clientIP": {"timeoutSeconds": timeout}}

"""How requests and files reach the chart's pods: the workers' Service routing, the Redis
TLS files a non-root engine must read, a controller Service opened outside the cluster
under the API NetworkPolicy, and the Redis memory headroom the docs and example give.

Every case renders the chart with Helm's Go SDK (helm_support); nothing here needs a
cluster.
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import redis
import yaml

from tests.integration import helm_support as hs
from tests.integration.test_helm_chart import K8S_VERSION
from tests.waiting import wait_until

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
    service = hs.render(hs.chart(), values).component("Service", "worker")
    kubernetes_validate.validate(service, K8S_VERSION, strict=True)
    spec = service["spec"]
    assert spec["sessionAffinity"] == "ClientIP"
    assert spec["sessionAffinityConfig"] == {"clientIP": {"timeoutSeconds": timeout}}


# --- the external Redis's TLS files -----------------------------------------------------------
TLS = hs.case_values("tls")["redis"]


def reads_tls(workload: hs.Manifest, name: str, image_ids: tuple[int, int]) -> bool:
    """Whether container ``name`` can read the files of the TLS volume, as the kubelet lays
    them out: owned by root and by the pod's fsGroup (root's group without one), with the
    volume's mode. ``image_ids`` stand for the image's user and group where the security
    contexts name none."""
    spec = hs.pod_spec(workload)
    (volume,) = [v["secret"] for v in spec["volumes"] if v["name"] == "redis-tls"]
    mode = volume.get("defaultMode", 0o644)
    pod, ctr = (
        spec.get("securityContext", {}),
        hs.container(workload, name).get("securityContext", {}),
    )
    uid = ctr.get("runAsUser", pod.get("runAsUser", image_ids[0]))
    gid = ctr.get("runAsGroup", pod.get("runAsGroup", image_ids[1]))
    groups = {gid, *pod.get("supplementalGroups", [])}
    owner_group = pod.get("fsGroup", 0)
    if "fsGroup" in pod:
        groups.add(pod["fsGroup"])
    return bool(uid == 0 or (owner_group in groups and mode & 0o040) or mode & 0o004)


NON_ROOT = [
    pytest.param({"containerSecurityContext": {"runAsUser": 1000}}, id="container-uid"),
    pytest.param({"podSecurityContext": {"runAsUser": 1000, "runAsGroup": 1000}}, id="pod-uid"),
    pytest.param({"podSecurityContext": {"runAsNonRoot": True}}, id="image-user-non-root"),
]


@pytest.mark.parametrize("given", NON_ROOT)
def test_a_non_root_worker_without_an_fs_group_is_refused_with_external_tls(
    given: dict[str, Any],
) -> None:
    """The CA is mounted 0440: a worker running as another user than root, with no fsGroup,
    could not read it and would fail every Redis connection; the install says what to set."""
    values = {"redis": TLS, "workers": {**WORKERS, **given}}
    with pytest.raises(helm.HelmError) as err:
        hs.render(hs.chart(), values)
    assert "set workers.podSecurityContext.fsGroup" in str(err.value)


@pytest.mark.parametrize("given", NON_ROOT)
def test_a_non_root_worker_with_an_fs_group_reads_the_tls_files(given: dict[str, Any]) -> None:
    pod = {**given.get("podSecurityContext", {}), "fsGroup": 2000}
    values = {"redis": TLS, "workers": {**WORKERS, **given, "podSecurityContext": pod}}
    deploy = hs.render(hs.chart(), values).component("Deployment", "worker")
    kubernetes_validate.validate(deploy, K8S_VERSION, strict=True)
    assert reads_tls(deploy, "vllm", image_ids=(1000, 1000))


@pytest.mark.parametrize(
    "workers",
    [
        pytest.param({}, id="default"),
        pytest.param({"podSecurityContext": {"runAsUser": 0}}, id="root"),
        pytest.param({"podSecurityContext": {"runAsUser": 1000, "runAsGroup": 0}}, id="group-0"),
    ],
)
def test_every_pod_mounting_the_tls_files_can_read_them(workers: dict[str, Any]) -> None:
    """The controller (fsGroup 10001 by default) and a worker running as root or in group 0
    read the files; the default worker runs as its image's user, root for the engines."""
    r = hs.render(hs.chart(), {"redis": TLS, "workers": {**WORKERS, **workers}})
    assert reads_tls(r.component("Deployment", "controller"), "controller", (10001, 10001))
    assert reads_tls(r.component("Deployment", "worker"), "vllm", image_ids=(0, 0))


def test_a_controller_without_its_fs_group_is_refused_with_external_tls() -> None:
    values = {"redis": TLS, "controller": {"podSecurityContext": {"fsGroup": None}}}
    with pytest.raises(helm.HelmError) as err:
        hs.render(hs.chart(), values)
    assert "set controller.podSecurityContext.fsGroup" in str(err.value)


# --- the controller's Service opened outside the cluster --------------------------------------
OUTSIDE = "requests from outside the cluster"


@pytest.mark.parametrize("kind", ["NodePort", "LoadBalancer"])
def test_an_api_opened_outside_the_cluster_under_the_policy_is_warned_of(kind: str) -> None:
    """Outside traffic has no pod or namespace: the default API policy, pod selectors only,
    drops it with no error anywhere; the NOTES say so and what to change."""
    r = hs.render(hs.chart(), {"controller": {"service": {"type": kind}}})
    policy = r.component("NetworkPolicy", "controller")
    peers = [p for rule in policy["spec"]["ingress"] for p in rule["from"]]
    assert peers and not any("ipBlock" in p for p in peers)
    assert r.component("Service", "controller")["spec"]["type"] == kind
    assert f"WARNING: controller.service.type is {kind}" in r.notes
    assert OUTSIDE in r.notes
    assert "ipBlock in networkPolicy.controller.allowedClients" in r.notes


@pytest.mark.parametrize(
    "values",
    [
        pytest.param({}, id="cluster-ip"),
        pytest.param(
            {"controller": {"service": {"type": "NodePort"}}, "networkPolicy": {"enabled": False}},
            id="no-policy",
        ),
        pytest.param(
            {
                "controller": {"service": {"type": "LoadBalancer"}},
                "networkPolicy": {
                    "controller": {"allowedClients": [{"ipBlock": {"cidr": "10.0.0.0/8"}}]}
                },
            },
            id="ip-block-admitted",
        ),
        pytest.param(
            {"workers": {**WORKERS, "service": {"type": "NodePort"}}}, id="workers-no-policy"
        ),
    ],
)
def test_no_warning_where_outside_traffic_gets_in(values: dict[str, Any]) -> None:
    assert OUTSIDE not in hs.render(hs.chart(), values).notes


# --- the in-chart Redis's memory headroom -----------------------------------------------------
_REDIS_UNITS = {"": 1, "k": 1000, "kb": 1024, "m": 10**6, "mb": 1024**2, "g": 10**9, "gb": 1024**3}
_K8S_UNITS = {"": 1, "k": 1000, "M": 10**6, "G": 10**9, "Ki": 1024, "Mi": 1024**2, "Gi": 1024**3}


def redis_bytes(text: str) -> int:
    """A redis-server memory argument (``1gb`` is 1024**3 bytes, ``1g`` 10**9)."""
    match = re.fullmatch(r"(\d+)([a-z]*)", text.strip().lower())
    assert match, text
    return int(match.group(1)) * _REDIS_UNITS[match.group(2)]


def k8s_bytes(text: str) -> int:
    match = re.fullmatch(r"(\d+)([A-Za-z]*)", str(text))
    assert match, text
    return int(match.group(1)) * _K8S_UNITS[match.group(2)]


def maxmemory(args: list[str]) -> str | None:
    words = [w for a in args for w in a.split()]
    return words[words.index("--maxmemory") + 1] if "--maxmemory" in words else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server")
def test_the_chart_redis_forks_to_persist(tmp_path: Path) -> None:
    """The premise of the headroom: started with the rendered arguments, Redis keeps an
    append-only file and its default snapshot rules, so it forks for both (copy-on-write
    pages that count against the container's memory limit)."""
    statefulset = hs.rendered("default").component("StatefulSet", "redis")
    args = hs.container(statefulset, "redis")["args"]
    port, password = _free_port(), "pw"
    given = {"--port": str(port), "--dir": str(tmp_path), "--requirepass": password}
    args = [given.get(prev, a) for prev, a in zip(["", *args[:-1]], args, strict=True)]
    server = subprocess.Popen(["redis-server", *args], stdout=subprocess.DEVNULL)
    try:
        client = redis.Redis(port=port, password=password, decode_responses=True)
        wait_until(lambda: _pings(client), timeout=10)
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        assert client.config_get("save")["save"] != ""  # snapshots (BGSAVE) as well
    finally:
        server.terminate()
        server.wait(10)


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False


@pytest.mark.parametrize("case", hs.CASES)
def test_a_redis_memory_limit_leaves_room_for_a_fork(case: str) -> None:
    """A fork can copy most of a dataset that the streams keep writing: the value sets the
    chart ships keep maxmemory at most half of the memory limit."""
    r = hs.rendered(case)
    if not r.values["redis"]["enabled"]:
        return
    redis_ctr = hs.container(r.component("StatefulSet", "redis"), "redis")
    limit = redis_ctr.get("resources", {}).get("limits", {}).get("memory")
    if limit is None:
        return
    given = maxmemory(redis_ctr["args"])
    assert given is not None
    assert redis_bytes(given) <= k8s_bytes(limit) // 2, (given, limit)


def test_the_install_refusal_and_the_docs_advise_half_the_limit() -> None:
    with pytest.raises(helm.HelmError) as err:
        hs.render(hs.chart(), {"redis": {"resources": {"limits": {"memory": "2Gi"}}}})
    example = re.search(r'\["--maxmemory", "(\w+)"\] for (\w+)', str(err.value).replace("\\", ""))
    assert example is not None, str(err.value)
    assert redis_bytes(example.group(1)) <= k8s_bytes(example.group(2)) // 2
    sizing = hs.DEPLOY_DOC.read_text().split("## Sizing", 1)[1].split("\n## ", 1)[0]
    advice = re.search(r'"--maxmemory", "<about ([^>]*)>"', " ".join(sizing.split()))
    assert advice is not None
    assert advice.group(1) == "half the limit"


def test_the_docs_fs_group_example_lets_a_non_root_engine_read_the_tls_files() -> None:
    doc = hs.DEPLOY_DOC.read_text().split("**TLS files and non-root engines.**", 1)[1]
    block = re.search(r"```yaml\n(.*?)```", doc, re.S)
    assert block is not None
    example = yaml.safe_load(block.group(1))["workers"]
    example["containerSecurityContext"] = {"runAsUser": 1000, "runAsGroup": 1000}
    values = {"redis": TLS, "workers": {**WORKERS, **example}}
    deploy = hs.render(hs.chart(), values).component("Deployment", "worker")
    kubernetes_validate.validate(deploy, K8S_VERSION, strict=True)
    assert reads_tls(deploy, "vllm", image_ids=(1000, 1000))

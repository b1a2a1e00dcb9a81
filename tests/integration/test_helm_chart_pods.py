"""The pods the Helm chart renders: every setting reaches its process, credentials resolve,
probes, hardening, selectors, and the ``helm test`` check run against a real controller.

Each container's environment is resolved as the kubelet would (ConfigMap, Secrets, the pod
name, ``$(VAR)`` expansion) and loaded into the real settings classes, so a value the
process would reject or misread fails here. Manifests come from helm_support (Helm's Go SDK).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import redis
from pydantic import SecretStr

from agent.setting_names import unread_variables
from agent.settings import AgentSettings
from controlplane.service.settings import ControllerSettings
from tests.integration import helm_support as hs
from tests.integration.helm_support import (
    CASES,
    FULLNAME,
    NAMESPACE,
    POD,
    POD_ENV_FIELDS,
    RELEASE,
    camel,
    env_name,
    snake,
)
from tests.waiting import wait_until


def controller_env(
    r: hs.Rendered, monkeypatch: pytest.MonkeyPatch
) -> tuple[dict[str, str], ControllerSettings]:
    ctr = hs.container(r.component("Deployment", "controller"), "controller")
    env = hs.resolve_env(r, ctr, pod_name=POD, secrets=hs.all_secrets(r))
    return env, hs.load_settings(ControllerSettings, env, monkeypatch)


@pytest.mark.parametrize("case", CASES)
def test_configmap_holds_every_controller_setting_but_the_per_pod_ones(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    r = hs.rendered(case)
    config = r.values["controller"]["config"]
    cm = r.get("ConfigMap", f"{FULLNAME}-controller")
    # Helm drops null values when it merges, so an unset optional setting is absent here
    # (test_controller_values_mirror_controller_settings_one_to_one checks values.yaml).
    unset_in_values = {
        env_name(f) for f in ControllerSettings.model_fields if config.get(camel(f)) is None
    }
    expected = {
        env_name(f) for f in ControllerSettings.model_fields if f not in POD_ENV_FIELDS
    } - unset_in_values
    assert set(cm["data"]) == expected
    assert env_name("api_token") not in cm["data"] and env_name("redis_url") not in cm["data"]

    env, settings = controller_env(r, monkeypatch)
    # Every setting reaches the process: the ConfigMap's, and the per-pod ones from env.
    set_in_pod = {k for k in env if k.startswith("KVWISE_")}
    assert unread_variables(env) == []  # `kvwise controller` warns of none
    unset = {env_name(f) for f in ControllerSettings.model_fields} - set_in_pod
    auth = r.values["controller"]["auth"]
    token_off = set() if auth["enabled"] else {env_name("api_token")}
    token_off |= set() if auth["readToken"]["enabled"] else {env_name("api_read_token")}
    assert unset == (unset_in_values - {env_name(f) for f in POD_ENV_FIELDS}) | token_off
    for key, value in config.items():
        assert getattr(settings, snake(key)) == value, key
    assert settings.consumer_name == POD
    if auth["readToken"]["enabled"]:
        assert isinstance(settings.api_read_token, SecretStr)
        assert re.fullmatch(r"[A-Za-z0-9]{32}", settings.api_read_token.get_secret_value())
    if auth["enabled"]:
        assert isinstance(settings.api_token, SecretStr)
        token = settings.api_token.get_secret_value()
        if auth["existingSecret"]:
            assert (
                token
                == hs.existing_secrets(r.values)[
                    (auth["existingSecret"], auth["existingSecretKey"])
                ]
            )
        else:  # generated: 32 letters and digits
            assert re.fullmatch(r"[A-Za-z0-9]{32}", token)


def _nullable_config_keys() -> list[str]:
    schema = json.loads((hs.CHART / "values.schema.json").read_text())
    config = schema["properties"]["controller"]["properties"]["config"]["properties"]
    return [key for key, spec in config.items() if "null" in spec.get("type", [])]


@pytest.mark.parametrize("key", _nullable_config_keys())
def test_a_null_setting_reaches_the_controller_as_none(
    key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Helm drops a key set to null; the chart still says none (lifeSOverride: per category)."""
    r = hs.render(hs.chart(), {"controller": {"config": {key: None}}}, name=RELEASE)
    assert r.get("ConfigMap", f"{FULLNAME}-controller")["data"][env_name(snake(key))] == "none"
    _, settings = controller_env(r, monkeypatch)
    assert getattr(settings, snake(key)) is None


def test_a_null_for_any_other_setting_is_refused_at_install() -> None:
    """Only a nullable setting has a null of its own: the schema requires every other key,
    so a null (which Helm turns into a missing key) fails the install instead of leaving
    the setting at a default the operator did not choose."""
    schema = json.loads((hs.CHART / "values.schema.json").read_text())
    sections = {
        ("controller", "config"): set(_nullable_config_keys()),
        ("workers", "agent"): set(),
    }
    taken = []
    for (top, section), nullable in sections.items():
        for key in sorted(set(schema["properties"][top]["properties"][section]["properties"])):
            if key in nullable:
                continue
            try:
                hs.render(hs.chart(), {top: {section: {key: None}}})
                taken.append(f"{top}.{section}.{key}")
            except helm.HelmValuesError as err:
                assert f"missing property '{key}'" in str(err), key
    assert taken == []


@pytest.mark.parametrize("case", CASES)
def test_redis_url_and_credentials_reach_the_controller(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    r = hs.rendered(case)
    _, settings = controller_env(r, monkeypatch)
    assert "$(" not in settings.redis_url, "an env reference was left unexpanded"
    pool = redis.Redis.from_url(settings.redis_url).connection_pool
    kw = pool.connection_kwargs
    secrets = hs.all_secrets(r)
    rv = r.values["redis"]
    if rv["enabled"]:
        svc = r.get("Service", f"{FULLNAME}-redis")
        assert kw["host"] == f"{FULLNAME}-redis.{NAMESPACE}.svc.cluster.local"
        assert kw["port"] == svc["spec"]["ports"][0]["port"] and kw["db"] == rv["database"]
        assert kw["password"] == secrets[(f"{FULLNAME}-redis", "redis-password")]
        # The server takes its password from the same Secret key.
        sts = r.component("StatefulSet", "redis")
        redis_env = hs.resolve_env(r, hs.container(sts, "redis"), pod_name=POD, secrets=secrets)
        args = hs.container(sts, "redis")["args"]
        assert args[args.index("--requirepass") + 1] == "$(REDIS_PASSWORD)"
        assert redis_env["REDIS_PASSWORD"] == kw["password"] == redis_env["REDISCLI_AUTH"]
        return
    ext = rv["external"]
    assert settings.redis_url.split("://")[0] == ext["url"].split("://")[0]
    if ext["existingSecret"]:
        assert kw["password"] == secrets[(ext["existingSecret"], ext["existingSecretPasswordKey"])]
    if ext["existingSecretUsernameKey"]:
        assert kw["username"] == secrets[(ext["existingSecret"], ext["existingSecretUsernameKey"])]
    tls = ext["tls"]
    if tls["existingSecret"]:
        assert pool.connection_class is redis.SSLConnection
        ctr = hs.container(r.component("Deployment", "controller"), "controller")
        mounts = {m["mountPath"]: m["name"] for m in ctr["volumeMounts"]}
        volumes = {
            v["name"]: v for v in hs.pod_spec(r.component("Deployment", "controller"))["volumes"]
        }
        for option, key in (
            ("ssl_ca_certs", "caKey"),
            ("ssl_certfile", "certKey"),
            ("ssl_keyfile", "keyKey"),
        ):
            if tls[key]:
                path = Path(kw[option])
                assert path.name == tls[key]
                assert (
                    volumes[mounts[str(path.parent)]]["secret"]["secretName"]
                    == tls["existingSecret"]
                )


# --- workers ----------------------------------------------------------------------------------
WORKER_CASES = [c for c in CASES if hs.case_values(c).get("workers", {}).get("enabled")]


ENGINE_PLUGINS = {
    "vllm": ("VLLM_PLUGINS", "vllmPlugins"),
    "sglang": ("SGLANG_PLUGINS", "sglangPlugins"),
}


@pytest.mark.parametrize("case", WORKER_CASES)
def test_worker_env_carries_every_agent_setting(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    r = hs.rendered(case)
    w = r.values["workers"]
    deploy = r.component("Deployment", "worker")
    engine = hs.container(deploy, w["engine"])
    assert [c["name"] for c in deploy["spec"]["template"]["spec"]["containers"]] == [w["engine"]]
    env = hs.resolve_env(r, engine, pod_name=POD, secrets=hs.all_secrets(r))
    assert {k for k in env if k.startswith("KVWISE_")} == {
        env_name(f) for f in AgentSettings.model_fields
    }
    assert unread_variables(env) == []  # the agent warns of none in the engine's log
    assert env["KVWISE_ENABLE"] == "1"
    plugins_env, plugins_value = ENGINE_PLUGINS[w["engine"]]
    other_env = {e for e, _ in ENGINE_PLUGINS.values()} - {plugins_env}
    assert "kvwise" in env[plugins_env].split(",") and not other_env & set(env)
    assert set(w[plugins_value]) <= set(env[plugins_env].split(","))
    worker_id = next(e for e in engine["env"] if e["name"] == "KVWISE_WORKER_ID")
    assert worker_id["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}

    agent = hs.load_settings(AgentSettings, env, monkeypatch)
    for key, value in w["agent"].items():
        assert getattr(agent, snake(key)) == value, key
    assert agent.enable is True and agent.worker_id == POD
    assert agent.key_prefix == r.values["controller"]["config"]["keyPrefix"]
    _, ctl = controller_env(r, monkeypatch)
    assert agent.redis_url == ctl.redis_url  # workers and controller meet in the same Redis

    gpu = w["gpu"]["resourceName"]
    requests, limits = engine["resources"]["requests"], engine["resources"]["limits"]
    assert requests[gpu] == limits[gpu] == w["gpu"]["count"]
    check_engine_command(w, engine)
    if w["pluginBundle"]["enabled"]:
        init = hs.container(deploy, "kvwise-plugin")
        bundle = init["command"][-2].rstrip("/.")
        assert env["PYTHONPATH"].split(":")[0] == bundle
        assert any(m["mountPath"] == bundle for m in engine["volumeMounts"])


def test_gpus_given_in_workers_resources_as_in_workers_gpu_render() -> None:
    gpus = {"nvidia.com/gpu": 2}
    values = {
        "workers": {
            "enabled": True,
            "model": {"name": "m"},
            "gpu": {"count": 2},
            "resources": {"requests": {**gpus, "cpu": "4"}, "limits": gpus},
        }
    }
    engine = hs.container(hs.render(hs.chart(), values).component("Deployment", "worker"), "vllm")
    requests = {**gpus, "cpu": "4", "memory": "8Gi"}  # the default memory request merged in
    assert engine["resources"] == {"requests": requests, "limits": gpus}


def test_a_controller_image_upgrade_rolls_the_workers_as_the_docs_say() -> None:
    """The plugin bundle comes from the controller image: a new tag changes the workers'
    pod template (a rollout that reloads every model), which the upgrade notes must say."""
    workers = {"enabled": True, "model": {"name": "m"}}

    def template(tag: str) -> Any:
        values = {"controller": {"image": {"tag": tag}}, "workers": workers}
        return hs.render(hs.chart(), values).component("Deployment", "worker")["spec"]["template"]

    assert template("0.1.0") != template("0.1.1")
    upgrade = hs.DEPLOY_DOC.read_text().split("## Upgrade", 1)[1].split("\n## ", 1)[0]
    assert "A new controller image (`controller.image`) rolls the workers too" in upgrade


@pytest.mark.parametrize(
    ("given", "strategy"),
    [
        ({"type": "Recreate"}, {"type": "Recreate"}),
        (
            {"rollingUpdate": {"maxUnavailable": 2}},
            {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 2}},
        ),
    ],
    ids=["recreate", "rolling"],
)
def test_the_worker_update_strategy_is_one_the_api_server_takes(
    given: dict[str, Any], strategy: dict[str, Any]
) -> None:
    """Helm merges the given strategy into the default one: a Recreate must not keep the
    default's rollingUpdate, which the API server refuses beside it ("may not be specified
    when strategy type is 'Recreate'")."""
    values = {"workers": {"enabled": True, "model": {"name": "m"}, "updateStrategy": given}}
    deploy = hs.render(hs.chart(), values).component("Deployment", "worker")
    assert deploy["spec"]["strategy"] == strategy


@pytest.mark.parametrize("runtime", ["", "nvidia"])
def test_workers_run_under_the_runtime_class_given(runtime: str) -> None:
    """Where the NVIDIA runtime is not the node's default, a GPU pod must name its
    RuntimeClass or it starts without the GPU's devices and libraries."""
    values = {"workers": {"enabled": True, "model": {"name": "m"}, "runtimeClassName": runtime}}
    spec = hs.pod_spec(hs.render(hs.chart(), values).component("Deployment", "worker"))
    assert spec.get("runtimeClassName", "") == runtime


@pytest.mark.parametrize(
    ("given", "requests"),
    [
        ({}, {"cpu": "2", "memory": "8Gi"}),
        ({"limits": {"memory": "4Gi", "cpu": "1"}}, {}),  # the kubelet requests the limits
        ({"limits": {"memory": "4Gi"}}, {"cpu": "2"}),
        ({"requests": {"memory": "64Gi"}}, {"cpu": "2", "memory": "64Gi"}),
    ],
    ids=["none", "limits", "memory-limit", "memory-request"],
)
def test_the_workers_default_requests_fill_only_what_is_not_given(
    given: dict[str, Any], requests: dict[str, str]
) -> None:
    """A CPU or memory the values neither request nor limit is requested at the default
    floor; one they limit is left to Kubernetes, which requests the limit (a default
    request above a smaller limit would be refused by the API server)."""
    values = {"workers": {"enabled": True, "model": {"name": "m"}, "resources": given}}
    engine = hs.container(hs.render(hs.chart(), values).component("Deployment", "worker"), "vllm")
    got = {k: v for k, v in engine["resources"]["requests"].items() if k in ("cpu", "memory")}
    assert got == requests


@pytest.mark.parametrize("case", WORKER_CASES)
def test_a_worker_rollout_outlasts_its_startup_probe(case: str) -> None:
    """A Deployment whose new pods show no progress for progressDeadlineSeconds (600 by
    default) is reported failed; the startup probe gives the model longer to download."""
    r = hs.rendered(case)
    probe = r.values["workers"]["startupProbe"]
    deploy = r.component("Deployment", "worker")
    startup = probe["periodSeconds"] * probe["failureThreshold"] if probe["enabled"] else 0
    assert deploy["spec"].get("progressDeadlineSeconds", 600) >= startup + 600


def check_engine_command(w: dict[str, Any], engine: dict[str, Any]) -> None:
    """The engine serves the model on the worker port, tensor-parallel over the pod's GPUs,
    with the cache kvwise plugs into turned on, and the extra arguments last."""
    args = engine["args"]
    if w["engine"] == "sglang":
        image = w["sglangImage"]
        assert engine["command"] == ["python3", "-m", "sglang.launch_server"]
        assert args[args.index("--model-path") + 1] == w["model"]["name"]
        assert args[args.index("--radix-cache-backend") + 1] == "kvwise"
        assert args[args.index("--tp-size") + 1] == str(w["gpu"]["count"])
    else:
        image = w["image"]
        assert engine["command"] == ["vllm", "serve"]
        assert args[0] == w["model"]["name"] and "--enable-prefix-caching" in args
        assert args[args.index("--tensor-parallel-size") + 1] == str(w["gpu"]["count"])
        # vLLM's default (0) aborts and force-kills the engine core: the agent never leaves.
        grace = int(w["terminationGracePeriodSeconds"])
        assert args[args.index("--shutdown-timeout") + 1] == str(max(1, grace - 10))
    assert engine["image"] == f"{image['repository']}:{image['tag']}"
    assert args[args.index("--port") + 1] == str(w["port"])
    assert args[len(args) - len(w["extraArgs"]) :] == w["extraArgs"]


# --- pods: probes, security, secrets, selectors ------------------------------------------------
@pytest.mark.parametrize("case", CASES)
def test_controller_probes_and_ports(case: str) -> None:
    r = hs.rendered(case)
    ctr = hs.container(r.component("Deployment", "controller"), "controller")
    port = r.values["controller"]["config"]["port"]
    assert ctr["ports"] == [{"name": "http", "containerPort": port, "protocol": "TCP"}]
    assert ctr["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert ctr["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert ctr["args"] == ["--host", r.values["controller"]["config"]["host"], "--port", str(port)]


@pytest.mark.parametrize("case", CASES)
def test_every_container_requests_cpu_and_memory(case: str) -> None:
    """A pod that requests no CPU and no memory is BestEffort (a GPU request does not
    count: QoS looks at CPU and memory only), the first the kubelet evicts when its node
    runs short of memory; and a namespace with a ResourceQuota on them admits no container
    that does not request both."""
    for workload in hs.rendered(case).workloads():
        spec = hs.pod_spec(workload)
        for ctr in spec.get("initContainers", []) + spec["containers"]:
            requests = ctr.get("resources", {}).get("requests", {})
            assert {"cpu", "memory"} <= set(requests), (workload["metadata"]["name"], ctr["name"])


@pytest.mark.parametrize("case", CASES)
def test_controller_replicas_spread_over_nodes_counting_this_release_only(case: str) -> None:
    """A spread that also counts another release's controllers can put both of this
    one's on one node; a soft one still schedules on a single node."""
    deploy = hs.rendered(case).component("Deployment", "controller")
    labels = hs.pod_labels(deploy)
    other_release = {**labels, "app.kubernetes.io/instance": "other"}
    spread = hs.pod_spec(deploy)["topologySpreadConstraints"]
    assert "kubernetes.io/hostname" in {c["topologyKey"] for c in spread}
    for constraint in spread:
        assert hs.selects(constraint["labelSelector"], labels), constraint
        assert not hs.selects(constraint["labelSelector"], other_release), constraint
        assert constraint["whenUnsatisfiable"] == "ScheduleAnyway", constraint


def test_probes_and_scrapes_ask_for_routes_the_controller_serves() -> None:
    """The kubelet sends no token: the probe routes must be open, whatever the tokens."""
    from fastapi.routing import APIRoute

    from controlplane.api.access import Access, required_access
    from controlplane.api.routes import ops

    def paths(routes: list[Any]) -> set[str]:
        return {route.path for route in routes if isinstance(route, APIRoute)}

    r = hs.render(hs.chart(), {"controller": {"metrics": {"serviceMonitor": {"enabled": True}}}})
    ctr = hs.container(r.component("Deployment", "controller"), "controller")
    probes = {ctr[k]["httpGet"]["path"] for k in ("livenessProbe", "readinessProbe")}
    assert probes <= paths(ops.probes.routes)
    assert all(required_access("GET", path) is Access.OPEN for path in probes)
    (endpoint,) = r.of_kind("ServiceMonitor")[0]["spec"]["endpoints"]
    assert endpoint["path"] in paths(ops.reads.routes)


# What redis-cli prints for `ping` (stdout and stderr) in each state of the server.
REDIS_REPLIES = {
    "up": "PONG",
    "loading": "LOADING Redis is loading the dataset in memory",
    "down": "Could not connect to Redis at 127.0.0.1:6379: Connection refused",
}


def _probe_passes(probe: dict[str, Any], reply: str, bin_dir: Path) -> bool:
    """Run an exec probe's command with a redis-cli on PATH that answers ``reply``."""
    stub = bin_dir / "redis-cli"
    stub.write_text(f"#!/bin/sh\necho '{reply}'\n")
    stub.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    return subprocess.run(probe["exec"]["command"], env=env, timeout=10).returncode == 0


def test_redis_loading_its_data_is_alive_but_not_ready(tmp_path: Path) -> None:
    """A Redis loading its AOF answers LOADING to PING: restarting it then would start the
    load over for ever, so the startup and liveness probes take it as alive."""
    ctr = hs.container(hs.rendered("default").component("StatefulSet", "redis"), "redis")
    startup = ctr["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300
    expected = {
        "startupProbe": {"up": True, "loading": True, "down": False},
        "livenessProbe": {"up": True, "loading": True, "down": False},
        "readinessProbe": {"up": True, "loading": False, "down": False},
    }
    seen = {
        kind: {
            state: _probe_passes(ctr[kind], reply, tmp_path)
            for state, reply in REDIS_REPLIES.items()
        }
        for kind in expected
    }
    assert seen == expected


HARDENED = ["controller:controller", "redis:redis", "test:check", "worker:kvwise-plugin"]


@pytest.mark.parametrize("case", CASES)
def test_chart_owned_containers_are_hardened(case: str) -> None:
    r = hs.rendered(case)
    seen = 0
    for wl in r.workloads():
        component = wl["metadata"]["labels"]["app.kubernetes.io/component"]
        spec = hs.pod_spec(wl)
        for ctr in spec["containers"] + spec.get("initContainers", []):
            sc = ctr.get("securityContext", {})
            assert sc.get("allowPrivilegeEscalation") is False, ctr["name"]
            assert sc["capabilities"]["drop"] == ["ALL"], ctr["name"]
            seccomp = sc.get("seccompProfile") or spec["securityContext"]["seccompProfile"]
            assert seccomp == {"type": "RuntimeDefault"}, ctr["name"]
            if f"{component}:{ctr['name']}" not in HARDENED:
                continue  # vLLM runs as root in its own image
            seen += 1
            assert sc["runAsNonRoot"] is True and sc["runAsUser"] > 0, ctr["name"]
            assert sc["readOnlyRootFilesystem"] is True, ctr["name"]
        assert spec["automountServiceAccountToken"] is False
    assert seen >= 2
    ctl = r.component("Deployment", "controller")
    tmp = next(
        m for m in hs.container(ctl, "controller")["volumeMounts"] if m["mountPath"] == "/tmp"
    )
    assert (
        next(v for v in hs.pod_spec(ctl)["volumes"] if v["name"] == tmp["name"])["emptyDir"] == {}
    )


@pytest.mark.parametrize("case", CASES)
def test_secret_and_configmap_references_resolve(case: str) -> None:
    r = hs.rendered(case)
    known = set(hs.all_secrets(r))
    secret_names = {name for name, _ in known}
    for wl in r.workloads():
        spec = hs.pod_spec(wl)
        for ctr in spec["containers"] + spec.get("initContainers", []):
            for item in ctr.get("env", []):
                ref = item.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert (ref["name"], ref["key"]) in known, f"{ctr['name']}: {item['name']}"
            for src in ctr.get("envFrom", []):
                if "configMapRef" in src:
                    r.get("ConfigMap", src["configMapRef"]["name"])
            volumes = {v["name"] for v in spec.get("volumes", [])}
            claims = {c["metadata"]["name"] for c in wl["spec"].get("volumeClaimTemplates", [])}
            for mount in ctr.get("volumeMounts", []):
                assert mount["name"] in volumes | claims, f"{ctr['name']}: {mount['name']}"
        for vol in spec.get("volumes", []):
            if "secret" in vol:
                assert vol["secret"]["secretName"] in secret_names, vol


@pytest.mark.parametrize("case", CASES)
def test_selectors_match_the_pods_they_mean(case: str) -> None:
    r = hs.rendered(case)
    pods = {wl["metadata"]["labels"]["app.kubernetes.io/component"]: wl for wl in r.workloads()}

    def matched(selector: dict[str, Any]) -> set[str]:
        return {c for c, wl in pods.items() if hs.selects(selector, hs.pod_labels(wl))}

    for wl in r.workloads():
        if wl["kind"] != "Pod":
            assert hs.selects(wl["spec"]["selector"], hs.pod_labels(wl))
    for svc in r.of_kind("Service"):
        component = svc["metadata"]["labels"]["app.kubernetes.io/component"]
        assert matched(svc["spec"]["selector"]) == {component}, svc["metadata"]["name"]
        port_names = {
            p["name"] for c in hs.pod_spec(pods[component])["containers"] for p in c["ports"]
        }
        assert {p["targetPort"] for p in svc["spec"]["ports"]} <= port_names
    for pdb in r.of_kind("PodDisruptionBudget"):
        assert matched(pdb["spec"]["selector"]) == {"controller"}
    policies = {
        np["metadata"]["labels"]["app.kubernetes.io/component"]: np
        for np in r.of_kind("NetworkPolicy")
    }
    if r.values["networkPolicy"]["enabled"]:
        api = policies["controller"]
        assert matched(api["spec"]["podSelector"]) == {"controller"}
        assert any(
            matched(peer["podSelector"]) == {"test"} for peer in api["spec"]["ingress"][0]["from"]
        )
    if "redis" in policies:
        peers = policies["redis"]["spec"]["ingress"][0]["from"]
        assert matched(policies["redis"]["spec"]["podSelector"]) == {"redis"}
        reach = set().union(
            *(matched(p["podSelector"]) for p in peers if "namespaceSelector" not in p)
        )
        assert reach == {"controller", "worker"} & set(pods)  # not the test pod, not Redis
    for sm in r.of_kind("ServiceMonitor"):
        svc = r.get("Service", f"{FULLNAME}-controller")
        assert hs.selects(sm["spec"]["selector"], svc["metadata"]["labels"])
        assert sm["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
        assert [(e["port"], e["path"]) for e in sm["spec"]["endpoints"]] == [("http", "/metrics")]


# Where kube-prometheus-stack's Prometheus runs, as the docs install it.
PROMETHEUS_NAMESPACE, PROMETHEUS_LABELS = "monitoring", {"app.kubernetes.io/name": "prometheus"}


@pytest.mark.parametrize("case", CASES)
def test_a_service_monitor_comes_with_prometheus_admitted_to_the_api(case: str) -> None:
    """A ServiceMonitor whose Prometheus the NetworkPolicy keeps out scrapes nothing."""
    r = hs.rendered(case)
    if not r.values["networkPolicy"]["enabled"]:
        pytest.skip("no NetworkPolicy")
    api = r.component("NetworkPolicy", "controller")
    (rule,) = api["spec"]["ingress"]
    admitted = any(
        hs.admits(peer, PROMETHEUS_NAMESPACE, PROMETHEUS_LABELS) for peer in rule["from"]
    )
    assert admitted == bool(r.of_kind("ServiceMonitor"))
    assert {p["port"] for p in rule["ports"]} == {"http"}


@pytest.mark.parametrize("case", CASES)
def test_standard_labels_on_every_resource(case: str) -> None:
    for m in hs.rendered(case).manifests:
        labels = m["metadata"]["labels"]
        assert labels["helm.sh/chart"] == "kvwise-0.1.0"
        assert labels["app.kubernetes.io/name"] == "kvwise"
        assert labels["app.kubernetes.io/instance"] == RELEASE
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels["app.kubernetes.io/component"]
        assert m["metadata"]["name"].startswith(FULLNAME)


def _with_credentials(api: str, read: str, redis_password: str) -> dict[str, Any]:
    auth = {"apiToken": api, "readToken": {"enabled": True, "value": read}}
    return {
        "controller": {"auth": auth},
        "redis": {"auth": {"password": redis_password}},
        "workers": {"enabled": True, "model": {"name": "m"}},
    }


@pytest.mark.parametrize(
    ("changed", "rolled"),
    [
        (("t0k-2", "r3ad", "pw"), {"controller"}),
        (("t0k", "r3ad-2", "pw"), {"controller"}),
        (("t0k", "r3ad", "pw-2"), {"controller", "redis", "worker"}),
    ],
    ids=["api-token", "read-token", "redis-password"],
)
def test_a_changed_credential_rolls_the_pods_that_read_it(
    changed: tuple[str, str, str], rolled: set[str]
) -> None:
    """A Secret change reaches no running pod's env: the pods that read it must roll."""
    before = hs.render(hs.chart(), _with_credentials("t0k", "r3ad", "pw"))
    after = hs.render(hs.chart(), _with_credentials(*changed))
    templates = {
        c: [r.component(k, c)["spec"]["template"] for r in (before, after)]
        for k, c in (
            ("Deployment", "controller"),
            ("StatefulSet", "redis"),
            ("Deployment", "worker"),
        )
    }
    assert {c for c, (old, new) in templates.items() if old != new} == rolled


@pytest.mark.parametrize(
    "names",
    [{"fullnameOverride": "f" * 63}, {"nameOverride": "n" * 63}],
    ids=["long-fullname", "long-name"],
)
def test_long_names_still_make_names_kubernetes_takes(names: dict[str, str]) -> None:
    """A Service name is one DNS label (63); a StatefulSet's name goes, with a hash, into
    its pods' controller-revision-hash label (63), so it may take 52; any label value 63."""
    values = {**names, "workers": {"enabled": True, "model": {"name": "m"}}}
    r = hs.render(hs.chart(), values, name="r" * 53)  # the longest release name Helm takes
    longest = {"Service": 63, "StatefulSet": 52}
    for m in r.manifests:
        name = m["metadata"]["name"]
        assert len(name) <= longest.get(m["kind"], 253), f"{m['kind']} {name}"
        for key, value in m["metadata"]["labels"].items():
            assert len(value) <= 63, f"{m['kind']} {name}: {key}"


LABEL_MAPS = [
    "commonLabels",
    "controller.podLabels",
    "redis.podLabels",
    "workers.podLabels",
    "controller.metrics.serviceMonitor.labels",
    "controller.metrics.grafanaDashboard.labels",
    "controller.metrics.prometheusRule.labels",
]


@pytest.mark.parametrize("path", LABEL_MAPS)
@pytest.mark.parametrize("key", ["app.kubernetes.io/name", "app.kubernetes.io/component"])
def test_extra_labels_may_not_take_a_label_the_chart_sets(path: str, key: str) -> None:
    """The chart's own label keys already stand on every object it labels: another value
    under one would be a duplicate key, and on a pod one its selector no longer matches."""
    values: dict[str, Any] = {key: "other"}
    for part in reversed(path.split(".")):
        values = {part: values}
    with pytest.raises(helm.HelmValuesError) as err:
        hs.render(hs.chart(), values)
    pointer = f"/{path.replace('.', '/')}/{key.replace('/', '~1')}"  # JSON Pointer
    assert f"at '{pointer}'" in str(err.value)


@pytest.mark.parametrize(
    "path", ["controller.podAnnotations", "redis.podAnnotations", "workers.podAnnotations"]
)
@pytest.mark.parametrize("key", ["checksum/config", "checksum/credentials"])
def test_pod_annotations_may_not_take_a_checksum_the_chart_sets(path: str, key: str) -> None:
    values: dict[str, Any] = {key: "0"}
    for part in reversed(path.split(".")):
        values = {part: values}
    with pytest.raises(helm.HelmValuesError) as err:
        hs.render(hs.chart(), values)
    pointer = f"/{path.replace('.', '/')}/{key.replace('/', '~1')}"
    assert f"at '{pointer}'" in str(err.value)


def test_common_labels_and_annotations_on_every_resource() -> None:
    common = {"commonLabels": {"team": "ml"}, "commonAnnotations": {"owner": "ml-platform"}}
    values = {**common, "workers": {"enabled": True, "model": {"name": "m"}}}
    for m in hs.render(hs.chart(), values).manifests:
        where = f"{m['kind']}/{m['metadata']['name']}"
        assert m["metadata"]["labels"]["team"] == "ml", where
        assert m["metadata"].get("annotations", {}).get("owner") == "ml-platform", where


def test_helm_test_pod_checks_readiness_and_a_policy_version() -> None:
    r = hs.rendered("default")
    pod = r.component("Pod", "test")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    ctr = hs.container(pod, "check")
    url = next(e["value"] for e in ctr["env"] if e["name"] == "KVWISE_URL")
    assert url == f"http://{FULLNAME}-controller:{r.values['controller']['service']['port']}"
    script = ctr["args"][0]
    assert '"/readyz"' in script and '"/v1/policy"' in script and '"version"' in script
    assert "port-forward svc/kv-kvwise-controller 8080:8080" in r.notes
    assert "curl -s http://127.0.0.1:8080/v1/policy" in r.notes


def test_the_notes_read_the_token_keys_with_a_valid_jsonpath() -> None:
    """kubectl's JSONPath reads a dot as a step: a key holding one is escaped."""
    read = {"enabled": True, "existingSecretKey": "read.token"}
    auth = {"existingSecretKey": "api.token", "readToken": read}
    notes = hs.render(hs.chart(), {"controller": {"auth": auth}}).notes
    paths = re.findall(r"jsonpath='([^']*)'", notes)
    assert paths == ["{.data.read\\.token}", "{.data.api\\.token}"]


@pytest.mark.parametrize("port", [80, 443, 8080, 9000])
def test_the_notes_port_forward_a_local_port_a_user_may_open(port: int) -> None:
    """kubectl port-forward opens its local port as the user who runs it: a Service on a
    privileged port (80, 443) must still be reached through an unprivileged local port, and
    every curl in the notes must use the local one."""
    values = {
        "controller": {"service": {"port": port}},
        "workers": {"enabled": True, "model": {"name": "m"}, "service": {"port": port}},
    }
    notes = hs.render(hs.chart(), values).notes
    forwards = re.findall(r"port-forward svc/(\S+) (\d+):(\d+)", notes)
    assert [(svc, int(remote)) for svc, _, remote in forwards] == [
        (f"{FULLNAME}-controller", port),
        (f"{FULLNAME}-worker", port),
    ]
    local = [int(local) for _, local, _ in forwards]
    assert all(p >= 1024 for p in local), forwards
    curled = {int(p) for p in re.findall(r"http://127\.0\.0\.1:(\d+)/", notes)}
    assert curled == {local[0]}


@pytest.mark.parametrize("case", CASES)
def test_the_notes_tell_own_engine_pods_the_redis_the_chart_uses(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/deploy.md sends operators joining their own engine pods to the NOTES for the
    Redis URL and its Secret: filled in from that Secret, the URL the NOTES give must be
    the one the controller connects to, cluster flag included, for every kind of Redis."""
    r = hs.rendered(case)
    env, _ = controller_env(r, monkeypatch)
    url = re.search(r"KVWISE_REDIS_URL=(\S+)", r.notes)
    assert url is not None, r.notes
    given = url.group(1)
    secret = re.search(r"secret (\S+), keys? ([^;)]+)", r.notes[url.end() :])
    if "<password>" in given:
        assert secret is not None, r.notes
        keys = dict(re.findall(r"(\S+) for <(\w+)>", secret.group(2)))
        secrets = hs.all_secrets(r)
        for key, placeholder in keys.items():
            given = given.replace(f"<{placeholder}>", secrets[(secret.group(1), key)])
    assert given == env["KVWISE_REDIS_URL"]
    cluster = env["KVWISE_REDIS_CLUSTER"] == "true"
    assert ("KVWISE_REDIS_CLUSTER=true" in r.notes) == cluster


def test_the_notes_tell_own_engine_pods_of_a_redis_cluster() -> None:
    external = {"url": "redis://redis-cluster.example.internal:6379/0", "cluster": True}
    notes = hs.render(hs.chart(), {"redis": {"enabled": False, "external": external}}).notes
    assert "KVWISE_REDIS_CLUSTER=true" in notes
    assert "KVWISE_REDIS_URL=redis://redis-cluster.example.internal:6379/0\n" in notes


def test_the_notes_mutation_example_needs_a_version_filled_in() -> None:
    """Pasted as printed, the rollback example must change nothing: a fixed version (1 is
    the built-in defaults) would reset the fleet."""
    notes = hs.rendered("default").notes
    assert "/v1/policy/versions" in notes
    assert """-d '{"version": <VERSION>}'""" in notes
    assert not re.search(r'"version": *\d', notes)


# --- the helm test check against a real controller --------------------------------------------
def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


@pytest.mark.integration
@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.parametrize("read_token", [False, True], ids=["reads-open", "read-token"])
def test_helm_test_check_passes_against_a_controller_started_from_the_rendered_pod(
    redis_url: str, key_prefix: str, read_token: bool
) -> None:
    """Run ``kvwise controller`` with exactly the env the chart gives the pod (ConfigMap,
    Secrets, Redis URL), then the ``helm test`` pod's script, with its own env, against
    it (with a read token, the script must send it)."""
    from controlplane.dev.embedded_redis import free_port

    port = free_port()
    values = {
        "controller": {
            "config": {"port": port, "keyPrefix": key_prefix},
            "auth": {"readToken": {"enabled": read_token}},
        },
        "redis": {"enabled": False, "external": {"url": redis_url}},
    }
    r = hs.render(hs.chart(), values)
    ctr = hs.container(r.component("Deployment", "controller"), "controller")
    env = hs.resolve_env(r, ctr, pod_name=POD, secrets=hs.all_secrets(r))
    base = {k: v for k, v in os.environ.items() if not k.startswith("KVWISE_")}
    exe = shutil.which("kvwise")
    assert exe is not None, "the kvwise console script is not installed (pip install -e .)"
    # The pod binds every address (its probes and Service come from outside it); on this
    # machine the loopback one is enough.
    args = list(ctr["args"])
    args[args.index("--host") + 1] = env["KVWISE_HOST"] = "127.0.0.1"
    # The image's ENTRYPOINT is `kvwise controller`; the chart supplies the arguments.
    proc = subprocess.Popen(
        [exe, "controller", *args],
        env={**base, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:

        def ready() -> bool:
            assert proc.poll() is None, proc.communicate()[0].decode()[-2000:]
            return _status(f"http://127.0.0.1:{port}/readyz") == 200

        wait_until(ready, timeout=60, what="the controller to be ready", every=0.2)
        check = hs.container(r.component("Pod", "test"), "check")
        script = check["command"][1:] + check["args"]
        assert script[0] == "-c"
        check_env = hs.resolve_env(r, check, pod_name=POD, secrets=hs.all_secrets(r))
        assert ("KVWISE_READ_TOKEN" in check_env) is read_token
        if read_token:
            policy = f"http://127.0.0.1:{port}/v1/policy"
            assert _status(policy) == 401, "reads should need the read token"
        done = subprocess.run(
            [sys.executable, *script],
            env={**base, **check_env, "KVWISE_URL": f"http://127.0.0.1:{port}"},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert "GET /readyz: 200" in done.stdout
        assert re.search(r"GET /v1/policy: version [1-9][0-9]*, ", done.stdout), done.stdout
    finally:
        proc.terminate()
        proc.wait(timeout=30)

"""The Helm chart helm/kvwise, rendered offline with Helm's own Go SDK (helm-python-sdk).

Each case (the defaults, every ci/*-values.yaml, the Llama 3 example) is linted, rendered
and validated against the Kubernetes 1.30 schemas; the values are checked against
values.schema.json. The settings classes are imported, so a setting added to or renamed in
ControllerSettings / AgentSettings without the chart following fails here.

Kubernetes 1.30 is pinned because it is the oldest minor the chart supports (Chart.yaml
kubeVersion >=1.30): fields are only ever added to the API, so a manifest valid against
1.30's strict schemas (no unknown fields) is valid on every supported cluster, and a field
newer than the support floor fails here instead of on a user's older cluster.
"""

from __future__ import annotations

import json
import re
import typing
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest
import yaml
from pydantic import ValidationError

from agent.policies import names as policy_names
from agent.settings import AgentSettings
from controlplane.service.settings import ControllerSettings
from controlplane.shadow.settings import ShadowSettings
from tests.conftest import REPO
from tests.integration import helm_support as hs
from tests.integration.helm_support import AGENT_DERIVED, CASES, POD_ENV_FIELDS, camel, env_name

K8S_VERSION = "1.30"
# Chart defaults that differ from the settings' defaults on purpose.
CONTROLLER_DEFAULT_OVERRIDES = {"host": "0.0.0.0"}  # reachable through the Service
AGENT_DEFAULT_OVERRIDES = {"enable": True}  # workers.enabled means the plugin runs


def schema() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((hs.CHART / "values.schema.json").read_text())
    return loaded


def raw_values() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((hs.CHART / "values.yaml").read_text())
    return loaded


# --- Helm's own checks ------------------------------------------------------------------------
@pytest.mark.parametrize("case", CASES)
def test_helm_lint_is_clean(case: str) -> None:
    values = hs.case_values(case)
    report = helm.lint(hs.CHART, values, strict=True, kube_version=f"v{K8S_VERSION}.0")
    assert report["errors"] == []
    serious = [m for m in report["messages"] if m["severity"] >= 2]  # 2 warning, 3 error
    assert serious == [], serious


@pytest.mark.parametrize("case", CASES)
def test_manifests_are_valid_kubernetes_objects(case: str) -> None:
    without_schema = set()
    for m in hs.rendered(case).manifests:
        try:
            kubernetes_validate.validate(m, K8S_VERSION, strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            without_schema.add(f"{m['apiVersion']}/{m['kind']}")
        except kubernetes_validate.ValidationError as exc:
            where = ".".join(str(p) for p in exc.path)
            pytest.fail(f"{m['kind']}/{m['metadata']['name']}: {where}: {exc.message}")
    # Only the Prometheus Operator's CRDs have no built-in schema (their shape is checked
    # below and in test_helm_alerts.py).
    operator = {
        "monitoring.coreos.com/v1/ServiceMonitor",
        "monitoring.coreos.com/v1/PrometheusRule",
    }
    assert without_schema <= operator


@pytest.mark.parametrize("case", CASES)
def test_rendering_is_deterministic_but_for_generated_secrets(case: str) -> None:
    """Two renders differ only in the tokens and passwords generated when none is given
    (an install keeps them through lookup; docs/deploy.md, Upgrade)."""
    first, again = (hs.render(hs.chart(), hs.case_values(case)) for _ in range(2))
    assert first.notes == again.notes

    def without_secret_data(r: hs.Rendered) -> list[hs.Manifest]:
        return [{**m, "data": None} if m["kind"] == "Secret" else m for m in r.manifests]

    assert without_secret_data(first) == without_secret_data(again)


@pytest.mark.parametrize("case", CASES)
def test_values_satisfy_the_schema(case: str) -> None:
    jsonschema.Draft7Validator.check_schema(schema())
    merged = hs.chart().merge_values(hs.case_values(case))
    assert [e.message for e in jsonschema.Draft7Validator(schema()).iter_errors(merged)] == []
    hs.chart().validate_schema(hs.case_values(case))  # Helm's own validator agrees


def schema_entry(*path: str) -> dict[str, Any]:
    """The schema's entry for the value at ``path``."""
    node = schema()
    for part in path:
        node = node["properties"][part]
    return node


def pattern_at(*path: str) -> str:
    pattern: str = schema_entry(*path).get("pattern", "(no pattern)")
    return pattern


def config_pattern(key: str) -> str:
    return pattern_at("controller", "config", key)


# A key of a Secret (or ConfigMap), as the API server validates it.
SECRET_KEY = re.compile(r"[-._a-zA-Z0-9]+")


def secret_key_entries(node: dict[str, Any], path: str = "") -> dict[str, dict[str, Any]]:
    """The schema entries of every value naming a key of a Secret (``...Key``)."""
    found: dict[str, dict[str, Any]] = {}
    for name, entry in node.get("properties", {}).items():
        if name.endswith("Key"):
            found[path + name] = entry
        found |= secret_key_entries(entry, f"{path}{name}.")
    return found


def test_secret_keys_are_refused_at_install_unless_the_api_server_takes_them() -> None:
    entries = secret_key_entries(schema())
    assert len(entries) >= 9, sorted(entries)
    for path, entry in entries.items():
        default = hs.lookup(raw_values(), path)
        pattern = re.compile(entry.get("pattern", ".*"))
        for key in ("api-token", "tls.crt", "ca_1.pem"):
            assert pattern.search(key), (path, key)
        for key in ("a/b", "has space", "tok:en", "ключ"):
            assert not pattern.search(key), (path, key)
        assert bool(pattern.search("")) == (entry.get("minLength", 0) == 0), path
        assert default == "" or SECRET_KEY.fullmatch(default), path
    with pytest.raises(helm.HelmValuesError) as err:
        hs.render(hs.chart(), {"controller": {"auth": {"existingSecretKey": "a/b"}}})
    assert "at '/controller/auth/existingSecretKey': 'a/b' does not match pattern" in str(err.value)


# Values naming a Kubernetes object (a DNS subdomain; a namespace is a DNS label).
OBJECT_NAMES = [
    "controller.auth.existingSecret",
    "controller.serviceAccount.name",
    "controller.priorityClassName",
    "redis.auth.existingSecret",
    "redis.persistence.storageClass",
    "redis.external.existingSecret",
    "redis.external.tls.existingSecret",
    "workers.model.hfTokenSecret",
    "workers.modelCache.existingClaim",
    "workers.serviceAccount.name",
    "workers.priorityClassName",
    "workers.runtimeClassName",
]
NAMESPACES = [
    "controller.metrics.serviceMonitor.namespace",
    "controller.metrics.grafanaDashboard.namespace",
    "controller.metrics.prometheusRule.namespace",
]


@pytest.mark.parametrize("path", OBJECT_NAMES + NAMESPACES)
def test_object_names_are_refused_at_install_unless_the_api_server_takes_them(path: str) -> None:
    entry = schema_entry(*path.split("."))
    pattern = re.compile(entry.get("pattern", ""))
    good = ["", "kv", "kv-api-token", "a" * 63]
    bad = ["KV", "kv_token", "-kv", "kv-", "kv token", "a" * 254]
    if path in NAMESPACES:
        bad += ["kv.ml", "a" * 64]
    else:
        good += ["kv.v1", "a" * 253]

    def takes(name: str) -> bool:
        return bool(pattern.search(name)) and len(name) <= entry.get("maxLength", len(name))

    assert [n for n in good if not takes(n)] == [], path
    assert [n for n in bad if takes(n)] == [], path


def nested(path: str, value: Any) -> dict[str, Any]:
    """Values holding ``value`` at the dotted ``path``."""
    keys = path.split(".")
    bad: dict[str, Any] = {keys[-1]: value}
    for key in reversed(keys[:-1]):
        bad = {key: bad}
    return bad


def refused_by_pattern(path: str, value: str, case: str) -> Any:
    """A case of ``BAD_VALUES``: ``value`` at the dotted ``path``, which the schema's pattern
    there refuses, in Helm's words and in jsonschema's."""
    keys = path.split(".")
    return pytest.param(
        nested(path, value),
        f"at '/{'/'.join(keys)}': '{value}' does not match pattern",
        f"'{value}' does not match {pattern_at(*keys)!r}",
        id=case,
    )


def refused_by_enum(path: str, value: str, choices: list[str], case: str) -> Any:
    """A case of ``BAD_VALUES``: ``value`` at the dotted ``path``, where the schema takes only
    one of ``choices``, in Helm's words and in jsonschema's."""
    return pytest.param(
        nested(path, value),
        f"at '/{path.replace('.', '/')}': value must be one of {', '.join(map(repr, choices))}",
        f"{value!r} is not one of {choices!r}",
        id=case,
    )


def refused_as_unknown(path: str, value: Any, case: str) -> Any:
    """A case of ``BAD_VALUES``: ``value`` at the dotted ``path``, a key the schema does not
    know there, in Helm's words and in jsonschema's."""
    parent, key = path.rsplit(".", 1)
    return pytest.param(
        nested(path, value),
        f"at '/{parent.replace('.', '/')}': additional properties '{key}' not allowed",
        f"Additional properties are not allowed ('{key}' was unexpected)",
        id=case,
    )


BAD_VALUES = [
    refused_by_pattern("controller.config.shadowPolicies", "lru,bogus", "unknown-shadow-policy"),
    refused_by_pattern("controller.config.shadowLadder", "0,-1", "shadow-ladder-out-of-range"),
    refused_by_enum("controller.config.lifeRule", "median", ["quantile", "fixed"], "wrong-enum"),
    refused_as_unknown("controller.config.refitInterval", 30, "unknown-key"),
    pytest.param(
        {"controller": {"replicaCount": "two"}},
        "at '/controller/replicaCount': got string, want integer",
        "'two' is not of type 'integer'",
        id="wrong-type",
    ),
    pytest.param(
        {"workers": {"agent": {"bufferEvents": 0}}},
        "at '/workers/agent/bufferEvents'",
        "0 is less than or equal to the minimum of 0",
        id="out-of-range",
    ),
    refused_by_pattern("controller.auth.existingSecret", "API_Token", "not-an-object-name"),
    *(
        refused_by_pattern(key, "KV_Prod", f"not-a-dns-label-{key}")
        for key in ("nameOverride", "fullnameOverride")
    ),
    *(
        refused_by_pattern(path, "8GB", f"not-a-quantity-{path.split('.')[-1]}")
        for path in ("workers.shmSizeLimit", "workers.modelCache.sizeLimit")
    ),
    refused_by_enum("workers.engine", "tgi", ["vllm", "sglang"], "unknown-engine"),
    refused_by_pattern("controller.config.keyPrefix", "kv{a}:", "key-prefix-hash-tag"),
    pytest.param(  # Helm drops a null key: a setting cannot be nulled back to its default
        {"controller": {"config": {"windowBuckets": None}}},
        "at '/controller/config': missing property 'windowBuckets'",
        "'windowBuckets' is a required property",
        id="null-setting",
    ),
]


@pytest.mark.parametrize(("bad", "helm_says", "jsonschema_says"), BAD_VALUES)
def test_bad_values_are_rejected_with_a_readable_message(
    bad: dict[str, Any], helm_says: str, jsonschema_says: str
) -> None:
    with pytest.raises(helm.HelmValuesError) as err:
        hs.render(hs.chart(), bad)
    assert helm_says in str(err.value)
    merged = hs.chart().merge_values(bad)
    assert [e.message for e in jsonschema.Draft7Validator(schema()).iter_errors(merged)] == [
        jsonschema_says
    ]


SHADOW_LISTS = (
    [
        ("shadowPolicies", v)
        for v in ("lru,s3fifo,arc", "", "wa", " lru , sieve ,", "lru,bogus", "LRU", "lfu;arc")
    ]
    + [
        ("shadowLadder", v)
        for v in ("0.25,0.5,1,2,4", "64", "64.0", "0.001", "1,", ".5", "0,-1", "0", "0.0")
    ]
    + [("shadowLadder", v) for v in ("65", "64.5", "", ",", "abc", "1,,x", "-2")]
)


@pytest.mark.parametrize(("key", "value"), SHADOW_LISTS)
def test_schema_takes_the_shadow_lists_the_controller_takes(key: str, value: str) -> None:
    """The controller refuses a bad list at start (a crash loop): the schema refuses the
    same ones at install. The policy pattern lists the policy registry's names."""
    try:
        ShadowSettings(**{hs.snake(key): value})
        controller_takes = True
    except ValidationError:
        controller_takes = False
    assert bool(re.search(config_pattern(key), value)) == controller_takes, value


def test_the_policy_pattern_names_every_registered_policy() -> None:
    alternatives = re.findall(r"\(\?:\(\?:([a-z0-9|]+)\)", config_pattern("shadowPolicies"))
    assert alternatives and {frozenset(a.split("|")) for a in alternatives} == {
        frozenset(policy_names())
    }


BAD_COMBINATIONS = [
    pytest.param({"redis": {"enabled": False}}, "'/redis/external/url': minLength", id="no-url"),
    pytest.param(
        {"redis": {"enabled": False, "external": {"url": "redis://u:pw@h:6379/0"}}},
        "must not contain credentials",
        id="credentials-in-url",
    ),
    pytest.param(
        {
            "redis": {
                "enabled": False,
                "external": {"url": "redis://h:6379/0", "tls": {"existingSecret": "ca"}},
            }
        },
        "redis.external.tls.existingSecret is set but redis.external.url is not rediss://",
        id="tls-without-rediss",
    ),
    pytest.param(
        {"redis": {"enabled": False, "database": 3, "external": {"url": "redis://h:6379"}}},
        "redis.database (3) is the in-chart Redis's: put an external one's in redis.external.url",
        id="database-of-an-external-redis",
    ),
    pytest.param(
        {"redis": {"enabled": False, "external": {"url": "redis://h:6379/2", "cluster": True}}},
        "redis.external.cluster=true takes database 0 only (a Redis Cluster has no other): "
        "got redis://h:6379/2",
        id="cluster-database",
    ),
    pytest.param(
        {"redis": {"resources": {"limits": {"memory": "2Gi"}}}},
        "redis.resources.limits.memory (2Gi) needs --maxmemory in redis.extraArgs",
        id="redis-memory-limit-without-maxmemory",
    ),
    pytest.param(
        {
            "redis": {
                "resources": {"limits": {"memory": "2Gi"}},
                "extraArgs": ["--maxmemory-policy", "noeviction"],
            }
        },
        "redis.resources.limits.memory (2Gi) needs --maxmemory in redis.extraArgs",
        id="redis-memory-limit-with-another-maxmemory-flag",
    ),
    pytest.param(
        {
            "controller": {
                "auth": {"readToken": {"enabled": True}},
                "metrics": {"serviceMonitor": {"enabled": True, "namespace": "monitoring"}},
            }
        },
        "controller.metrics.serviceMonitor.namespace (monitoring) is not the release's "
        "namespace (ml), where the chart's token Secret is",
        id="read-token-secret-out-of-the-service-monitors-reach",
    ),
    *(
        pytest.param(
            {"controller": {"replicaCount": replicas, "pdb": pdb}},
            f"controller.pdb.{next(iter(pdb))} ({next(iter(pdb.values()))}) lets no controller "
            f"pod be evicted with controller.replicaCount {replicas}",
            id=f"pdb-blocking-every-drain-{replicas}-{next(iter(pdb.values()))}",
        )
        for replicas, pdb in [
            (1, {"minAvailable": 1}),
            (2, {"minAvailable": 2}),
            (2, {"minAvailable": "60%"}),
            (1, {"minAvailable": "100%"}),
            (2, {"maxUnavailable": 0}),
            (3, {"maxUnavailable": "0%"}),
        ]
    ),
    pytest.param({"workers": {"enabled": True}}, "'/workers/model/name': minLength", id="no-model"),
    pytest.param(
        {"controller": {"auth": {"enabled": False}}},
        "set controller.config.allowOpenApi=true to accept that",
        id="open-api-on-the-network",
    ),
    *(
        pytest.param(
            {"controller": {"config": {"host": host}}},
            f"controller.config.host={host} is a loopback address of the pod",
            id=f"loopback-host-{host}",
        )
        for host in ("127.0.0.1", "127.0.0.2", "::1", "localhost")
    ),
    pytest.param(
        {"controller": {"auth": {"enabled": False, "readToken": {"enabled": True}}}},
        "controller.auth.readToken.enabled=true needs controller.auth.enabled=true",
        id="read-token-without-api-token",
    ),
    pytest.param(
        {"controller": {"auth": {"apiToken": "  "}}},
        "controller.auth.apiToken is blank",
        id="blank-token",
    ),
    pytest.param(
        {
            "controller": {
                "auth": {"apiToken": "t0k", "readToken": {"enabled": True, "value": "t0k"}}
            }
        },
        "controller.auth.readToken.value must differ from controller.auth.apiToken",
        id="read-token-is-the-api-token",
    ),
    pytest.param(
        {
            "workers": {
                "enabled": True,
                "model": {"name": "m"},
                "agent": {"maxTrackedCategories": 2048},
            }
        },
        "workers.agent.maxTrackedCategories (2048) must not exceed "
        "controller.config.maxCategoriesPerWorker (1024)",
        id="agent-names-more-categories-than-the-controller-takes",
    ),
    pytest.param(
        {"workers": {"enabled": True, "model": {"name": "m"}, "agent": {"batchEvents": 100000}}},
        "workers.agent.batchEvents (100000 per entry) must not exceed "
        "controller.config.ingestMaxEvents (65536)",
        id="agent-batches-over-the-ingest-limit",
    ),
    pytest.param(
        {
            "controller": {
                "auth": {"readToken": {"enabled": True, "existingSecretKey": "api-token"}}
            }
        },
        "controller.auth.readToken.existingSecretKey must differ from "
        "controller.auth.existingSecretKey",
        id="both-tokens-under-one-key",
    ),
    pytest.param(
        {"controller": {"pdb": {"maxUnavailable": ""}}},
        "controller.pdb.create=true needs controller.pdb.minAvailable or "
        "controller.pdb.maxUnavailable",
        id="empty-disruption-budget",
    ),
    pytest.param(
        {
            "controller": {
                "metrics": {
                    "serviceMonitor": {"enabled": True, "interval": "1m", "scrapeTimeout": "90s"}
                }
            }
        },
        "controller.metrics.serviceMonitor.scrapeTimeout (90s) must not exceed "
        "controller.metrics.serviceMonitor.interval (1m)",
        id="scrape-timeout-over-the-interval",
    ),
    pytest.param(
        {
            "controller": {"config": {"restoreWaitS": 4.0}},
            "workers": {"enabled": True, "model": {"name": "m"}},
        },
        "controller.config.restoreWaitS (4) must be at least workers.agent.heartbeatIntervalS (5)",
        id="restore-before-the-heartbeats-are-back",
    ),
    *(
        pytest.param(
            {
                "workers": {
                    "enabled": True,
                    "model": {"name": "m"},
                    "resources": {kind: {"nvidia.com/gpu": 2}},
                }
            },
            f"workers.resources.{kind}.nvidia.com/gpu (2) must equal workers.gpu.count (1)",
            id=f"gpu-{kind}-against-gpu-count",
        )
        for kind in ("requests", "limits")
    ),
    *(
        pytest.param(
            {"workers": {"enabled": True, "model": {"name": "m"}, "agent": {"heartbeatTtlS": ttl}}},
            f"workers.agent.heartbeatTtlS ({ttl}) must exceed workers.agent.heartbeatIntervalS (5)",
            id=f"heartbeat-ttl-{ttl}-within-its-interval",
        )
        for ttl in (5, 3)
    ),
    pytest.param(
        {"workers": {"enabled": True, "model": {"name": "m"}, "startupProbe": {"enabled": False}}},
        "workers.startupProbe.enabled=false leaves workers.livenessProbe probing GET /health "
        "from the engine's start, which answers only once the model is downloaded and loaded: "
        "a worker whose model takes more than 60 s",
        id="liveness-during-the-model-load",
    ),
    pytest.param(
        {
            "controller": {
                "metrics": {
                    "grafanaDashboard": {"enabled": True, "labels": {"grafana_dashboard": "x"}}
                }
            }
        },
        "controller.metrics.grafanaDashboard.labels must not set grafana_dashboard: the chart "
        "sets it to sidecarLabelValue",
        id="dashboard-label-twice",
    ),
    pytest.param(
        {"controller": {"config": {"rateMin": 10, "rateMax": 1}}},
        "controller.config.rateMin (10) must not exceed controller.config.rateMax (1)",
        id="inverted-rate-bounds",
    ),
    pytest.param(
        {"controller": {"config": {"lifeMinS": 100, "lifeMaxS": 1}}},
        "controller.config.lifeMinS (100) must not exceed controller.config.lifeMaxS (1)",
        id="inverted-life-bounds",
    ),
    pytest.param(
        {"controller": {"config": {"maxCategories": 100, "maxCategoriesPerWorker": 200}}},
        "controller.config.maxCategoriesPerWorker (200) must not exceed "
        "controller.config.maxCategories (100)",
        id="worker-categories-over-the-window",
    ),
]


def test_an_install_without_an_image_fails_saying_to_build_one() -> None:
    """No kvwise image is published: the default names none, and an install that names none
    fails saying how to get one, instead of pulling nothing (or someone else's image)."""
    assert (
        yaml.safe_load((hs.CHART / "values.yaml").read_text())["controller"]["image"]["repository"]
        == ""
    )
    with pytest.raises(helm.HelmError) as err:
        hs.render(hs.chart(), {"controller": {"image": {"repository": ""}}})
    assert "build helm/Dockerfile, push it and set controller.image.repository" in str(err.value)


@pytest.mark.parametrize(("bad", "says"), BAD_COMBINATIONS)
def test_bad_combinations_fail_with_what_to_set(bad: dict[str, Any], says: str) -> None:
    with pytest.raises(helm.HelmError) as err:
        hs.render(hs.chart(), bad)
    assert says in str(err.value)


@pytest.mark.parametrize("args", [["--maxmemory", "1600mb"], ["--maxmemory 1600mb"]])
def test_a_redis_memory_limit_with_maxmemory_renders(args: list[str]) -> None:
    redis_values = {"resources": {"limits": {"memory": "2Gi"}}, "extraArgs": args}
    r = hs.render(hs.chart(), {"redis": redis_values})
    assert hs.container(r.component("StatefulSet", "redis"), "redis")["args"][-len(args) :] == args


@pytest.mark.parametrize("namespace", ["", "ml"])
def test_a_read_token_scrape_from_the_release_namespace_renders(namespace: str) -> None:
    monitor = {"enabled": True, "namespace": namespace}
    auth = {"readToken": {"enabled": True}}
    r = hs.render(
        hs.chart(), {"controller": {"auth": auth, "metrics": {"serviceMonitor": monitor}}}
    )
    (sm,) = r.of_kind("ServiceMonitor")
    secret = sm["spec"]["endpoints"][0]["authorization"]["credentials"]["name"]
    assert sm["metadata"]["namespace"] == "ml"
    assert r.get("Secret", secret)["metadata"]["namespace"] == "ml"


def test_a_read_token_scrape_elsewhere_renders_with_an_existing_secret() -> None:
    """An existing Secret may be copied into the ServiceMonitor's namespace (docs/deploy.md)."""
    monitor = {"enabled": True, "namespace": "monitoring"}
    auth = {"existingSecret": "kvwise-tokens", "readToken": {"enabled": True}}
    r = hs.render(
        hs.chart(), {"controller": {"auth": auth, "metrics": {"serviceMonitor": monitor}}}
    )
    assert r.of_kind("ServiceMonitor")[0]["metadata"]["namespace"] == "monitoring"


@pytest.mark.parametrize(
    ("replicas", "pdb"),
    [
        (0, {"minAvailable": 1}),
        (2, {"minAvailable": 1}),
        (2, {"minAvailable": "50%"}),
        (1, {"maxUnavailable": 1}),
        (2, {"maxUnavailable": "10%"}),
        (2, {"maxUnavailable": "100%"}),
    ],
)
def test_a_pdb_that_lets_a_drain_through_renders(replicas: int, pdb: dict[str, Any]) -> None:
    values = {"controller": {"replicaCount": replicas, "pdb": pdb}}
    (rendered,) = hs.render(hs.chart(), values).of_kind("PodDisruptionBudget")
    assert rendered["spec"].items() >= pdb.items()


def api_server_takes_disruption_figure(figure: int | str) -> bool:
    """A PodDisruptionBudget's minAvailable or maxUnavailable as the API server checks it:
    a whole number, or a percentage of at most 100 (ValidatePositiveIntOrPercent, then
    IsNotMoreThan100Percent, pkg/apis/policy/validation)."""
    if isinstance(figure, int):
        return figure >= 0
    return re.fullmatch(r"[0-9]+%", figure) is not None and int(figure[:-1]) <= 100


@pytest.mark.parametrize("key", ["minAvailable", "maxUnavailable"])
@pytest.mark.parametrize(
    "figure", [0, 1, "0%", "50%", "100%", "0100%", "101%", "150%", "1000%", "-5%", "5", "%"]
)
def test_schema_takes_the_disruption_figures_the_api_server_takes(
    key: str, figure: int | str
) -> None:
    """A figure the API server refuses would fail the install half way (the PDB last):
    the schema refuses it first. With no PDB created, only the schema judges it."""
    values = {"controller": {"pdb": {"create": False, key: figure}}}
    try:
        hs.render(hs.chart(), values)
        schema_takes = True
    except helm.HelmValuesError as err:
        assert f"at '/controller/pdb/{key}'" in str(err)
        schema_takes = False
    assert schema_takes == api_server_takes_disruption_figure(figure)


def test_a_liveness_probe_without_the_startup_probe_is_refused_only_for_workers_run() -> None:
    """Both probes off, or the workers off, render: only a liveness probe counting the
    model's load as failures is refused (BAD_COMBINATIONS)."""
    probes_off = {"startupProbe": {"enabled": False}, "livenessProbe": {"enabled": False}}
    r = hs.render(hs.chart(), {"workers": {"enabled": True, "model": {"name": "m"}, **probes_off}})
    engine = hs.container(r.component("Deployment", "worker"), "vllm")
    assert "livenessProbe" not in engine and "startupProbe" not in engine
    assert hs.render(hs.chart(), {"workers": {"startupProbe": {"enabled": False}}}).manifests


def test_a_scrape_timeout_within_the_interval_renders() -> None:
    monitor = {"enabled": True, "interval": "1m", "scrapeTimeout": "59s"}
    r = hs.render(hs.chart(), {"controller": {"metrics": {"serviceMonitor": monitor}}})
    (endpoint,) = r.of_kind("ServiceMonitor")[0]["spec"]["endpoints"]
    assert (endpoint["interval"], endpoint["scrapeTimeout"]) == ("1m", "59s")


@pytest.mark.parametrize("url", ["redis://h:6379", "redis://h:6379/", "rediss://h:6380/0"])
def test_a_cluster_url_on_database_0_renders(url: str) -> None:
    external = {"url": url, "cluster": True}
    r = hs.render(hs.chart(), {"redis": {"enabled": False, "external": external}})
    env = hs.container(r.component("Deployment", "controller"), "controller")["env"]
    assert {"name": "KVWISE_REDIS_CLUSTER", "value": "true"} in env


def test_agent_batches_are_bounded_by_half_the_buffer() -> None:
    """The agent sends at most half its buffer per entry, whatever batchEvents says."""
    agent = {"batchEvents": 100000, "bufferEvents": 131072}
    r = hs.render(
        hs.chart(), {"workers": {"enabled": True, "model": {"name": "m"}, "agent": agent}}
    )
    assert r.component("Deployment", "worker")


def test_an_open_api_renders_when_asked_for() -> None:
    config = {"allowOpenApi": True}
    r = hs.render(hs.chart(), {"controller": {"auth": {"enabled": False}, "config": config}})
    env = hs.container(r.component("Deployment", "controller"), "controller").get("env", [])
    assert "KVWISE_API_TOKEN" not in {e["name"] for e in env}


@pytest.mark.parametrize(
    "device", ["cpu", "cuda", "cuda:0", "cuda:12", "xpu:1", "mps", "tpu", "CUDA", "cuda:x", "cuda "]
)
def test_schema_takes_the_devices_the_agent_takes(device: str) -> None:
    """A device the agent refuses at start is refused at install."""
    try:
        AgentSettings(device=device)
        agent_takes = True
    except ValidationError:
        agent_takes = False
    assert bool(re.search(pattern_at("workers", "agent", "device"), device)) == agent_takes


# --- the settings mirror ----------------------------------------------------------------------
def test_controller_values_mirror_controller_settings_one_to_one() -> None:
    fields = ControllerSettings.model_fields
    secret = {f for f, info in fields.items() if "SecretStr" in str(info.annotation)}
    assert secret <= set(POD_ENV_FIELDS), f"secret settings not handled by the chart: {secret}"
    config = raw_values()["controller"]["config"]
    assert set(config) == {camel(f) for f in fields if f not in POD_ENV_FIELDS}
    for field, info in fields.items():
        if field in POD_ENV_FIELDS:
            continue
        default = info.get_default(call_default_factory=True)
        expected = CONTROLLER_DEFAULT_OVERRIDES.get(field, default)
        assert config[camel(field)] == expected, field


def test_agent_values_mirror_agent_settings_one_to_one() -> None:
    fields = AgentSettings.model_fields
    agent = raw_values()["workers"]["agent"]
    assert set(agent) == {camel(f) for f in fields if f not in AGENT_DERIVED}
    for field, info in fields.items():
        if field not in AGENT_DERIVED:
            expected = AGENT_DEFAULT_OVERRIDES.get(
                field, info.get_default(call_default_factory=True)
            )
            assert agent[camel(field)] == expected, field


def _bounds(info: Any) -> dict[str, float]:
    names = {"ge": "minimum", "gt": "exclusiveMinimum", "le": "maximum", "lt": "exclusiveMaximum"}
    out: dict[str, float] = {}
    for item in info.metadata:
        for attr, key in names.items():
            if getattr(item, attr, None) is not None:
                out[key] = getattr(item, attr)
    return out


@pytest.mark.parametrize(
    ("settings", "schema_path", "skip"),
    [
        (ControllerSettings, ("controller", "config"), set(POD_ENV_FIELDS)),
        (AgentSettings, ("workers", "agent"), AGENT_DERIVED),
    ],
    ids=["controller", "agent"],
)
def test_schema_constraints_match_the_settings(
    settings: Any, schema_path: tuple[str, ...], skip: set[str]
) -> None:
    node = schema_entry(*schema_path)
    for field, info in settings.model_fields.items():
        if field in skip:
            continue
        prop = node["properties"][camel(field)]
        assert prop["description"] == env_name(field)
        types = {
            "integer": int,
            "number": float,
            "string": str,
            "boolean": bool,
            "null": type(None),
        }
        declared = prop["type"] if isinstance(prop["type"], list) else [prop["type"]]
        annotation = info.annotation
        if typing.get_origin(annotation) is typing.Literal:
            assert prop["enum"] == list(typing.get_args(annotation)), field
            continue
        wanted = set(typing.get_args(annotation)) or {annotation}
        assert {types[t] for t in declared} == wanted, field
        got = {
            k: prop[k]
            for k in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum")
            if k in prop
        }
        assert got == _bounds(info), field


# --- docs and image -------------------------------------------------------------------------
def test_every_value_has_a_param_comment() -> None:
    values = raw_values()
    documented = [p.path for p in hs.params()]
    assert len(documented) == len(set(documented)), "a @param appears twice"
    for path in documented:
        hs.lookup(values, path)  # raises KeyError for a @param without a value
    undocumented = [
        leaf
        for leaf in hs.leaves(values)
        if not any(leaf == p or leaf.startswith(p + ".") for p in documented)
    ]
    assert undocumented == []


# Worker values only one engine reads; every other worker value serves both.
VLLM_ONLY_VALUES = ("workers.image.", "workers.vllmPlugins")


def test_worker_values_both_engines_read_do_not_name_one_engine() -> None:
    """The chart runs vLLM or SGLang workers: a value both read must not be described as
    vLLM's, nor must the NOTES tell users that only vLLM pods can join."""
    named = [
        p.path
        for p in hs.params()
        if p.path.startswith("workers.")
        and not p.path.startswith(VLLM_ONLY_VALUES)
        and "vllm" in p.description.lower()
        and "sglang" not in p.description.lower()
    ]
    assert named == []
    assert "Your own vLLM pods" not in hs.rendered("sglang-workers").notes


def test_deploy_doc_values_table_is_generated_from_the_param_comments() -> None:
    assert hs.doc_table() == hs.values_table(), (
        "docs/deploy.md is stale: python -m tests.integration.helm_support docs/deploy.md"
    )


def test_dockerfile_matches_the_chart() -> None:
    text = (REPO / "helm" / "Dockerfile").read_text()
    values = raw_values()
    assert re.search(r"^ARG PYTHON_IMAGE=python:3\.11-slim$", text, re.M)
    uid = values["controller"]["podSecurityContext"]["runAsUser"]
    assert re.search(rf"^USER {uid}:{uid}$", text, re.M)
    assert 'ENTRYPOINT ["kvwise", "controller"]' in text
    deploy = (hs.CHART / "templates" / "workers" / "deployment.yaml").read_text()
    bundle = re.search(r"--target (\S+)", text)
    assert bundle is not None and f'"{bundle.group(1)}/."' in deploy


def test_the_image_installs_the_versions_ci_tested() -> None:
    """The image's dependencies are pinned by tests/constraints.txt (what CI ran), which its
    build context lets in; without it each build resolves pyproject.toml's ranges anew."""
    text = (REPO / "helm" / "Dockerfile").read_text()
    copied = re.search(r"^COPY tests/constraints\.txt (\S+)$", text, re.M)
    assert copied is not None
    (install,) = re.findall(r"pip install (.*/wheels/kvwise-\*\.whl) \\$", text, re.M)
    assert install.startswith(f"-c {copied.group(1)} ")
    ignored = (REPO / "helm" / "Dockerfile.dockerignore").read_text().splitlines()
    assert ignored.index("!tests/constraints.txt") > ignored.index("*")


@pytest.mark.parametrize(
    ("release", "claim"), [("kvwise", "data-kvwise-redis-0"), ("kv", "data-kv-kvwise-redis-0")]
)
def test_the_redis_pvc_name_in_the_deploy_doc_is_the_one_rendered(release: str, claim: str) -> None:
    redis = hs.render(hs.chart(), {}, name=release).component("StatefulSet", "redis")
    (template,) = redis["spec"]["volumeClaimTemplates"]
    assert f"{template['metadata']['name']}-{redis['metadata']['name']}-0" == claim
    doc = hs.DEPLOY_DOC.read_text()
    assert "delete pvc data-kvwise-redis-0` for the release `kvwise`" in doc

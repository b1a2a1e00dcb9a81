"""Helpers of the Helm chart tests: render with Helm's Go SDK, resolve a container's env
the way the kubelet does, match label selectors, read the chart's ``## @param`` comments.

Owns no assertions; ``test_helm_chart.py`` decides what must hold. Rendering goes through
``helm_python`` (the helm-python-sdk package: Helm v4's Go SDK over a C ABI), so no helm
binary and no cluster are involved.

Run as a script it regenerates the values table of docs/deploy.md from values.yaml:
``python -m tests.integration.helm_support docs/deploy.md``.
"""

from __future__ import annotations

import base64
import copy
import functools
import os
import re
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REPO

CHART = REPO / "helm" / "kvwise"
DEPLOY_DOC = REPO / "docs" / "deploy.md"
TABLE_START = "<!-- values-table:start (generated from helm/kvwise/values.yaml) -->"
TABLE_END = "<!-- values-table:end -->"

NAMESPACE, RELEASE, FULLNAME = "ml", "kv", "kv-kvwise"
# No kvwise image is published: every install names one built from helm/Dockerfile.
LOCAL_IMAGE = "registry.example/kvwise"
POD = "kv-kvwise-x-0"  # the pod name a fieldRef to metadata.name resolves to
CASE_FILES: dict[str, Path | None] = {
    "default": None,
    **{
        p.name.removesuffix("-values.yaml"): p for p in sorted((CHART / "ci").glob("*-values.yaml"))
    },
    "example-llama3-8b": CHART / "examples" / "values-llama3-8b.yaml",
}
CASES = list(CASE_FILES)

# ControllerSettings fields that each pod sets itself instead of the ConfigMap, and why.
POD_ENV_FIELDS = {
    "redis_url": "carries the Redis credentials: composed from the redis values and a Secret",
    "api_token": "a Secret (controller.auth)",
    "api_read_token": "a Secret (controller.auth.readToken)",
    "consumer_name": "one per replica: the pod name",
    "redis_cluster": "from the redis values (redis.external.cluster), like the URL",
}
# AgentSettings fields the chart derives instead of taking them from workers.agent.
AGENT_DERIVED = {"redis_url", "redis_cluster", "key_prefix", "worker_id"}

Manifest = dict[str, Any]


def camel(field: str) -> str:
    head, *rest = field.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def snake(key: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", key).lower()


def env_name(field: str) -> str:
    return f"KVWISE_{field.upper()}"


def case_values(case: str) -> dict[str, Any]:
    path = CASE_FILES[case]
    return {} if path is None else dict(yaml.safe_load(path.read_text()))


def load_settings(cls: Any, env: Mapping[str, str], monkeypatch: pytest.MonkeyPatch) -> Any:
    """Build a settings object from ``env`` alone, as the process in the pod would."""
    for key in [k for k in os.environ if k.startswith("KVWISE_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return cls()


# --- rendering -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Rendered:
    """One release rendered offline: its manifests (parsed) and its NOTES.txt."""

    values: dict[str, Any]  # the merged values Helm rendered with
    manifests: tuple[Manifest, ...]
    notes: str

    def of_kind(self, kind: str) -> list[Manifest]:
        return [m for m in self.manifests if m["kind"] == kind]

    def get(self, kind: str, name: str) -> Manifest:
        found = [m for m in self.of_kind(kind) if m["metadata"]["name"] == name]
        assert len(found) == 1, f"{kind}/{name}: {len(found)} rendered"
        return found[0]

    def component(self, kind: str, component: str) -> Manifest:
        found = [
            m
            for m in self.of_kind(kind)
            if m["metadata"]["labels"].get("app.kubernetes.io/component") == component
        ]
        assert len(found) == 1, f"{kind} of component {component}: {len(found)} rendered"
        return found[0]

    def workloads(self) -> list[Manifest]:
        """Every manifest that carries a pod spec."""
        return [m for m in self.manifests if m["kind"] in ("Deployment", "StatefulSet", "Pod")]


def render(
    chart: Any, values: dict[str, Any], *, name: str = "kv", namespace: str = "ml"
) -> Rendered:
    """Render ``chart`` (a ``helm_python.Chart``) as an install would, naming the local
    image where ``values`` name none (an explicit ``repository`` is kept, even empty)."""
    values = with_image(values)
    out = chart.render(values=values, name=name, namespace=namespace, is_install=True)
    docs: list[Manifest] = []
    notes = ""
    for path, text in sorted(out.items()):
        if path.endswith("NOTES.txt"):
            notes = text
            continue
        docs.extend(d for d in yaml.safe_load_all(text) if d)
    return Rendered(chart.merge_values(values), tuple(docs), notes)


def with_image(values: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``values`` with controller.image.repository set to ``LOCAL_IMAGE`` if absent."""
    out = copy.deepcopy(dict(values))
    controller = out.setdefault("controller", {})
    controller.setdefault("image", {}).setdefault("repository", LOCAL_IMAGE)
    return out


@functools.cache
def chart() -> Any:
    """The chart, loaded once per test session (a ``helm_python.Chart``)."""
    import helm_python

    return helm_python.Chart.load(CHART)


@functools.cache
def rendered(case: str) -> Rendered:
    return render(chart(), case_values(case), name=RELEASE, namespace=NAMESPACE)


def existing_secrets(v: Mapping[str, Any]) -> dict[tuple[str, str], str]:
    """Stand-in values for the Secrets the values say already exist in the cluster."""
    refs: list[tuple[str, str]] = []
    auth, rv, w = v["controller"]["auth"], v["redis"], v["workers"]
    if auth["enabled"] and auth["existingSecret"]:
        refs.append((auth["existingSecret"], auth["existingSecretKey"]))
    if rv["enabled"] and rv["auth"]["existingSecret"]:
        refs.append((rv["auth"]["existingSecret"], rv["auth"]["existingSecretPasswordKey"]))
    ext, tls = rv["external"], rv["external"]["tls"]
    if not rv["enabled"] and ext["existingSecret"]:
        keys = ("existingSecretPasswordKey", "existingSecretUsernameKey")
        refs += [(ext["existingSecret"], ext[k]) for k in keys if ext[k]]
    if not rv["enabled"] and tls["existingSecret"]:
        refs += [(tls["existingSecret"], tls[k]) for k in ("caKey", "certKey", "keyKey") if tls[k]]
    if w["enabled"] and w["model"]["hfTokenSecret"]:
        refs.append((w["model"]["hfTokenSecret"], w["model"]["hfTokenSecretKey"]))
    return {(name, key): f"standin-{key.replace('.', '-')}" for name, key in refs}


def all_secrets(r: Rendered) -> dict[tuple[str, str], str]:
    return secret_data(r, existing_secrets(r.values))


def pod_spec(workload: Manifest) -> dict[str, Any]:
    spec: dict[str, Any] = workload["spec"]
    return spec if workload["kind"] == "Pod" else spec["template"]["spec"]


def pod_labels(workload: Manifest) -> dict[str, str]:
    if workload["kind"] == "Pod":
        return dict(workload["metadata"]["labels"])
    return dict(workload["spec"]["template"]["metadata"]["labels"])


def container(workload: Manifest, name: str) -> dict[str, Any]:
    spec = pod_spec(workload)
    found = [c for c in spec["containers"] + spec.get("initContainers", []) if c["name"] == name]
    assert len(found) == 1, f"container {name}: {len(found)}"
    return found[0]


def selects(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A LabelSelector (matchLabels and matchExpressions) or a Service's plain map."""
    if "matchLabels" not in selector and "matchExpressions" not in selector:
        selector = {"matchLabels": selector}
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, vals = expr["key"], expr["operator"], expr.get("values", [])
        ok = {
            "In": key in labels and labels[key] in vals,
            "NotIn": key not in labels or labels[key] not in vals,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


def admits(peer: Mapping[str, Any], namespace: str, labels: Mapping[str, str]) -> bool:
    """Whether a NetworkPolicyPeer of a policy in ``NAMESPACE`` admits a pod with ``labels``
    in ``namespace`` (namespaces carry only their kubernetes.io/metadata.name label)."""
    if "ipBlock" in peer:
        return False
    if "namespaceSelector" in peer:
        namespace_labels = {"kubernetes.io/metadata.name": namespace}
        if not selects(peer["namespaceSelector"], namespace_labels):
            return False
    elif namespace != NAMESPACE:
        return False
    return selects(peer.get("podSelector") or {}, labels)


# --- the kubelet's view of a container's environment ------------------------------------------
_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def secret_data(
    rendered: Rendered, stand_ins: Mapping[tuple[str, str], str]
) -> dict[tuple[str, str], str]:
    """(secret, key) -> value: rendered Secrets decoded, plus stand-ins for existing ones."""
    data = dict(stand_ins)
    for s in rendered.of_kind("Secret"):
        for key, b64 in (s.get("data") or {}).items():
            data[(s["metadata"]["name"], key)] = base64.b64decode(b64).decode()
        for key, value in (s.get("stringData") or {}).items():
            data[(s["metadata"]["name"], key)] = value
    return data


def resolve_env(
    rendered: Rendered,
    ctr: Mapping[str, Any],
    *,
    pod_name: str,
    secrets: Mapping[tuple[str, str], str],
) -> dict[str, str]:
    """The environment the container sees: envFrom first, then env in order, with
    ``$(VAR)`` expanded against what is already defined (unknown references stay as they
    are, as in Kubernetes). A reference to a missing Secret or ConfigMap key raises."""
    env: dict[str, str] = {}
    for src in ctr.get("envFrom", []):
        if "configMapRef" in src:
            cm = rendered.get("ConfigMap", src["configMapRef"]["name"])
            env.update({k: str(v) for k, v in cm["data"].items()})
        else:
            name = src["secretRef"]["name"]
            env.update({k: v for (s, k), v in secrets.items() if s == name})
    for item in ctr.get("env", []):
        if "value" in item:
            env[item["name"]] = _REF.sub(lambda m: env.get(m.group(1), m.group(0)), item["value"])
            continue
        ref = item["valueFrom"]
        if "secretKeyRef" in ref:
            key = (ref["secretKeyRef"]["name"], ref["secretKeyRef"]["key"])
            if key not in secrets:
                raise KeyError(f"env {item['name']}: secret {key[0]} has no key {key[1]}")
            env[item["name"]] = secrets[key]
        elif "configMapKeyRef" in ref:
            cm = rendered.get("ConfigMap", ref["configMapKeyRef"]["name"])
            env[item["name"]] = str(cm["data"][ref["configMapKeyRef"]["key"]])
        elif ref.get("fieldRef", {}).get("fieldPath") == "metadata.name":
            env[item["name"]] = pod_name
        else:
            raise AssertionError(f"env {item['name']}: unexpected source {ref}")
    return env


# --- values.yaml's @param comments and the docs table -------------------------------------------
@dataclass(frozen=True)
class Param:
    section: str
    path: str
    description: str


def params(values_file: Path = CHART / "values.yaml") -> list[Param]:
    """The ``## @param path description`` lines, in file order, with their ``@section``."""
    out: list[Param] = []
    section = ""
    for line in values_file.read_text().splitlines():
        text = line.strip()
        if text.startswith("## @section "):
            section = text.removeprefix("## @section ").strip()
        elif text.startswith("## @param "):
            path, _, desc = text.removeprefix("## @param ").partition(" ")
            out.append(Param(section, path, desc.strip()))
    return out


def lookup(values: Mapping[str, Any], path: str) -> Any:
    node: Any = values
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            raise KeyError(path)
        node = node[part]
    return node


def leaves(values: Mapping[str, Any], prefix: str = "") -> Iterator[str]:
    """Dotted paths of every value that is not a non-empty mapping."""
    for key, value in values.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            yield from leaves(value, path + ".")
        else:
            yield path


def _default(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
    text = text.removesuffix("...").strip()
    return f"`{text}`"


def values_table(values_file: Path = CHART / "values.yaml") -> str:
    """Markdown tables (one per ``@section``) of every parameter with its default."""
    values = yaml.safe_load(values_file.read_text())
    lines: list[str] = []
    section = None
    for p in params(values_file):
        if p.section != section:
            section = p.section
            lines += [
                "",
                f"#### {section}",
                "",
                "| Name | Description | Default |",
                "| --- | --- | --- |",
            ]
        desc = p.description.replace("|", "\\|")
        lines.append(f"| `{p.path}` | {desc} | {_default(lookup(values, p.path))} |")
    return "\n".join(lines).strip() + "\n"


def doc_table(doc: Path = DEPLOY_DOC) -> str:
    text = doc.read_text()
    start, end = text.index(TABLE_START) + len(TABLE_START), text.index(TABLE_END)
    return text[start:end].strip() + "\n"


def write_table(doc: Path = DEPLOY_DOC) -> None:
    text = doc.read_text()
    start, end = text.index(TABLE_START) + len(TABLE_START), text.index(TABLE_END)
    doc.write_text(text[:start] + "\n\n" + values_table() + "\n" + text[end:])


if __name__ == "__main__":
    write_table(Path(sys.argv[1]) if len(sys.argv) > 1 else DEPLOY_DOC)

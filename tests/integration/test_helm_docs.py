"""The Helm commands the docs tell an operator to run, run in their order against the chart.

Each ``bash`` block of a doc is read as the operator would paste it: ``helm install``,
``helm upgrade`` (with ``--install``, ``--reuse-values``, ``-f`` and ``--set``) and the
``kubectl`` commands that need a namespace. The releases and namespaces they create are
tracked, so a command Helm or kubectl would refuse at that point (a second ``helm install``
of a release the doc installed already, a namespace never created) fails here; every
install and upgrade is rendered with Helm's Go SDK from the values it would give.
"""

from __future__ import annotations

import re
import shlex
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest

from tests.conftest import REPO
from tests.integration import helm_support as hs

DOCS = [REPO / "docs" / "deploy.md", REPO / "README.md", hs.CHART / "README.md"]


def commands(doc: Path) -> Iterator[tuple[int, list[str]]]:
    """(line, argv) of every command in the doc's bash blocks, continuations joined."""
    text = doc.read_text()
    for block in re.finditer(r"```bash\n(.*?)```", text, re.S):
        line = text[: block.start()].count("\n") + 2
        pending, start = "", line
        for raw in block.group(1).splitlines():
            if not pending:
                start = line
            line += 1
            if raw.endswith("\\"):
                pending += raw[:-1] + " "
                continue
            argv = shlex.split(pending + raw, comments=True)
            pending = ""
            if argv:
                yield start, argv


# Helm 3 (and 4) upgrade with --reuse-values on the old release's chart defaults, not the
# new chart's: a value added since is missing, and the schema, which requires every value,
# refuses the upgrade (test_a_value_missing_from_the_defaults_is_refused).
REUSE_VALUES = "renders the new chart on the old chart's defaults, which lack any value added since"
# Options of helm and kubectl that take a value (the rest are flags or positional).
TAKES_VALUE = {"-n", "--namespace", "-f", "--values", "--set", "--set-string", "-o", ">"}


def parse(argv: list[str]) -> tuple[list[str], list[tuple[str, str]], set[str]]:
    """Positional arguments, (option, value) pairs in order, and flags."""
    positional: list[str] = []
    options: list[tuple[str, str]] = []
    flags: set[str] = set()
    args = iter(argv)
    for arg in args:
        if arg in TAKES_VALUE:
            options.append((arg, next(args)))
        elif arg.startswith("-"):
            flags.add(arg)
        else:
            positional.append(arg)
    return positional, options, flags


def merged(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


def run_doc(doc: Path) -> list[str]:
    """Play the doc's commands in order; what Helm or kubectl would refuse, as messages."""
    releases: dict[tuple[str, str], dict[str, Any]] = {}
    namespaces = {"default"}
    refused: list[str] = []
    saved: dict[str, dict[str, Any]] = {}  # files written by helm get values
    for line, argv in commands(doc):
        positional, options, flags = parse(argv)
        where = f"{doc.name}:{line} {' '.join(positional[:3])}"
        namespace = next((v for o, v in options if o in ("-n", "--namespace")), "default")
        if positional[0] == "kubectl":
            if positional[1:3] == ["create", "namespace"]:
                namespaces.add(positional[3])
            elif namespace not in namespaces:
                refused.append(f"{where}: namespace {namespace} does not exist yet")
            continue
        target = next((v for o, v in options if o == ">"), None)
        if positional[:3] == ["helm", "get", "values"] and target:
            saved[target] = releases[(namespace, positional[3])]
            continue
        if positional[0] != "helm" or positional[1] not in ("install", "upgrade"):
            continue
        if "--reuse-values" in flags:
            refused.append(f"{where}: --reuse-values {REUSE_VALUES}")
            continue
        release, exists = positional[2], (namespace, positional[2]) in releases
        if positional[1] == "install" and exists:
            refused.append(f"{where}: release {release} is in use in {namespace} already")
            continue
        if positional[1] == "upgrade" and "--install" not in flags and not exists:
            refused.append(f"{where}: no release {release} in {namespace} to upgrade")
            continue
        if not exists and namespace not in namespaces:
            if "--create-namespace" not in flags:
                refused.append(f"{where}: namespace {namespace} does not exist yet")
                continue
            namespaces.add(namespace)
        values: dict[str, Any] = {}
        own_file = False  # the operator's own values file (my-values.yaml): not rendered
        for option, value in options:
            if option in ("-f", "--values") and value in saved:
                values = merged(values, saved[value])
            elif option in ("-f", "--values"):
                path = REPO / value
                own_file = own_file or not path.exists()
                if path.exists():
                    values = merged(values, helm.values_from_yaml(path.read_text()))
            elif option == "--set":
                values = merged(values, helm.parse_set_string(value))
        if not own_file:
            hs.render(hs.chart(), values, name=release, namespace=namespace)
        releases[(namespace, release)] = values
    return refused


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_the_docs_helm_commands_run_in_order(doc: Path) -> None:
    assert run_doc(doc) == []


def test_what_helm_and_kubectl_would_refuse_is_caught(tmp_path: Path) -> None:
    image = "--set controller.image.repository=registry.example/kvwise"
    install = f"helm install kv helm/kvwise -n ml --create-namespace \\\n  {image}\n"
    doc = tmp_path / "doc.md"
    doc.write_text(
        f"```bash\nkubectl -n ml create secret generic s\n{install}```\n\n"
        f"```bash\n{install}helm upgrade other helm/kvwise -n ml {image}\n```\n"
    )
    assert run_doc(doc) == [
        "doc.md:2 kubectl create secret: namespace ml does not exist yet",
        "doc.md:8 helm install kv: release kv is in use in ml already",
        "doc.md:10 helm upgrade other: no release other in ml to upgrade",
    ]


def test_a_value_missing_from_the_defaults_is_refused(tmp_path: Path) -> None:
    """What --reuse-values does to an upgrade to a chart that added a value: the new
    templates render on the old defaults, and the schema names the missing one."""
    chart = tmp_path / "kvwise"
    shutil.copytree(hs.CHART, chart)
    defaults = chart / "values.yaml"
    defaults.write_text(defaults.read_text().replace("  shmSizeLimit: 8Gi\n", ""))
    old = helm.Chart.load(chart)
    with pytest.raises(helm.HelmValuesError) as err:
        hs.render(old, {})
    assert "shmSizeLimit" in str(err.value)


def test_an_upgrade_on_saved_values_renders_and_reuse_values_is_caught(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text(
        "```bash\n"
        "helm install kv helm/kvwise -n ml --create-namespace \\\n"
        "  --set controller.image.repository=registry.example/kvwise\n"
        "helm get values kv -n ml -o yaml > kv-values.yaml\n"
        "helm upgrade kv helm/kvwise -n ml -f kv-values.yaml --set controller.replicaCount=2\n"
        "helm upgrade kv helm/kvwise -n ml --reuse-values --set controller.replicaCount=3\n"
        "```\n"
    )
    assert run_doc(doc) == [f"doc.md:6 helm upgrade kv: --reuse-values {REUSE_VALUES}"]

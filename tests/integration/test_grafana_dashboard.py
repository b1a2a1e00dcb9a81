"""The Grafana dashboard shipped in the Helm chart (helm/kvwise/dashboards/).

Three things hold: the chart renders it into a ConfigMap that Grafana's dashboard sidecar
picks up (label configurable, off by default); the JSON is a valid dashboard model (checked
against a schema written from Grafana's documented JSON model, plus what a schema cannot
say: panels inside the 24-column grid and not overlapping, unique ids and refIds, every
variable defined); and every metric and label it queries is one a real controller exports,
read from the live ``/metrics`` of a controller fed by a real worker (an ``Agent`` replaying
a synthetic trace), each PromQL expression parsed by a real PromQL parser.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import helm_python as helm
import jsonschema
import pytest

from tests.integration import helm_support as hs

DASHBOARD_FILE = hs.CHART / "dashboards" / "kvwise-controller.json"
CONFIGMAP_KEY = "kvwise-controller.json"
COMPONENT = "grafana-dashboard"
# Labels Prometheus adds to every scraped series (the target's, from a ServiceMonitor).
TARGET_LABELS = {"job", "instance", "namespace", "pod", "service", "endpoint", "container"}
# Grafana's own variables, replaced by a value of their kind before parsing.
GRAFANA_BUILTINS = {"$__rate_interval": "1m", "$__interval": "1m", "$__range": "1h"}
# What issue 15 asks the dashboard to show, as the metric that shows it.
REQUIRED_METRICS = {
    "ingest rate": "kvwise_ingest_events_total",
    "drops": "kvwise_agent_events_dropped",
    "gaps": "kvwise_ingest_gap_batches",
    "dead letters": "kvwise_ingest_dead_letters_total",
    "refit outcomes": "kvwise_refits_total",
    "versions": "kvwise_policy_version",
    "per-worker hit ratio": "kvwise_agent_hit_ratio",
    "per-worker applied version": "kvwise_agent_applied_version",
}


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD_FILE.read_text())
    return loaded


def _configmaps(r: hs.Rendered) -> list[hs.Manifest]:
    return [
        m
        for m in r.of_kind("ConfigMap")
        if m["metadata"]["labels"].get("app.kubernetes.io/component") == COMPONENT
    ]


# --- the chart ------------------------------------------------------------------------------
def test_off_by_default() -> None:
    assert _configmaps(hs.rendered("default")) == []
    values = hs.chart().merge_values({})
    assert values["controller"]["metrics"]["grafanaDashboard"]["enabled"] is False


def test_rendered_configmap_carries_the_dashboard_and_the_sidecar_label() -> None:
    (cm,) = _configmaps(hs.rendered("grafana-dashboard"))
    meta = cm["metadata"]
    assert meta["name"] == f"{hs.FULLNAME}-{COMPONENT}"
    assert meta["namespace"] == "monitoring"  # where that case's Grafana sidecar looks
    assert meta["labels"]["grafana_dashboard"] == "1"
    assert meta["annotations"] == {"grafana_folder": "kvwise"}
    assert json.loads(cm["data"][CONFIGMAP_KEY]) == dashboard()
    # A ConfigMap holds at most 1 MiB.
    assert len(cm["data"][CONFIGMAP_KEY].encode()) < 1 << 20


def test_sidecar_label_and_namespace_are_configurable() -> None:
    values = {
        "controller": {
            "metrics": {
                "grafanaDashboard": {
                    "enabled": True,
                    "sidecarLabel": "grafana.example.com/dashboard",
                    "sidecarLabelValue": "kvwise",
                    "labels": {"team": "inference"},
                }
            }
        }
    }
    (cm,) = _configmaps(hs.render(hs.chart(), values, name=hs.RELEASE, namespace=hs.NAMESPACE))
    labels = cm["metadata"]["labels"]
    assert labels["grafana.example.com/dashboard"] == "kvwise"
    assert labels["team"] == "inference"
    assert "grafana_dashboard" not in labels
    assert cm["metadata"]["namespace"] == hs.NAMESPACE


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ({"sidecarLabel": "not a label!"}, "/controller/metrics/grafanaDashboard/sidecarLabel"),
        ({"sidecarLabelValue": 1}, "/controller/metrics/grafanaDashboard/sidecarLabelValue"),
        ({"folder": "x"}, "additional properties 'folder' not allowed"),
    ],
    ids=["label-key", "label-value-not-a-string", "unknown-key"],
)
def test_bad_dashboard_values_are_rejected(bad: dict[str, Any], says: str) -> None:
    values = {"controller": {"metrics": {"grafanaDashboard": {"enabled": True, **bad}}}}
    with pytest.raises(helm.HelmValuesError) as err:
        hs.render(hs.chart(), values)
    assert says in str(err.value)


# --- the dashboard model ------------------------------------------------------------------------
_DATASOURCE = {
    "type": "object",
    "required": ["type", "uid"],
    "properties": {"type": {"const": "prometheus"}, "uid": {"const": "${datasource}"}},
}
_GRID_POS = {
    "type": "object",
    "required": ["x", "y", "w", "h"],
    "additionalProperties": False,
    "properties": {
        "x": {"type": "integer", "minimum": 0, "maximum": 23},
        "y": {"type": "integer", "minimum": 0},
        "w": {"type": "integer", "minimum": 1, "maximum": 24},
        "h": {"type": "integer", "minimum": 1},
    },
}
_TARGET = {
    "type": "object",
    "required": ["refId", "expr", "datasource"],
    "properties": {
        "refId": {"type": "string", "pattern": "^[A-Z]$"},
        "expr": {"type": "string", "minLength": 1},
        "legendFormat": {"type": "string"},
        "datasource": _DATASOURCE,
        "instant": {"type": "boolean"},
        "range": {"type": "boolean"},
    },
}
_PANEL = {
    "type": "object",
    "required": ["id", "type", "title", "gridPos"],
    "properties": {
        "id": {"type": "integer", "minimum": 1},
        "type": {"enum": ["row", "stat", "timeseries", "table", "gauge", "bargauge", "text"]},
        "title": {"type": "string", "minLength": 1},
        "description": {"type": "string"},
        "gridPos": _GRID_POS,
    },
    "if": {"properties": {"type": {"const": "row"}}},
    "then": {
        "required": ["collapsed", "panels"],
        "properties": {
            "collapsed": {"type": "boolean"},
            "panels": {"type": "array"},
            "gridPos": {"properties": {"x": {"const": 0}, "w": {"const": 24}, "h": {"const": 1}}},
        },
    },
    "else": {
        "required": ["datasource", "targets", "fieldConfig", "options"],
        "properties": {
            "datasource": _DATASOURCE,
            "targets": {"type": "array", "minItems": 1, "items": _TARGET},
            "fieldConfig": {
                "type": "object",
                "required": ["defaults", "overrides"],
                "properties": {
                    "defaults": {"type": "object"},
                    "overrides": {
                        "type": "array",
                        "items": {"type": "object", "required": ["matcher", "properties"]},
                    },
                },
            },
            "options": {"type": "object"},
        },
    },
}
_VARIABLE = {
    "type": "object",
    "required": ["name", "type"],
    "properties": {
        "name": {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$"},
        "type": {"enum": ["datasource", "query", "custom", "interval", "constant", "textbox"]},
    },
    "if": {"properties": {"type": {"const": "query"}}},
    "then": {"required": ["datasource", "query", "definition"]},
}
# From Grafana's documented dashboard JSON model (the top-level fields and panel basics).
DASHBOARD_SCHEMA = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "type": "object",
    "required": [
        "uid",
        "title",
        "tags",
        "timezone",
        "editable",
        "schemaVersion",
        "version",
        "time",
        "refresh",
        "templating",
        "annotations",
        "panels",
    ],
    "properties": {
        "id": {"type": "null"},  # set by Grafana on import; a provisioned file has none
        "uid": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,40}$"},
        "title": {"type": "string", "minLength": 1},
        "tags": {"type": "array", "items": {"type": "string"}},
        "timezone": {"enum": ["browser", "utc", ""]},
        "editable": {"type": "boolean"},
        "graphTooltip": {"enum": [0, 1, 2]},
        "schemaVersion": {"type": "integer", "minimum": 36},
        "version": {"type": "integer", "minimum": 0},
        "time": {
            "type": "object",
            "required": ["from", "to"],
            "properties": {"from": {"type": "string"}, "to": {"type": "string"}},
        },
        "refresh": {"type": "string", "pattern": "^([0-9]+[smhd])?$"},
        "templating": {
            "type": "object",
            "required": ["list"],
            "properties": {"list": {"type": "array", "items": _VARIABLE}},
        },
        "annotations": {
            "type": "object",
            "required": ["list"],
            "properties": {"list": {"type": "array"}},
        },
        "panels": {"type": "array", "minItems": 1, "items": _PANEL},
    },
}


def _panels(d: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel, rows' nested panels included."""
    out = []
    for p in d["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))
    return out


def _queries(d: dict[str, Any]) -> Iterator[tuple[str, str, str]]:
    """(panel title, expr, legendFormat) of every target."""
    for p in _panels(d):
        for t in p.get("targets", []):
            yield p["title"], t["expr"], t.get("legendFormat", "")


def _model_problems(d: dict[str, Any]) -> list[str]:
    """Where ``d`` is not a valid dashboard model: the schema, then the grid, ids, refIds
    and variables."""
    problems = [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
        for e in jsonschema.Draft7Validator(DASHBOARD_SCHEMA).iter_errors(d)
    ]
    if problems:
        return problems
    panels = _panels(d)
    ids = [p["id"] for p in panels]
    if len(ids) != len(set(ids)):
        problems.append("panel ids repeat")
    cells: dict[tuple[int, int], str] = {}
    for p in panels:
        g = p["gridPos"]
        if g["x"] + g["w"] > 24:
            problems.append(f"{p['title']}: beyond the 24-column grid")
        for cell in (
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        ):
            if cell in cells:
                problems.append(f"{p['title']} overlaps {cells[cell]}")
                break
            cells[cell] = p["title"]
        refs = [t["refId"] for t in p.get("targets", [])]
        if len(refs) != len(set(refs)):
            problems.append(f"{p['title']}: refIds repeat")
    defined = {v["name"] for v in d["templating"]["list"]}
    texts = [expr for _, expr, _ in _queries(d)]
    texts += [v["query"]["query"] for v in d["templating"]["list"] if v["type"] == "query"]
    texts += [json.dumps(p.get("datasource")) for p in panels]
    used = {m for text in texts for m in re.findall(r"\$\{?(\w+)\}?", text)}
    undefined = used - {b.removeprefix("$") for b in GRAFANA_BUILTINS} - defined
    if undefined:
        problems.append(f"undefined variables: {sorted(undefined)}")
    return problems


def test_dashboard_is_a_valid_grafana_model() -> None:
    jsonschema.Draft7Validator.check_schema(DASHBOARD_SCHEMA)
    assert _model_problems(dashboard()) == []


def _first_panel(d: dict[str, Any]) -> dict[str, Any]:
    return next(p for p in d["panels"] if p["type"] != "row")


BROKEN_MODELS = [
    pytest.param(lambda d: d.pop("uid"), "'uid' is a required property", id="no-uid"),
    pytest.param(lambda d: d.update(schemaVersion="39"), "is not of type 'integer'", id="version"),
    pytest.param(
        lambda d: _first_panel(d)["gridPos"].update(x=20, w=8), "beyond the 24", id="off-grid"
    ),
    pytest.param(
        lambda d: d["panels"].append({**_first_panel(d), "id": 999}), "overlaps", id="overlap"
    ),
    pytest.param(
        lambda d: d["panels"][-1].update(id=_first_panel(d)["id"]), "ids repeat", id="dup-id"
    ),
    pytest.param(
        lambda d: _first_panel(d)["targets"][0].update(expr=""), "should be non-empty", id="no-expr"
    ),
    pytest.param(
        lambda d: _first_panel(d)["targets"][0].update(expr='up{pod=~"$pod"}'),
        "undefined variables: ['pod']",
        id="undefined-variable",
    ),
    pytest.param(
        lambda d: _first_panel(d).update(type="graph-ish"), "is not one of", id="panel-type"
    ),
]


@pytest.mark.parametrize(("breakage", "says"), BROKEN_MODELS)
def test_the_model_check_rejects_broken_dashboards(breakage: Any, says: str) -> None:
    d = dashboard()
    breakage(d)
    problems = _model_problems(d)
    assert any(says in p for p in problems), problems


def test_the_dashboard_shows_what_the_issue_asks() -> None:
    queried = {name for _, expr, _ in _queries(dashboard()) for name, _ in _selectors(expr)}
    missing = {what: m for what, m in REQUIRED_METRICS.items() if m not in queried}
    assert missing == {}


# --- PromQL against a live /metrics --------------------------------------------------------------
def _promql(expr: str) -> Any:
    import promql_parser

    for name, value in GRAFANA_BUILTINS.items():
        expr = expr.replace(name, value)
    # Template variables stand for label values: any string parses the same.
    return promql_parser.parse(re.sub(r"\$\{?(\w+)\}?", r"var_\1", expr))


def _walk(node: Any) -> Iterator[Any]:
    yield node
    for attr in ("expr", "lhs", "rhs", "param", "vector_selector"):
        child = getattr(node, attr, None)
        if child is not None and hasattr(child, "prettify"):
            yield from _walk(child)
    for arg in getattr(node, "args", None) or []:
        yield from _walk(arg)


def _selectors(expr: str) -> list[tuple[str, list[tuple[str, Any, str]]]]:
    """(metric name, [(label, ``promql_parser.MatchOp``, value)]) of every vector selector."""
    import promql_parser

    out = []
    for node in _walk(_promql(expr)):
        if isinstance(node, promql_parser.VectorSelector):
            matchers = [(m.name, m.op, m.value) for m in node.matchers.matchers]
            out.append((node.name, matchers))
    return out


def _grouping_labels(expr: str) -> set[str]:
    """Labels named in by/without, on/ignoring and group_left/right clauses."""
    import promql_parser

    labels: set[str] = set()
    for node in _walk(_promql(expr)):
        if isinstance(node, promql_parser.AggregateExpr) and node.modifier is not None:
            labels |= set(node.modifier.labels)
        if isinstance(node, promql_parser.BinaryExpr) and node.modifier is not None:
            if node.modifier.matching is not None:
                labels |= set(node.modifier.matching.labels)
            labels |= set(node.modifier.group_labels or ())
    return labels


@pytest.fixture(scope="module")
def live_metrics(redis_url: str) -> dict[str, dict[str, set[str]]]:
    """sample name -> label -> values seen, from a controller a real worker has fed and
    that has refitted."""
    import uuid

    import redis
    from prometheus_client.parser import text_string_to_metric_families

    from agent.runtime.agent import Agent
    from agent.settings import AgentSettings
    from controlplane.dev.simworker import TraceWorker
    from controlplane.traces.synth import synthesize
    from tests.integration.controller_fixtures import live_settings, running_controller

    prefix = f"kvwise-grafana-{uuid.uuid4().hex[:8]}:"
    settings = live_settings(
        redis_url=redis_url,
        key_prefix=prefix,
        min_samples=100,
        lease_ttl_s=5,
    )
    agent_settings = AgentSettings(
        redis_url=redis_url,
        key_prefix=prefix,
        worker_id="w-grafana",
        flush_interval_s=0.05,
        poll_interval_s=0.2,
        heartbeat_interval_s=0.2,
    )
    trace = synthesize("to-c", duration_s=120, qps=4, seed=3)
    try:
        with running_controller(settings) as rc:
            stop = threading.Event()
            with Agent(agent_settings, capacity=max(50, trace.n_unique // 10)) as agent:
                sim = TraceWorker(agent, trace, speed=40, stop=stop)
                thread = threading.Thread(target=sim.run, daemon=True)
                thread.start()
                deadline = time.monotonic() + 30
                while rc.controller.ingestor.counters.batches < 3:
                    assert time.monotonic() < deadline, "no events ingested"
                    time.sleep(0.1)
                refit = rc.client.post("/v1/policy/refit").json()
                assert refit["published"], refit
                stop.set()
                thread.join(timeout=30)
                # The heartbeat is live while the agent is open: scrape now.
                text = rc.client.get("/metrics").text
    finally:
        client = redis.Redis.from_url(redis_url)
        keys = list(client.scan_iter(match=prefix + "*", count=1000))
        if keys:
            client.delete(*keys)
    seen: dict[str, dict[str, set[str]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = seen.setdefault(sample.name, {})
            for k, v in sample.labels.items():
                labels.setdefault(k, set()).add(v)
    return seen


def _problems(exprs: list[tuple[str, str, str]], live: dict[str, dict[str, set[str]]]) -> list[str]:
    """What in (title, expr, legendFormat) names a metric, label or label value that
    ``live`` does not have."""
    import promql_parser

    problems = []
    for title, expr, legend in exprs:
        known: set[str] = set(TARGET_LABELS)
        for name, matchers in _selectors(expr):
            if name not in live:
                problems.append(f"{title}: {name} is not exported")
                continue
            exported = live[name]
            known |= set(exported)
            for label, op, value in matchers:
                if label in TARGET_LABELS:
                    continue
                if label not in exported:
                    problems.append(f"{title}: {name} has no label {label!r}")
                elif op == promql_parser.MatchOp.Equal and value not in exported[label]:
                    problems.append(f"{title}: {name}{{{label}={value!r}}} never exported")
        for label in _grouping_labels(expr) | set(re.findall(r"\{\{\s*(\w+)\s*\}\}", legend)):
            if label not in known:
                problems.append(f"{title}: label {label!r} is on none of its metrics")
    return problems


def _all_queries(d: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Panel targets and query variables (as PromQL) of the dashboard."""
    out = list(_queries(d))
    out += [
        (f"variable {v['name']}", _label_values(v["query"]["query"]), "")
        for v in d["templating"]["list"]
        if v["type"] == "query"
    ]
    return out


@pytest.mark.integration
def test_every_queried_metric_and_label_is_exported(
    live_metrics: dict[str, dict[str, set[str]]],
) -> None:
    queries = _all_queries(dashboard())
    assert len(queries) > 20
    assert _problems(queries, live_metrics) == []


def _label_values(query: str) -> str:
    """``label_values(selector, label)`` as a PromQL expression naming the label in a
    by-clause, so one check covers both."""
    m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", query.strip())
    assert m is not None, f"not a label_values query: {query}"
    return f"count by ({m.group(2)}) ({m.group(1)})"


NOT_EXPORTED = {
    "name": ("rate(kvwise_refits[5m])", "", "kvwise_refits is not exported"),
    "matcher-label": ('kvwise_agent_hit_ratio{worker="w"}', "", "has no label 'worker'"),
    "matcher-value": ('kvwise_category_param{param="mean"}', "", "{param='mean'} never exported"),
    "by-label": ("sum by (pool) (kvwise_agent_hit_ratio)", "", "label 'pool'"),
    "legend-label": ("max(kvwise_policy_version)", "{{agent}}", "label 'agent'"),
    "variable": ("label_values(kvwise_leader, agent)", "", "label 'agent'"),
}
"""Queries of what is not exported, by case: ``(expr, legend, what the live check says)``."""


@pytest.mark.integration
@pytest.mark.parametrize(
    ("expr", "legend", "says"), list(NOT_EXPORTED.values()), ids=list(NOT_EXPORTED)
)
def test_the_live_check_catches_what_is_not_exported(
    live_metrics: dict[str, dict[str, set[str]]], expr: str, legend: str, says: str
) -> None:
    if expr.startswith("label_values("):
        expr = _label_values(expr)
    problems = _problems([("probe", expr, legend)], live_metrics)
    assert any(says in p for p in problems), problems

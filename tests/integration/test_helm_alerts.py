"""The alerts the Helm chart ships (controller.metrics.prometheusRule): a PrometheusRule off
by default, whose every expression parses as PromQL, selects this release's series alone
(the namespace and service labels the Prometheus Operator gives a ServiceMonitor's
targets) and names only metrics and labels a live controller exports (the live check of
test_grafana_dashboard.py, against a controller a real worker fed).
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.integration import helm_support as hs
from tests.integration.helm_support import FULLNAME, NAMESPACE
from tests.integration.test_grafana_dashboard import (  # noqa: F401 (a fixture)
    _problems,
    _selectors,
    live_metrics,
)

ENABLED = {"controller": {"metrics": {"prometheusRule": {"enabled": True}}}}


def rules(values: dict[str, Any]) -> list[dict[str, Any]]:
    (rule,) = hs.render(hs.chart(), values).of_kind("PrometheusRule")
    (group,) = rule["spec"]["groups"]
    return list(group["rules"])


def test_off_by_default() -> None:
    assert hs.rendered("default").of_kind("PrometheusRule") == []


def test_rendered_where_and_with_the_labels_asked() -> None:
    labels = {"release": "kube-prometheus-stack"}
    where = {"enabled": True, "namespace": "monitoring", "labels": labels}
    values = {"controller": {"metrics": {"prometheusRule": where}}}
    (rule,) = hs.render(hs.chart(), values).of_kind("PrometheusRule")
    assert rule["metadata"]["namespace"] == "monitoring"
    assert rule["metadata"]["labels"].items() >= labels.items()


def test_every_alert_is_well_formed_and_selects_this_release_only() -> None:
    import promql_parser

    alerts = rules(ENABLED)
    assert len(alerts) >= 5
    assert len({a["alert"] for a in alerts}) == len(alerts)
    for alert in alerts:
        assert re.fullmatch(r"Kvwise[A-Za-z]+", alert["alert"])
        assert alert["labels"]["severity"] in ("critical", "warning")
        assert {"summary", "description"} <= set(alert["annotations"])
        assert re.fullmatch(r"[0-9]+[smh]", alert.get("for", "0s"))
        selectors = _selectors(alert["expr"])
        assert selectors, alert["alert"]
        for name, matchers in selectors:
            equal = {
                label: value for label, op, value in matchers if op == promql_parser.MatchOp.Equal
            }
            where = {"namespace": NAMESPACE, "service": f"{FULLNAME}-controller"}
            assert equal.items() >= where.items(), (alert["alert"], name)


def test_additional_rules_join_the_group() -> None:
    extra = {"alert": "MyKvwiseAlert", "expr": "vector(1)", "labels": {"severity": "info"}}
    values = {
        "controller": {"metrics": {"prometheusRule": {"enabled": True, "additionalRules": [extra]}}}
    }
    assert rules(values)[-1] == extra


@pytest.mark.integration
def test_every_alert_names_what_a_live_controller_exports(
    live_metrics: dict[str, dict[str, set[str]]],  # noqa: F811 (the fixture)
) -> None:
    def legend(alert: dict[str, Any]) -> str:
        """The labels its annotations print, as a legend the live check reads."""
        text = " ".join(alert["annotations"].values())
        return " ".join(f"{{{{{label}}}}}" for label in re.findall(r"\$labels\.(\w+)", text))

    exprs = [(a["alert"], a["expr"], legend(a)) for a in rules(ENABLED)]
    assert any(legend for _, _, legend in exprs)
    assert _problems(exprs, live_metrics) == []

"""docs/controller.md's metrics reference is generated from the controller's registry, so a
metric cannot be added, renamed or relabelled without the doc following.

Run as a script it regenerates the table: ``python -m tests.unit.test_metrics_doc``.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from typing import Any

from controlplane.service.agents import AgentView
from controlplane.service.metrics import PER_AGENT, REFIT_OUTCOMES, ControllerMetrics
from tests.conftest import REPO

DOC = REPO / "docs" / "controller.md"
START = "<!-- metrics-table:start (generated from controlplane/service/metrics.py) -->"
END = "<!-- metrics-table:end -->"
_EXPOSED_SUFFIX = {"counter": "_total"}
"""What the exposition adds to a family's name (a histogram's series are explained apart)."""


def _declared() -> list[Any]:
    """Every collector the controller's registry holds, in registration order."""
    return list(ControllerMetrics().registry._collector_to_names)


def metrics_table() -> str:
    rows = ["| metric | type | labels | meaning |", "|---|---|---|---|"]
    for metric in _declared():
        kind = metric._type
        name = metric._name + _EXPOSED_SUFFIX.get(kind, "")
        labels = ", ".join(f"`{label}`" for label in metric._labelnames)
        rows.append(f"| `{name}` | {kind} | {labels} | {metric._documentation} |")
    return "\n".join(rows)


def _current_table() -> str:
    text = DOC.read_text()
    return text[text.index(START) + len(START) : text.index(END)].strip()


def test_every_declared_metric_is_in_the_doc() -> None:
    doc = DOC.read_text()
    missing = [m._name for m in _declared() if f"`{m._name}" not in doc]
    assert not missing, f"metrics missing from docs/controller.md: {missing}"


def test_the_metrics_table_is_generated_from_the_registry() -> None:
    assert _current_table() == metrics_table(), (
        "docs/controller.md's metrics table is stale: run python -m tests.unit.test_metrics_doc"
    )


def test_the_docs_name_counters_as_exposed() -> None:
    """A counter is exposed as ``<name>_total`` only: prose that names it without the
    suffix sends a reader to a query that finds nothing."""
    counters = {m._name for m in _declared() if m._type == "counter"}
    docs = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    bare = [
        f"{doc.relative_to(REPO)}: {name}"
        for doc in docs
        for name in re.findall(r"\b(kvwise_[a-z0-9_]+)\b", doc.read_text())
        if name in counters
    ]
    assert not bare, f"counters named without _total: {bare}"


if __name__ == "__main__":
    text = DOC.read_text()
    head, tail = text[: text.index(START) + len(START)], text[text.index(END) :]
    DOC.write_text(f"{head}\n\n{metrics_table()}\n\n{tail}")
    sys.exit(0)


def test_every_refit_outcome_reads_0_before_the_first_refit() -> None:
    """Only outcomes that had happened were exported: a dashboard's rate of refusals was
    "no data", not 0, until one came."""
    metrics = ControllerMetrics()
    for outcome in REFIT_OUTCOMES:
        value = metrics.registry.get_sample_value("kvwise_refits_total", {"outcome": outcome})
        assert value == 0.0, outcome


def test_each_per_agent_gauge_shows_a_field_of_the_agents_view() -> None:
    """The controller sets them by field name: a name that is no field fails every scrape."""
    shown = {f.name for f in dataclasses.fields(AgentView)}
    assert set(PER_AGENT) <= shown, set(PER_AGENT) - shown

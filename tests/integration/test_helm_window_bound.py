"""The chart refuses at install exactly the window settings the controller refuses at start.

ControllerSettings refuses a worker allowed more categories than the window holds and a
window whose counters (``counter_bytes``) pass ``max_window_bytes``; the chart repeats both
checks (templates/_window.tpl writes the arithmetic again, a template cannot call Python),
so an operator gets a ``helm install`` error instead of a crash-looping pod. Each window
shape here is rendered with ``maxWindowBytes`` at its exact size and one byte below, so a
chart whose arithmetic drifted from ``counter_bytes`` by a single byte, on any shape,
fails: the shapes cross every step of the formula (a category count on each side of a
power of two and of the room's floor of 8, a reach on each side of a gap-bin edge and
within gap_edges' rounding tolerance of one, the 10 ms floor of the reach, a bucket count
that does not divide the window).
"""

from __future__ import annotations

from typing import Any

import helm_python as helm
import pytest
from pydantic import ValidationError

from controlplane.fit.reuse_window import counter_bytes
from controlplane.service.settings import ControllerSettings
from tests.integration import helm_support as hs
from tests.integration.helm_support import env_name, snake


def twentieth_edge(twentieths: int, buckets: int) -> float:
    """The window whose reach (itself plus one bucket) is a gap-bin edge: 1 ms times
    10^(twentieths / 20)."""
    return 1e-3 * 10 ** (twentieths / 20) / (1 + 1 / buckets)


# (windowS, windowBuckets, maxCategories), each sized at least 1 MiB (maxWindowBytes' floor).
SHAPES = [
    (3600.0, 120, 2048),  # the defaults
    (3600.0, 10_000, 2048),  # the most buckets
    (3600.0, 120, 1024),  # a power of two: room for as many
    (3600.0, 120, 1025),  # one more: room for twice as many
    (3600.0, 1000, 2),  # room's floor of 8
    (3600.0, 1000, 9),  # past the floor
    (2.5, 7, 30_000),  # a bucket that does not divide the window
    (0.001, 3, 100_000),  # a reach under 10 ms, taken as 10 ms
    (5000.0, 1, 100_000),  # a reach of 10^4 s exactly: an edge
    (5000.0 * (1 + 1e-11), 1, 100_000),  # within gap_edges' tolerance above it: the same bins
    (5000.0 * (1 - 1e-11), 1, 100_000),  # within it below
    (5000.0 * (1 + 1e-7), 1, 100_000),  # past the edge: one bin more
    (twentieth_edge(131, 120) * (1 - 1e-7), 120, 5000),  # just below an edge inside a decade
    (twentieth_edge(131, 120) * (1 + 1e-7), 120, 5000),  # just above it
]


def window_case(shape: tuple[float, int, int], slack: int) -> Any:
    window_s, buckets, categories = shape
    size = counter_bytes(window_s, buckets, categories)
    config = {
        "windowS": window_s,
        "windowBuckets": buckets,
        "maxCategories": categories,
        "maxCategoriesPerWorker": 2,
        "maxWindowBytes": size + slack,
    }
    side = "at-its-size" if slack == 0 else "a-byte-short"
    return pytest.param(config, id=f"{window_s!r}s-{buckets}x{categories}-{side}")


CASES = [
    *(window_case(shape, slack) for shape in SHAPES for slack in (0, -1)),
    *(
        pytest.param(
            {"maxCategories": categories, "maxCategoriesPerWorker": categories + extra},
            id=f"{categories + extra}-per-worker-of-{categories}",
        )
        for categories in (2, 2048)
        for extra in (0, 1)
    ),
]


def test_every_shape_can_be_bounded_a_byte_short() -> None:
    """maxWindowBytes takes 1 MiB at least: a smaller shape would test the schema instead."""
    assert min(counter_bytes(*shape) for shape in SHAPES) > 1 << 20


@pytest.mark.parametrize("config", CASES)
def test_the_chart_refuses_exactly_the_settings_the_controller_refuses(
    config: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    try:
        rendered = hs.render(hs.chart(), {"controller": {"config": config}})
    except helm.HelmError as err:
        env = {env_name(snake(key)): str(value) for key, value in config.items()}
        with pytest.raises(ValidationError):
            hs.load_settings(ControllerSettings, env, monkeypatch)
        assert_names_chart_values(str(err), config)
        return
    configmap = rendered.get("ConfigMap", f"{hs.FULLNAME}-controller")
    hs.load_settings(ControllerSettings, configmap["data"], monkeypatch)


def assert_names_chart_values(message: str, config: dict[str, Any]) -> None:
    """The refusal speaks the chart's value names, and a window's states its size in bytes
    as counter_bytes counts it."""
    assert "KVWISE_" not in message
    if config["maxCategoriesPerWorker"] > config["maxCategories"]:
        assert "controller.config.maxCategoriesPerWorker" in message
        return
    size = counter_bytes(config["windowS"], config["windowBuckets"], config["maxCategories"])
    assert f"statistics window at {size} bytes" in message
    assert f"controller.config.maxWindowBytes ({config['maxWindowBytes']})" in message

"""The /ui dashboard in a real browser against the stand-in controller
(tests/e2e/scripted_api), in states a reader could misread: the controller gone while the
shadow curves are shown, a health probe answered 502, a controller that answers but is not
ready, the hit-ratio chart's line styles, and its pooled line once a worker has gone or
joined.

Checked: the shadow section says its curves are stale, and of when, while the controller
does not answer; a probe answered 5xx sends no other read; the title says *(not ready)* as
it says *(down)*; the chart's seven colours stay apart in normal vision and in the three
simulated dichromacies; the pooled line counts the workers its history pools, each point
all of them.
"""

from __future__ import annotations

import itertools
import math
import re
from typing import Any

import pytest

from tests.e2e.scripted_api import READ_PATHS, ScriptedApi
from tests.e2e.test_dashboard_scripted import PROXY_PAGE, _refresh_now, _text
from tests.e2e.test_dashboard_scripted_limits import (
    HIT_CHART_JS,
    _beat_sixty_workers,
    _sixty_workers,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

TITLE = "kvwise controller"


def test_the_shadow_says_it_is_stale_while_the_controller_is_down(
    page: tuple[ScriptedApi, Any],
) -> None:
    """The health probe unanswered (past the page's 4 s read limit): the shadow section names
    its read as not sent and the time of the curves it still shows (it showed them as if
    current, with no word); answered again, the word is gone."""
    api, driver = page
    assert driver.find_element("id", "shadow-error").is_displayed() is False
    api.set("/healthz", delay_s=5.0)
    _refresh_now(driver)
    said = _text(driver, "#shadow-error")
    assert said.startswith("GET /v1/shadow: timeout: not sent, since GET /healthz failed"), said
    assert re.search(r"showing the curves read at \d{4}-\d\d-\d\d \d\d:\d\d:\d\d$", said), said
    assert driver.find_elements("css selector", "#shadow-body svg.chart-svg")
    api.set("/healthz", delay_s=0.0)
    _refresh_now(driver)
    assert driver.find_element("id", "shadow-error").is_displayed() is False
    driver.get_log("browser")  # the timed-out probe was logged: drained


def test_the_title_says_not_ready(page: tuple[ScriptedApi, Any]) -> None:
    """GET /readyz answering 503 (a standby, a policy being restored): the title says
    *(not ready)* (it was unchanged, only a down controller showed in a background tab);
    ready again, it is the plain title."""
    api, driver = page
    health = api.answers["/healthz"].body
    api.set("/readyz", health | {"status": "unavailable", "reason": "policy_restoring"}, 503)
    _refresh_now(driver)
    assert _text(driver, "#health").startswith("Not ready: policy_restoring")
    assert driver.title == f"(not ready) {TITLE}"
    api.set("/readyz", health | {"status": "ok", "reason": None}, 200)
    _refresh_now(driver)
    assert driver.title == TITLE
    driver.get_log("browser")  # the 503 was logged: drained


# Linear-RGB simulations of the three dichromacies (Machado, Oliveira and Fernandes 2009,
# severity 1), and normal vision.
VISIONS = {
    "normal": ((1, 0, 0), (0, 1, 0), (0, 0, 1)),
    "protan": (
        (0.152286, 1.052583, -0.204868),
        (0.114503, 0.786281, 0.099216),
        (-0.003882, -0.048116, 1.051998),
    ),
    "deutan": (
        (0.367322, 0.860646, -0.227968),
        (0.280085, 0.672501, 0.047413),
        (-0.01182, 0.04294, 0.968881),
    ),
    "tritan": (
        (1.255528, -0.076749, -0.178779),
        (-0.078411, 0.930809, 0.147602),
        (0.004733, 0.691367, 0.3039),
    ),
}
MIN_DELTA_E = 15.0  # CIE76; about 2.3 is the smallest difference one notices side by side


def _linear(hex_colour: str) -> list[float]:
    channels = [int(hex_colour[i : i + 2], 16) / 255 for i in (1, 3, 5)]
    return [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]


def _lab(rgb: list[float]) -> tuple[float, float, float]:
    """CIELAB (D65) of a linear sRGB colour."""
    x = (0.4124 * rgb[0] + 0.3576 * rgb[1] + 0.1805 * rgb[2]) / 0.95047
    y = 0.2126 * rgb[0] + 0.7152 * rgb[1] + 0.0722 * rgb[2]
    z = (0.0193 * rgb[0] + 0.1192 * rgb[1] + 0.9505 * rgb[2]) / 1.08883
    fx, fy, fz = (t ** (1 / 3) if t > 0.008856 else 7.787 * t + 16 / 116 for t in (x, y, z))
    return 116 * fy - 16, 500 * (fx - fy), 200 * (fy - fz)


def _seen(hex_colour: str, vision: str) -> tuple[float, float, float]:
    rgb = _linear(hex_colour)
    seen = [
        min(1.0, max(0.0, sum(m * c for m, c in zip(row, rgb, strict=True))))
        for row in VISIONS[vision]
    ]
    return _lab(seen)


def _closest_pair(colours: list[str]) -> tuple[float, str, str, str]:
    """The two colours least apart in any vision: their distance, the vision, the two."""
    return min(
        (math.dist(_seen(a, v), _seen(b, v)), v, a, b)
        for v in VISIONS
        for a, b in itertools.combinations(colours, 2)
    )


def test_the_chart_styles_differ_in_colour(page: tuple[ScriptedApi, Any]) -> None:
    """Sixty workers, so the hit-ratio chart draws all seven styles: every two of their
    colours are at least MIN_DELTA_E apart in normal vision and in simulated protanopia,
    deuteranopia and tritanopia (two were blues told apart by their dash only)."""
    api, driver = page
    _beat_sixty_workers(api, driver, 2)
    legend, _ = driver.execute_script(HIT_CHART_JS)
    colours = [colour.upper() for _, colour, _ in legend]
    assert len(colours) == 7
    distance, vision, a, b = _closest_pair(colours)
    assert distance >= MIN_DELTA_E, (vision, a, b, distance)


# Runs in the page: the points of the hit-ratio chart's last series, the pooled line (the
# moves and lines of its path, or its dots).
POOLED_POINTS_JS = """
const g = [...document.querySelectorAll('#hit-chart g.series')].pop();
const path = g.querySelector('path');
if (!path) return g.querySelectorAll('circle').length;
return (path.getAttribute('d').match(/[ML]/g) || []).length;
"""


def test_the_pooled_line_counts_the_workers_it_pools(page: tuple[ScriptedApi, Any]) -> None:
    """Sixty workers for two refreshes, then one of them gone: the pooled line, labelled
    *all 59 workers*, starts again with the 59 (it kept the points that pooled the sixty
    under the label of 59)."""
    api, driver = page
    agent = _beat_sixty_workers(api, driver, 3)
    assert driver.execute_script(POOLED_POINTS_JS) == 2
    api.set("/v1/agents", _sixty_workers(agent, 4)[1:])
    _refresh_now(driver)
    legend, facts = driver.execute_script(HIT_CHART_JS)
    assert legend[-1][0] == "all 59 workers, pooled"
    assert driver.execute_script(POOLED_POINTS_JS) == 1
    assert "all 59 pooled" in facts, facts


def test_the_pooled_line_waits_for_a_worker_that_joined(page: tuple[ScriptedApi, Any]) -> None:
    """Sixty workers for three refreshes, then a sixty-first joins: the pooled line, labelled
    *all 61 workers*, starts again with no point until the newcomer has an earlier
    heartbeat (its first point pooled the sixty under the label of 61), then one."""
    api, driver = page
    agent = _beat_sixty_workers(api, driver, 3)
    for beat, points in ((4, 0), (5, 1)):
        workers = _sixty_workers(agent, beat)
        newcomer = workers[0] | {"id": "w60", "accesses": 50 * (beat - 3), "hits": 0}
        api.set("/v1/agents", [*workers, newcomer])
        _refresh_now(driver)
        legend, _ = driver.execute_script(HIT_CHART_JS)
        assert legend[-1][0] == "all 61 workers, pooled"
        assert driver.execute_script(POOLED_POINTS_JS) == points, beat


def test_a_health_probe_answered_5xx_sends_no_other_read(page: tuple[ScriptedApi, Any]) -> None:
    """GET /healthz answered 502 by a proxy: the refresh sends no other read (it sent every
    one, each failing on its own) and each section says its read was not sent, naming what
    the probe answered; answered again, the reads are sent and the words are gone."""
    api, driver = page
    good = api.answers["/healthz"].body
    api.set("/healthz", PROXY_PAGE, 502, media_type="text/html")
    before = api.asked.copy()
    _refresh_now(driver)
    sent = {path: n - before[path] for path, n in api.asked.items() if n > before[path]}
    assert sent == {"/healthz": 1}, sent
    for box, read in (
        ("policy-error", "/v1/policy"),
        ("categories-error", "/v1/categories"),
        ("workers-error", "/v1/agents"),
        ("shadow-error", "/v1/shadow"),
    ):
        said = _text(driver, f"#{box}")
        reason = "not sent, since GET /healthz answered HTTP 502: 502 Bad Gateway nginx"
        assert said.startswith(f"GET {read}: http_error: {reason}"), said
    api.set("/healthz", good)
    before = api.asked.copy()
    _refresh_now(driver)
    assert all(api.asked[path] > before[path] for path in READ_PATHS if path != "/openapi.json")
    assert driver.find_element("id", "policy-error").is_displayed() is False
    driver.get_log("browser")  # the 502 was logged: drained

"""The /ui dashboard in a real browser against the stand-in controller
(tests/e2e/scripted_api), at its limits: many categories drawn in turn, a curve asked for
twice at once, a shadow curve without a step, sixty workers, a proxy answering the health
probe in the controller's stead.

Checked: the page keeps the curves of a bounded number of categories, not of every one it
ever drew; a curve wanted again while it is read is read once; a shadow curve is broken
where a step is missing; the hit-ratio chart of sixty workers draws the busiest and all
pooled, in styles of their own; a health probe answered in error is told as answered, not
as unreachable.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.browser import console_problems
from tests.e2e.scripted_api import ScriptedApi, curve_path
from tests.e2e.test_dashboard import _fill, _refreshes, _until
from tests.e2e.test_dashboard_scripted import (
    PROXY_PAGE,
    _assert_reflows_at_400_percent_zoom,
    _categories,
    _charts,
    _refresh_now,
    _shadow_with_two_groups,
    _text,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _filter_to(driver: Any, needle: str, names: list[str]) -> None:
    """Type ``needle`` in the filter; wait for the curves of the ``names`` it matches."""
    _fill(driver, "cat-filter", needle)
    expected = [n for n in names if needle in n]
    _until(driver, f"the curves of {needle}", lambda: _charts(driver) == expected)


def test_the_curves_kept_are_bounded(page: tuple[ScriptedApi, Any]) -> None:
    """120 categories drawn in turn, ten at a time through the filter, then the first ten
    again: their curves are read again, as they were let go (the page kept every curve it
    ever drew for the tab's life), while the last ten drawn are still kept."""
    api, driver = page
    names = _categories(api, 120)
    _refresh_now(driver)
    for k in range(12):
        _filter_to(driver, f"cat_{k:02d}", names)
    _filter_to(driver, "cat_00", names)
    _filter_to(driver, "cat_11", names)
    assert api.asked[curve_path("cat_000")] == 2
    assert api.asked[curve_path("cat_119")] == 1


def test_a_curve_wanted_while_it_is_read_is_read_once(page: tuple[ScriptedApi, Any]) -> None:
    """The filter typed, naming the busiest category, while a refresh reads its curve (2 s):
    the filter's redraw waits for that read and draws it (it sent a second read of the same
    curve beside the first)."""
    api, driver = page
    names = _categories(api)
    busiest = curve_path(names[0])
    api.set(busiest, delay_s=2.0)
    seen = _refreshes(driver)
    driver.find_element("id", "refresh-now").click()
    _until(driver, "the read", lambda: api.in_flight[busiest])
    driver.find_element("id", "cat-filter").send_keys(names[0])
    _until(driver, "the filtered curve", lambda: _charts(driver) == [names[0]])
    _until(driver, "the refresh", lambda: _refreshes(driver) > seen)
    _until(driver, "nothing in flight", lambda: not +api.in_flight)
    assert (api.asked[busiest], api.most_in_flight[busiest]) == (1, 1)


# Runs in the page: per shadow chart, per series, the runs its line is drawn in (the moves,
# "M", of its path) and the polygons of its band.
SHADOW_RUNS_JS = """
return [...document.querySelectorAll('#shadow-body svg.chart-svg')].map((s) =>
  [...s.querySelectorAll('g.series')].map((g) => {
    const path = g.querySelector('path');
    return [path ? (path.getAttribute('d').match(/M/g) || []).length : 0,
      g.querySelectorAll('polygon').length];
  }));
"""


def test_a_shadow_curve_is_broken_where_a_step_is_missing(
    page: tuple[ScriptedApi, Any],
) -> None:
    """A group whose ``wa`` lacks the middle step of the ladder: its line and band stop on
    either side of it (they were drawn straight across, as if measured there), while every
    other curve is one line."""
    api, driver = page
    shadow = _shadow_with_two_groups(api.answers["/v1/shadow"].body)
    assert shadow["groups"][1]["curves"][0]["policy"] == "wa"
    api.set("/v1/shadow", shadow)
    _refresh_now(driver)
    first, second = driver.execute_script(SHADOW_RUNS_JS)
    assert all(runs == [1, 1] for runs in first), first
    assert second[0] == [2, 2], second
    assert all(runs == [1, 1] for runs in second[1:]), second


def _sixty_workers(agent: dict[str, Any], beat: int) -> list[dict[str, Any]]:
    """Sixty workers like the captured one at their ``beat``-th heartbeat (5 s apart): ``wNN``
    accessed ``100 + NN`` blocks per beat, a hit for one in four."""
    return [
        agent
        | {
            "id": f"w{i:02d}",
            "updated_at": agent["updated_at"] + 5 * beat,
            "accesses": (100 + i) * beat,
            "hits": (100 + i) * beat // 4,
        }
        for i in range(60)
    ]


def _beat_sixty_workers(api: ScriptedApi, driver: Any, beats: int) -> dict[str, Any]:
    """The page refreshed after each of ``beats`` heartbeats of ``_sixty_workers`` like the
    captured worker, whom it returns (for the beats a test sends after)."""
    captured: list[dict[str, Any]] = api.answers["/v1/agents"].body
    (agent,) = captured
    for beat in range(1, beats + 1):
        api.set("/v1/agents", _sixty_workers(agent, beat))
        _refresh_now(driver)
    return agent


# Runs in the page: the hit-ratio chart's legend (name, colour, dash) and its facts line.
HIT_CHART_JS = """
const box = document.getElementById('hit-chart');
const facts = box.querySelector('.chart-facts');
return [[...box.querySelectorAll('.legend li')].map((li) => {
  const line = li.querySelector('line');
  const style = ['stroke', 'stroke-dasharray'].map((a) => line.getAttribute(a));
  return [li.textContent.trim(), ...style];
}), facts ? facts.textContent : ''];
"""


def test_sixty_workers_chart_the_busiest_and_all_pooled(page: tuple[ScriptedApi, Any]) -> None:
    """Sixty workers: the hit-ratio chart draws the six with the most accesses and one line
    of all sixty pooled, each in a style of its own, and says so; the table lists all
    sixty (the chart drew sixty lines in seven styles, with sixty entries in its legend);
    nothing runs out sideways at 320 CSS pixels."""
    api, driver = page
    _beat_sixty_workers(api, driver, 2)
    legend, facts = driver.execute_script(HIT_CHART_JS)
    busiest = [f"w{i}" for i in range(59, 53, -1)]
    assert [name for name, _, _ in legend] == [*busiest, "all 60 workers, pooled"]
    assert len({(color, dash) for _, color, dash in legend}) == len(legend)
    assert facts.startswith("The 6 workers with the most accesses, and all 60 pooled"), facts
    assert len(driver.find_elements("css selector", "#worker-table tbody tr")) == 60
    _assert_reflows_at_400_percent_zoom(driver)


def test_a_health_probe_answered_in_error_says_what_it_answered(
    page: tuple[ScriptedApi, Any],
) -> None:
    """GET /healthz answered 502 by a proxy in front of the controller: the header says
    what came, status and text (it said "Controller unreachable" although an answer came),
    and the title says the controller is down; answered again, both are as before."""
    api, driver = page
    good = api.answers["/healthz"].body
    api.set("/healthz", PROXY_PAGE, 502, media_type="text/html")
    _refresh_now(driver)
    said = "Controller answered GET /healthz with HTTP 502: http_error: 502 Bad Gateway nginx"
    assert _text(driver, "#health") == said
    assert driver.title == "(down) kvwise controller"
    api.set("/healthz", good)
    _refresh_now(driver)
    assert _text(driver, "#health").startswith("Ready")
    assert driver.title == "kvwise controller"
    console_problems(driver)  # the 502 was logged: drained

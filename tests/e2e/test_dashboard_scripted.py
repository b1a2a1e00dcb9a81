"""The /ui dashboard in a real browser against a stand-in controller (tests/e2e/scripted_api)
that answers what a test sets: a real controller's own answers, changed where a test
probes what a live one rarely does on cue (a slow read, a shadow group without a policy).

Checked: refreshes never overlap, however often they are asked for while one is slow; a
shadow policy has one line style in every group, a group without some policy included;
the shadow's hit-ratio axis holds its bands and starts at 0; a control tabbed to is never
under a sticky header; the confirmation dialog holds a long category name; the shadow
keeps its curves while its read fails; a proxy's HTML error page is shown as its text;
the category curves follow a filter typed while they load; a worker's last rejection is
on the page, not only in a tooltip; a shadow table opened stays open and focused across
refreshes; no category, or none left by the filter, is said in words; the version history
fits its box with a long category in a reason; the page reflows at 400 % zoom; an action
is not sent again while it waits for its answer.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.browser import (
    OVERFLOW_JS,
    chromium,
    clear_emulation,
    console_problems,
    emulate_zoom,
)
from tests.e2e.scripted_api import (
    CATEGORY,
    Answer,
    ScriptedApi,
    curve_path,
    scripted_api,
)
from tests.e2e.test_dashboard import _confirm, _fill, _refreshes, _result, _submit, _until
from tests.e2e.test_dashboard_faults import _dialog_open

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _refresh_now(driver: Any) -> None:
    seen = _refreshes(driver)
    driver.find_element("id", "refresh-now").click()
    _until(driver, "the refresh", lambda: _refreshes(driver) > seen)


def _assert_reflows_at_400_percent_zoom(driver: Any) -> None:
    """A 1280-pixel screen at 400 % zoom lays the page out in 320 CSS pixels (the width
    WCAG's reflow criterion names); refreshed there, nothing runs out sideways."""
    emulate_zoom(driver, 1280, 1024, 4.0)
    assert driver.execute_script("return window.innerWidth") == 320
    _refresh_now(driver)
    assert driver.execute_script(OVERFLOW_JS) == []
    clear_emulation(driver)


def test_refreshes_asked_for_during_a_slow_one_wait_and_make_one(
    page: tuple[ScriptedApi, Any],
) -> None:
    """Three clicks on Refresh now while the policy read takes 1.5 s: one refresh runs,
    the two clicks made during it make one more after it, never two at once."""
    api, driver = page
    api.set("/v1/policy", delay_s=1.5)
    asked = api.asked["/v1/policy"]
    button = driver.find_element("id", "refresh-now")
    for _ in range(3):
        button.click()
    _until(driver, "two refreshes", lambda: _refreshes(driver) >= 3)
    _until(driver, "nothing in flight", lambda: not +api.in_flight)
    assert api.most_in_flight["/v1/policy"] == 1
    assert api.asked["/v1/policy"] == asked + 2


def _shadow_with_two_groups(shadow: dict[str, Any]) -> dict[str, Any]:
    """The captured group, and a second (capacity 1,000) without ``lru`` and whose ``wa``
    lacks the middle step of the ladder."""
    first = shadow["groups"][0]
    second = copy.deepcopy(first) | {"capacity": 1000, "workers": ["w2"]}
    second["curves"] = [c for c in second["curves"] if c["policy"] != "lru"]
    del second["curves"][0]["points"][2]
    return shadow | {"groups": [first, second]}


def _legend_styles(driver: Any) -> list[dict[str, tuple[str, str]]]:
    """Per shadow chart: each policy's line colour and dash in its legend, in its order."""
    figures = driver.execute_script(
        "return [...document.querySelectorAll('#shadow-body figure')].map((f) => "
        "[...f.querySelectorAll('.legend li')].map((li) => {"
        "  const line = li.querySelector('line');"
        "  return [li.textContent.trim(),"
        "    line.getAttribute('stroke'), line.getAttribute('stroke-dasharray')];"
        "}));"
    )
    return [{name: (color, dash) for name, color, dash in legend} for legend in figures]


def test_a_policy_keeps_its_line_in_every_shadow_group(page: tuple[ScriptedApi, Any]) -> None:
    """A group without one policy draws the others as the other groups do: s3fifo was drawn
    with lru's colour and dash there (styles went by position in the group)."""
    api, driver = page
    api.set("/v1/shadow", _shadow_with_two_groups(api.answers["/v1/shadow"].body))
    _refresh_now(driver)
    first, second = _legend_styles(driver)
    assert list(second) == ["wa", "s3fifo", "arc"]
    assert {p: first[p] for p in second} == second
    paths = driver.execute_script(
        "return [...document.querySelectorAll('#shadow-body figure')].map((f) => "
        "[...f.querySelectorAll('g.series path')].map((p) => p.getAttribute('stroke')));"
    )
    assert paths[1] == [first[p][0] for p in second]


# Runs in the page: per shadow chart, the frame's top and bottom, the y of every band's
# corner, and the y axis' tick labels.
SHADOW_Y_JS = """
return [...document.querySelectorAll('#shadow-body svg.chart-svg')].map((s) => {
  const frame = s.querySelector('rect.frame');
  const top = Number(frame.getAttribute('y'));
  const ys = [...s.querySelectorAll('polygon')].flatMap((p) =>
    p.getAttribute('points').split(' ').map((xy) => Number(xy.split(',')[1])));
  const ticks = [...s.querySelectorAll('g.axes text[text-anchor=end]')].map((t) => t.textContent);
  return { top, bottom: top + Number(frame.getAttribute('height')), ys, ticks };
});
"""


def _all_zero(shadow: dict[str, Any]) -> dict[str, Any]:
    """The captured shadow as it reads before any access is sampled: every hit ratio 0,
    every interval all of [0, 1]."""
    empty = copy.deepcopy(shadow)
    for curve in empty["groups"][0]["curves"]:
        for point in curve["points"]:
            point |= {"hit_ratio": 0.0, "ci_low": 0.0, "ci_high": 1.0, "accesses": 0}
    return empty


def test_shadow_bands_stay_inside_a_hit_ratio_axis(page: tuple[ScriptedApi, Any]) -> None:
    """The y axis covers the intervals (bands were drawn over the chart's title, above its
    frame) and never goes below 0 (with every hit ratio 0 it ran from -1 to 1)."""
    api, driver = page
    shadow = api.answers["/v1/shadow"].body
    highest = max(q["ci_high"] for c in shadow["groups"][0]["curves"] for q in c["points"])
    assert highest > max(q["hit_ratio"] for c in shadow["groups"][0]["curves"] for q in c["points"])
    for answer in (shadow, _all_zero(shadow)):
        api.set("/v1/shadow", answer)
        _refresh_now(driver)
        (chart,) = driver.execute_script(SHADOW_Y_JS)
        assert chart["ys"] and all(
            chart["top"] - 0.5 <= y <= chart["bottom"] + 0.5 for y in chart["ys"]
        ), chart
        ticks = [float(t) for t in chart["ticks"]]
        assert min(ticks) == 0 and max(ticks) <= 1, ticks


# Runs in the page: what covers the middle of the focused element's left edge, when that
# is not the element itself (the sticky header, a table's sticky column headings).
COVERED_JS = """
const e = document.activeElement;
if (!e || e === document.body) return '';
const r = e.getBoundingClientRect();
const top = document.elementFromPoint(Math.max(r.left + 3, 0), r.top + r.height / 2);
if (top && (e === top || e.contains(top) || top.contains(e))) return '';
const name = (e.getAttribute('aria-label') || e.id || e.textContent).trim().slice(0, 30);
return `${e.tagName} ${name} under ${top ? top.closest('header, thead, body').tagName : 'nothing'}`;
"""


def test_the_focus_is_never_under_a_sticky_header(
    real_answers: dict[str, Answer], tmp_path: Path
) -> None:
    """Tabbing backwards through a page with thirty kept versions: each control scrolled
    into view lands below the page's sticky header and the version table's sticky column
    headings (it landed under them: the focus was hidden)."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    answers = dict(real_answers)
    kept = answers["/v1/policy/versions"].body[-1]
    versions = [kept | {"version": v, "note": f"refit {v}"} for v in range(30, 0, -1)]
    answers["/v1/policy/versions"] = Answer(versions)
    with scripted_api(answers) as api, chromium(tmp_path / "profile", 1280, 800) as driver:
        driver.get(f"{api.url}/ui/?refresh=0")
        _until(driver, "first refresh", lambda: _refreshes(driver) >= 1)
        driver.execute_script("window.scrollTo(0, document.body.scrollHeight)")
        covered = []
        for _ in range(60):
            ActionChains(driver).key_down(Keys.SHIFT).send_keys(Keys.TAB).key_up(
                Keys.SHIFT
            ).perform()
            covered.append(driver.execute_script(COVERED_JS))
        assert [c for c in covered if c] == []


def test_refresh_in_the_address_sets_any_period(page: tuple[ScriptedApi, Any]) -> None:
    """``?refresh=30`` stayed at every 5 s: only the menu's own values were taken."""
    api, driver = page
    menu = "return [...document.querySelectorAll('#refresh option')].map((o) => o.value);"
    for asked, chosen, values in (
        ("30", "30", ["2", "5", "15", "30", "60", "0"]),
        ("15", "15", ["2", "5", "15", "60", "0"]),
        ("0", "0", ["2", "5", "15", "60", "0"]),
        ("9999", "5", ["2", "5", "15", "60", "0"]),  # over an hour: the default stays
        ("x", "5", ["2", "5", "15", "60", "0"]),
    ):
        driver.get(f"{api.url}/ui/?refresh={asked}")
        _until(driver, "first refresh", lambda: _refreshes(driver) >= 1)
        value = driver.execute_script("return document.getElementById('refresh').value;")
        assert (value, driver.execute_script(menu)) == (chosen, values), asked


def test_the_dialog_wraps_a_long_category_name(page: tuple[ScriptedApi, Any]) -> None:
    """An override of a 128-character category (the longest an agent sends, and the API
    takes) asks in a dialog that holds the name (it ran out sideways: the dialog
    scrolled)."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    _, driver = page
    name = "queue-" + "x" * 122
    _fill(driver, "ov-category", name)
    _fill(driver, "ov-life", "5")
    _submit(driver, "override-form")
    _until(driver, "the dialog", lambda: _dialog_open(driver))
    assert name in driver.find_element("id", "confirm-title").text.replace("\n", "")
    wide = driver.execute_script(
        "return [...document.querySelectorAll('#confirm, #confirm *')]"
        ".filter((e) => e.scrollWidth > e.clientWidth + 1).map((e) => e.tagName + '#' + e.id);"
    )
    assert wide == []
    ActionChains(driver).send_keys(Keys.ESCAPE).perform()
    _until(driver, "cancelled", lambda: "cancelled" in _result(driver))


def _text(driver: Any, selector: str) -> str:
    return str(driver.execute_script(f"return document.querySelector('{selector}').innerText"))


def test_the_shadow_keeps_its_curves_while_its_read_fails(page: tuple[ScriptedApi, Any]) -> None:
    """GET /v1/shadow answering 503 (Redis gone a moment) shows the API's error above the
    last curves, as every section keeps its last data (the curves were wiped), and the
    error goes when the read answers again."""
    api, driver = page
    figures = "#shadow-body figure"
    assert len(driver.find_elements("css selector", figures)) == 1
    good = api.answers["/v1/shadow"].body
    api.set("/v1/shadow", {"error": "redis_unavailable", "reason": "Redis did not answer"}, 503)
    _refresh_now(driver)
    said = "GET /v1/shadow: HTTP 503 redis_unavailable: Redis did not answer; showing the curves"
    assert _text(driver, "#shadow-error").startswith(said)
    assert len(driver.find_elements("css selector", figures)) == 1
    api.set("/v1/shadow", good)
    _refresh_now(driver)
    assert not driver.find_element("id", "shadow-error").is_displayed()
    assert len(driver.find_elements("css selector", figures)) == 1
    console_problems(driver)  # the 503 was logged: drained


PROXY_PAGE = (
    "<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n"
    "<center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>nginx</center>\r\n"
    "</body>\r\n</html>\r\n"
)


def test_a_proxys_html_error_is_shown_as_its_text(page: tuple[ScriptedApi, Any]) -> None:
    """A proxy in front of the controller (an ingress) answering 502 with its HTML page:
    the section says what the page says, not its markup (the tags were shown); a plain
    text answer (Envoy's) as it was sent."""
    api, driver = page
    api.set("/v1/agents", PROXY_PAGE, 502, media_type="text/html")
    _refresh_now(driver)
    said = "GET /v1/agents: HTTP 502 http_error: 502 Bad Gateway nginx"
    assert _text(driver, "#workers-error") == said
    envoy = "upstream connect error or disconnect/reset before headers. reset reason: overflow"
    api.set("/v1/agents", envoy + "\n", 503, media_type="text/plain")
    _refresh_now(driver)
    assert _text(driver, "#workers-error") == f"GET /v1/agents: HTTP 503 http_error: {envoy}"
    console_problems(driver)  # the failed reads were logged: drained


def _categories(api: ScriptedApi, count: int = 20) -> list[str]:
    """``count`` categories like the captured one (``cat_000``, ``cat_001``…), most samples
    first; their names."""
    summary = api.answers["/v1/categories"].body[0]
    detail = api.answers[curve_path(CATEGORY)].body
    names = [f"cat_{i:03d}" for i in range(count)]
    listed = [summary | {"name": n, "samples": 1000 - i} for i, n in enumerate(names)]
    api.set("/v1/categories", listed)
    for entry in listed:
        api.set(curve_path(entry["name"]), detail | entry)
    return names


def _charts(driver: Any) -> list[str]:
    return list(
        driver.execute_script(
            "return [...document.querySelectorAll('#cat-charts figure')]"
            ".map((f) => f.dataset.category);"
        )
    )


def test_the_curves_follow_a_filter_typed_while_they_load(
    page: tuple[ScriptedApi, Any],
) -> None:
    """The filter typed while a refresh fetches the twelve busiest curves (2 s each): the
    curves drawn are the filter's, as the table's rows are (the refresh drew its twelve
    over them when its fetches ended)."""
    api, driver = page
    names = _categories(api)
    for name in names[:12]:
        api.set(curve_path(name), delay_s=2.0)
    seen = _refreshes(driver)
    driver.find_element("id", "refresh-now").click()
    _until(driver, "the fetches", lambda: api.in_flight[curve_path(names[0])])
    driver.find_element("id", "cat-filter").send_keys(names[19])
    _until(driver, "the filtered curve", lambda: _charts(driver) == [names[19]])
    _until(driver, "the refresh", lambda: _refreshes(driver) > seen)
    _until(driver, "nothing in flight", lambda: not +api.in_flight)
    assert _charts(driver) == [names[19]]


def test_a_workers_last_rejection_is_on_the_page(page: tuple[ScriptedApi, Any]) -> None:
    """The reason a worker gave for its last rejected document is in the table's text,
    read by keyboard, touch and screen readers alike (it was only a hover's tooltip)."""
    api, driver = page
    (agent,) = api.answers["/v1/agents"].body
    assert agent["rejected"] == 1 and agent["last_rejection"]
    cell = driver.execute_script(
        "const c = document.querySelector('#worker-table tbody tr').cells[8];"
        "return [c.innerText, c.title];"
    )
    assert cell[0].split("\n") == ["1", agent["last_rejection"]], cell


def test_a_shadow_table_opened_stays_open_and_focused_across_refreshes(
    page: tuple[ScriptedApi, Any],
) -> None:
    """The shadow's *Table of these values* opened by keyboard stays open, with the focus
    on it, when a refresh brings new figures (it closed, and the focus fell to the page's
    body, at every refresh of a live controller: its counts always move)."""
    from selenium.webdriver.common.keys import Keys

    api, driver = page
    summary = "#shadow-body details summary"
    driver.find_element("css selector", summary).send_keys(Keys.ENTER)
    assert driver.execute_script("return document.querySelector('#shadow-body details').open")
    shadow = copy.deepcopy(api.answers["/v1/shadow"].body)
    shadow["groups"][0]["accesses_seen"] += 1
    api.set("/v1/shadow", shadow)
    seen = _refreshes(driver)
    driver.execute_script("document.getElementById('refresh-now').click()")  # focus stays
    _until(driver, "the refresh", lambda: _refreshes(driver) > seen)
    seen_now = f"{shadow['groups'][0]['accesses_seen']:,} accesses seen"
    assert seen_now in _text(driver, "#shadow-body figure .chart-facts")
    state = driver.execute_script(
        "const d = document.querySelector('#shadow-body details');"
        "return [d.open, document.activeElement === d.querySelector('summary')];"
    )
    assert state == [True, True]


def test_no_category_yet_says_so(page: tuple[ScriptedApi, Any]) -> None:
    """A controller with no fitted category (as at its first start) says so, as the
    workers' table says it has no worker (it read "0 of 0 categories listed; curves of
    the 0 with most samples"); a filter that leaves none says that instead."""
    api, driver = page
    listed = api.answers["/v1/categories"].body
    api.set("/v1/categories", [])
    _refresh_now(driver)
    assert _text(driver, "#cat-count") == "No category yet: the first fit lists them."
    api.set("/v1/categories", listed)
    _categories(api)
    _refresh_now(driver)
    driver.find_element("id", "cat-filter").send_keys("no-such")
    _until(driver, "none left", lambda: _text(driver, "#cat-count").startswith("0 of 20"))
    assert _text(driver, "#cat-count") == "0 of 20 categories listed: none matches the filter."


def test_the_version_history_fits_with_a_long_category_in_a_reason(
    page: tuple[ScriptedApi, Any],
) -> None:
    """A version whose reason names a 128-character category (an override's, as the store
    words it): the history still fits its box from 1024 px up, its roll-back buttons in
    view (the name widened the table, and the buttons went behind a scroll bar)."""
    api, driver = page
    name = "queue-" + "x" * 122
    versions = api.answers["/v1/policy/versions"].body
    override = versions[0] | {"version": 3, "note": f"override {name}: " + '{"life_s": 5.0}'}
    api.set("/v1/policy/versions", [override, *versions])
    for width in (1024, 1280, 1400):
        emulate_zoom(driver, width, 900, 1.0)
        _refresh_now(driver)
        table, box = driver.execute_script(
            "const t = document.getElementById('versions');"
            "return [t.getBoundingClientRect().width, t.closest('.table-wrap').clientWidth];"
        )
        assert table <= box + 1, (width, table, box)
    clear_emulation(driver)


def test_the_page_reflows_at_400_percent_zoom(page: tuple[ScriptedApi, Any]) -> None:
    """A 1280-pixel screen at 400 % zoom lays the page out in 320 CSS pixels (the width
    WCAG's reflow criterion names): nothing scrolls sideways but the wide tables in their
    boxes (the nav's links ran 50 px off the page)."""
    _, driver = page
    _assert_reflows_at_400_percent_zoom(driver)


def test_an_action_is_not_sent_again_while_it_waits_for_its_answer(
    page: tuple[ScriptedApi, Any],
) -> None:
    """Refit now confirmed, then asked for again while the refit (2 s here, a fit of every
    category on a live controller) has not answered: the second is refused on the page,
    saying why, and only one refit is sent (each confirmation sent one more)."""
    api, driver = page
    refit = {"published": False, "version": None, "reason": "unchanged", "seconds": 2.0}
    api.set("POST /v1/policy/refit", refit, delay_s=2.0)
    _submit(driver, "refit-form")
    _confirm(driver, by_keyboard=False)
    _until(driver, "the refit sent", lambda: api.in_flight["POST /v1/policy/refit"])
    _submit(driver, "refit-form")
    assert not _dialog_open(driver)
    said = "Nothing was sent: “Refit now” has not answered yet; its outcome shows here."
    assert _result(driver) == said
    _until(driver, "the answer", lambda: _result(driver).startswith("Refit did not publish"))
    assert api.asked["POST /v1/policy/refit"] == 1

"""The /ui dashboard in a real browser (headless Chromium) against a real controller fed by
real simulated workers, all as separate processes on a real Redis.

Checked: the page loads with no console warning or error; it lists every category and
every worker the API lists and draws the categories' curves; it fits a laptop's width and
80 % zoom without sideways scrolling; its controls have names and its text meets AA
contrast; an action without the token, and one with a bad value, show the API's error as
the API gave it; an override made through the page (confirmed in its dialog, by keyboard)
becomes a new version that every worker applies; roll back and refit work from the page.
Screenshots go to ``$KVWISE_TEST_ARTIFACTS`` when set, else to pytest's tmp dir
(``<tmp>/artifacts/``); ``$KVWISE_DOCS_SCREENSHOT`` names where to write the docs' picture.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from controlplane.traces.synth import synthesize
from tests.e2e.browser import (
    CONTRAST_JS,
    NAMES_JS,
    OVERFLOW_JS,
    chromium,
    clear_emulation,
    console_problems,
    emulate_zoom,
    require_chromium,
)
from tests.e2e.procs import Stack, get
from tests.waiting import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
TOKEN = "ui-test-token"
WORKERS = ("w-wa", "w-lru")


@pytest.fixture
def artifacts(tmp_path: Path) -> Path:
    return _artifacts_dir(tmp_path)


@pytest.fixture
def live(
    tmp_path: Path, redis_url: str, key_prefix: str, trace_file: tuple[Path, int]
) -> Iterator[str]:
    """A controller (token required) and two workers; yields the controller's URL once a
    fitted version is out and both workers report."""
    require_chromium()  # skip before starting processes when there is no browser
    stack = Stack(tmp_path, redis_url, key_prefix)
    trace, capacity = trace_file
    try:
        _, url = stack.controller(
            "ctl", KVWISE_API_TOKEN=TOKEN, KVWISE_REFIT_INTERVAL_S="2", KVWISE_LOG_LEVEL="warning"
        )
        for wid, evictor in zip(WORKERS, ("wa", "lru"), strict=True):
            stack.worker(wid, trace, capacity, speed=20, KVWISE_EVICTOR=evictor)
        wait_until(
            lambda: get(url, "/v1/policy")["version"] >= 2, timeout=90, what="a fitted policy"
        )
        wait_until(
            lambda: {a["id"] for a in get(url, "/v1/agents")} == set(WORKERS),
            timeout=60,
            what="both workers",
        )
        yield url
    finally:
        stack.stop_all()


def _until(driver: Any, what: str, check: Callable[[], Any], timeout: float = 30) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.2).until(
        lambda _d: check(), message=f"page: {what}"
    )


def _column(driver: Any, table: str, index: int) -> list[str]:
    script = (
        f"return [...document.querySelectorAll('#{table} tbody tr')]"
        f".map((r) => r.cells[{index}].textContent.trim());"
    )
    return list(driver.execute_script(script))


def _refreshes(driver: Any) -> int:
    return int(driver.execute_script("return Number(document.body.dataset.refreshes || 0)"))


def _next_refresh(driver: Any) -> None:
    seen = _refreshes(driver)
    _until(driver, "one more refresh", lambda: _refreshes(driver) > seen)


def _result(driver: Any) -> str:
    return str(driver.execute_script("return document.getElementById('action-result').innerText"))


def _confirm(driver: Any, *, by_keyboard: bool = True) -> None:
    """Confirm the open dialog: Tab from Cancel (which has the focus) to Confirm, Enter."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    _until(
        driver,
        "the dialog open",
        lambda: driver.execute_script("return document.getElementById('confirm').open"),
    )
    assert driver.switch_to.active_element.get_attribute("id") == "confirm-cancel"
    if by_keyboard:
        ActionChains(driver).send_keys(Keys.TAB).perform()
        assert driver.switch_to.active_element.get_attribute("id") == "confirm-ok"
        ActionChains(driver).send_keys(Keys.ENTER).perform()
    else:
        driver.find_element("id", "confirm-ok").click()
    _until(
        driver,
        "the dialog closed",
        lambda: not driver.execute_script("return document.getElementById('confirm').open"),
    )


def _submit(driver: Any, form: str) -> None:
    driver.find_element("css selector", f"#{form} button[type=submit]").click()


def _fill(driver: Any, element_id: str, text: str) -> None:
    field = driver.find_element("id", element_id)
    field.clear()
    field.send_keys(text)


# Runs in the page: what a viewport hides, one check per part. Each section heading a nav
# link jumps to must be on top there, not under a sticky header (a phone's covered a third
# of the screen); charts drawn at no less than 80 % of their size (a 900-px drawing on a
# phone had 3-px text); no chart text outside its drawing (a clipped last time label); with
# arguments[0], the version history and the shadow tables (opened) not cut by their box.
HEADINGS_JS = """
for (const a of document.querySelectorAll('nav a')) {
  const h = document.querySelector(a.getAttribute('href') + ' h2');
  a.click();
  const r = h.getBoundingClientRect();
  const top = document.elementFromPoint(r.left + 5, r.top + r.height / 2);
  if (!h.contains(top)) problems.push(`heading ${h.textContent} covered by ${top && top.tagName}`);
}
"""
CHART_SCALE_JS = """
for (const s of document.querySelectorAll('svg.chart-svg')) {
  const scale = s.getBoundingClientRect().width / s.viewBox.baseVal.width;
  const name = s.querySelector('title').textContent;
  if (scale < 0.8) problems.push(`chart ${name} at ${scale.toFixed(2)}`);
}
"""
CHART_TEXT_JS = """
for (const s of document.querySelectorAll('svg.chart-svg')) {
  for (const t of s.querySelectorAll('text:not([transform])')) {
    const b = t.getBBox();
    const out = b.x < -0.5 || b.x + b.width > s.viewBox.baseVal.width + 0.5;
    if (out) problems.push(`text ${t.textContent} clipped`);
  }
}
"""
TABLES_JS = """
// Wide tables (categories, workers) scroll in their box by design; these must not need to.
for (const d of document.querySelectorAll('details')) d.open = true;
const tables = arguments[0] ? document.querySelectorAll('#versions, #shadow-body table') : [];
for (const t of tables) {
  const w = t.closest('.table-wrap');
  const cut = t.getBoundingClientRect().width > w.clientWidth + 1;
  if (cut) problems.push(`table ${t.caption.textContent} cut`);
}
for (const d of document.querySelectorAll('details')) d.open = false;
"""
LAYOUT_JS = (
    "const problems = [];"
    + HEADINGS_JS
    + CHART_SCALE_JS
    + TABLES_JS
    + CHART_TEXT_JS
    + "window.scrollTo(0, 0); return problems;"
)


def _layout_and_access(driver: Any) -> None:
    """No sideways scrolling at 1280 px and at 80 % zoom; names and contrast."""
    for zoom in (1.0, 0.8):
        emulate_zoom(driver, 1280, 800, zoom)
        width = driver.execute_script("return window.innerWidth")
        assert width == round(1280 / zoom)
        _next_refresh(driver)
        assert driver.execute_script(OVERFLOW_JS) == [], f"overflow at zoom {zoom}"
        # Charts are drawn no smaller than 80 % of their design size (tick labels stay legible).
        scales = driver.execute_script(
            "return [...document.querySelectorAll('svg.chart-svg')].map((s) => "
            "s.getBoundingClientRect().width / s.viewBox.baseVal.width);"
        )
        assert scales and min(scales) >= 0.8, (zoom, min(scales or [0]))
    for width, height in ((390, 844), (1024, 768), (1400, 900)):
        emulate_zoom(driver, width, height, 1.0)
        _next_refresh(driver)
        problems = driver.execute_script(LAYOUT_JS, width >= 1024)
        assert problems == [], (width, height, problems)
    clear_emulation(driver)
    assert driver.execute_script(NAMES_JS) == []
    contrast = driver.execute_script(CONTRAST_JS)
    assert contrast["checked"] > 200 and contrast["failures"] == [], contrast


def test_dashboard_shows_the_loop_and_acts_through_the_api(
    live: str, tmp_path: Path, artifacts: Path
) -> None:
    url = live
    with chromium(tmp_path / "profile") as driver:
        driver.get(f"{url}/ui/?refresh=2")
        _until(driver, "first refresh", lambda: _refreshes(driver) >= 1)
        _next_refresh(driver)

        # Every category and worker the API lists is on the page; curves are drawn.
        api_categories = {c["name"] for c in get(url, "/v1/categories")}
        _next_refresh(driver)
        page_categories = set(_column(driver, "cat-table", 0))
        assert api_categories and api_categories <= page_categories
        charts = driver.execute_script(
            "return [...document.querySelectorAll('#cat-charts figure')].map((f) => "
            "[f.dataset.category, f.querySelectorAll('path').length]);"
        )
        assert len(charts) == min(12, len(page_categories))
        assert all(paths >= 2 for _, paths in charts), charts  # empirical and fitted
        assert set(_column(driver, "worker-table", 0)) == set(WORKERS)
        version = get(url, "/v1/policy")["version"]
        _next_refresh(driver)
        assert int(driver.find_element("id", "policy-version").text) >= version
        # The shadow section draws the live workers' group (both have one capacity).
        _until(
            driver,
            "shadow curves",
            lambda: driver.find_elements("css selector", "#shadow-body figure"),
            timeout=60,
        )
        legend = driver.find_elements("css selector", "#shadow-body figure .legend li")
        assert [li.text for li in legend] == get(url, "/v1/shadow")["policies"]
        assert console_problems(driver) == []
        driver.save_screenshot(str(artifacts / "dashboard-loaded.png"))

        _layout_and_access(driver)
        assert console_problems(driver) == []

        # Without the token: the API's 401, as the API words it.
        _submit(driver, "refit-form")
        _confirm(driver, by_keyboard=False)
        said = httpx.post(f"{url}/v1/policy/refit").json()
        _until(driver, "the 401", lambda: "HTTP 401" in _result(driver))
        assert f"{said['error']}: {said['reason']}" in _result(driver)

        # With the token, a bad value: the API's 422 reason, word for word.
        _fill(driver, "token", TOKEN)
        category = max(get(url, "/v1/categories"), key=lambda c: c["samples"])["name"]
        _fill(driver, "ov-category", category)
        _fill(driver, "ov-p", "2")
        _submit(driver, "override-form")
        _confirm(driver)
        said = httpx.put(
            f"{url}/v1/policy/overrides/{category}",
            json={"p_reuse": 2},
            headers={"Authorization": f"Bearer {TOKEN}"},
        ).json()
        _until(driver, "the 422", lambda: "HTTP 422" in _result(driver))
        assert f"{said['error']}: {said['reason']}" in _result(driver)
        problems = console_problems(driver)
        assert problems and all(re.search(r" (401|422) ", p) for p in problems), problems

        # Cancel sends nothing.
        before = get(url, "/v1/policy/overrides")
        _fill(driver, "ov-p", "")
        _fill(driver, "ov-life", "7.5")
        _submit(driver, "override-form")
        _until(
            driver,
            "the dialog",
            lambda: driver.execute_script("return document.getElementById('confirm').open"),
        )
        from selenium.webdriver.common.action_chains import ActionChains
        from selenium.webdriver.common.keys import Keys

        ActionChains(driver).send_keys(Keys.ESCAPE).perform()
        _until(driver, "cancelled", lambda: "cancelled" in _result(driver))
        assert get(url, "/v1/policy/overrides") == before

        # The override: a new version that every worker applies.
        _submit(driver, "override-form")
        _confirm(driver)
        _until(driver, "published", lambda: "Published version" in _result(driver))
        match = re.search(r"Published version (\d+)", _result(driver))
        assert match is not None
        published = int(match.group(1))
        doc = get(url, f"/v1/policy/versions/{published}")
        assert doc["note"].startswith(f"override {category}")
        assert doc["categories"][category]["life_s"] == 7.5
        assert doc["categories"][category]["source"] == "override"
        # The same override again publishes nothing, and the dialog's outcome says so.
        _submit(driver, "override-form")
        _confirm(driver)
        _until(driver, "nothing to change", lambda: "Nothing to change" in _result(driver))
        assert "Published version" not in _result(driver)
        _until(
            driver,
            "the version in the history",
            lambda: str(published) in _column(driver, "versions", 0),
        )
        row = _column(driver, "versions", 0).index(str(published))
        assert _column(driver, "versions", 2)[row] == "override"

        def all_applied() -> bool:
            applied = _column(driver, "worker-table", 3)
            return len(applied) == len(WORKERS) and min(int(v) for v in applied) >= published

        _until(driver, "every worker on the new version", all_applied, timeout=60)
        assert all(a["applied_version"] >= published for a in get(url, "/v1/agents"))
        cat_row = _column(driver, "cat-table", 0).index(category)
        assert _column(driver, "cat-table", 2)[cat_row] == "override"
        assert _column(driver, "cat-table", 6)[cat_row] == "7.5"
        assert category in _column(driver, "overrides", 0)
        driver.save_screenshot(str(artifacts / "dashboard-after-override.png"))

        # The roll-back choice follows the newest kept version (it was chosen at page load).
        newest, chosen = driver.execute_script(
            "const kept = [...document.querySelectorAll('#versions tbody tr:not(.current)')]"
            ".map((r) => Number(r.cells[0].textContent));"
            "return [Math.max(...kept), document.getElementById('rb-version').value];"
        )
        assert str(newest) == chosen and newest >= published - 1, (newest, chosen)

        # Roll back to the version before the override, with hold (the operator picks it:
        # refreshes keep that choice); then refit now.
        driver.execute_script(
            "const s = document.getElementById('rb-version'); s.value = arguments[0];"
            "s.dispatchEvent(new Event('change'));",
            str(published - 1),
        )
        _next_refresh(driver)
        assert driver.find_element("id", "rb-version").get_attribute("value") == str(published - 1)
        driver.find_element("id", "rb-hold").click()
        _submit(driver, "rollback-form")
        body = driver.find_element("id", "confirm-body").text
        assert f"parameters of version {published - 1} (published " in body, body
        assert re.search(r"^Version \d+ is in force now\.", body), body
        _confirm(driver)
        _until(
            driver, "rolled back", lambda: f"rollback to version {published - 1}" in _result(driver)
        )
        assert get(url, "/v1/policy/overrides") == {}
        _next_refresh(driver)
        assert _column(driver, "overrides", 0) == []
        assert "held by a rollback" in driver.find_element("id", "refit-held").text
        _submit(driver, "refit-form")
        _confirm(driver)
        _until(driver, "refit answered", lambda: _result(driver).startswith("Refit "))
        assert re.match(r"Refit (published version \d+|did not publish: .+) \(", _result(driver))
        _next_refresh(driver)
        assert not driver.find_elements("id", "refit-held")
        # The last refit: this one, or a scheduled one since (every 2 s here), with its age.
        last = driver.find_element("id", "refit-last").text
        assert re.search(r"^(published|unchanged|skipped|refused|held).* \(.+ ago\)$", last), last
        assert console_problems(driver) == []
        _save_full_page(driver, artifacts / "dashboard.png")
        if docs_picture := os.environ.get("KVWISE_DOCS_SCREENSHOT"):
            # docs/images/dashboard.png: this, then `pngquant` (docs/dashboard.md).
            _save_full_page(driver, Path(docs_picture), zoom=0.75)


def _save_full_page(driver: Any, path: Path, zoom: float = 1.0) -> None:
    """The whole page, 1280 CSS pixels wide, drawn at ``zoom`` device pixels per CSS pixel."""
    emulate_zoom(driver, round(1280 * zoom), 800, zoom)
    height = int(driver.execute_script("return document.documentElement.scrollHeight"))
    emulate_zoom(driver, round(1280 * zoom), round(min(height, 8000) * zoom), zoom)
    driver.save_screenshot(str(path))
    clear_emulation(driver)


def test_shadow_curves_render_from_the_controllers_shadow(
    tmp_path: Path, redis_url: str, key_prefix: str
) -> None:
    """The controller's own shadow evaluation, fed a worker's wire batches at a sampling
    rate of 1, serves GET /v1/shadow; the page draws one curve per policy with its interval
    band, the guard's verdict line, and a table holding the values the API answered."""
    require_chromium()
    from controlplane.service.settings import ControllerSettings
    from tests.agent_stream import agent_batches
    from tests.integration.controller_fixtures import running_controller

    trace = synthesize("to-c", duration_s=120, qps=3, seed=5)
    capacity = max(50, trace.n_unique // 10)
    settings = ControllerSettings(
        redis_url=redis_url, key_prefix=key_prefix, lease_ttl_s=5, shadow_rate=1.0
    )
    with running_controller(settings) as rc:
        shadow = rc.controller.shadow.evaluator
        assert shadow is not None
        shadow.set_capacities({"w-a": capacity})
        for batch in agent_batches(trace, capacity, worker="w-a"):
            shadow.apply(batch)
        shadow.flush("w-a")
        answer = rc.client.get("/v1/shadow").json()
        with chromium(tmp_path / "profile") as driver:
            driver.get(f"{rc.url}/ui/?refresh=0")
            _until(driver, "first refresh", lambda: _refreshes(driver) >= 1)
            figures = driver.find_elements("css selector", "#shadow-body figure")
            assert len(figures) == 1
            legend = [li.text for li in figures[0].find_elements("css selector", ".legend li")]
            assert legend == ["wa", "lru", "s3fifo", "arc"]
            assert len(figures[0].find_elements("css selector", "polygon")) == 4  # bands
            assert "Refit guard" in driver.find_element("id", "shadow-guard").text
            cells = driver.execute_script(
                "return [...document.querySelectorAll('#shadow-body tbody tr')].map((r) => "
                "[...r.cells].map((c) => c.textContent));"
            )
            expected = {
                p["policy"]: [f"{q['hit_ratio']:.4f}" for q in p["points"]]
                for p in answer["groups"][0]["curves"]
            }
            got = {row[0]: [c.split(" ")[0] for c in row[1:]] for row in cells}
            assert got == expected
            assert console_problems(driver) == []
            driver.execute_script("document.getElementById('shadow').scrollIntoView()")
            driver.save_screenshot(str(_artifacts_dir(tmp_path) / "dashboard-shadow.png"))


def _artifacts_dir(tmp_path: Path) -> Path:
    wanted = os.environ.get("KVWISE_TEST_ARTIFACTS")
    out = Path(wanted) if wanted else tmp_path / "artifacts"
    out.mkdir(parents=True, exist_ok=True)
    return out

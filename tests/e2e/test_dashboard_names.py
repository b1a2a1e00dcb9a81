"""The /ui dashboard pins, releases and draws categories of any name an agent can send, in a
real browser against a controller on a real Redis: a reuse class (``<category>/re``), a
label with spaces around it, characters a URL reserves, ``.`` and ``..``. Each reaches the
API as that one name.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import redis

from agent.wire import Keys
from tests.e2e.browser import chromium, console_problems, require_chromium
from tests.e2e.test_dashboard import _confirm, _fill, _refreshes, _submit, _until
from tests.integration.controller_fixtures import (
    RunningController,
    live_settings,
    reuse_batch,
    running_controller,
    send,
)

pytestmark = pytest.mark.e2e
SPACED = " a label "
"""Pinned through the API before the page loads: a category the document in force names."""


@pytest.fixture
def page(
    tmp_path: Path, redis_url: str, key_prefix: str
) -> Iterator[tuple[RunningController, Any]]:
    require_chromium()
    settings = live_settings(redis_url=redis_url, key_prefix=key_prefix, min_samples=20)
    with running_controller(settings) as rc, chromium(tmp_path / "profile") as driver:
        pinned = rc.client.put(f"/v1/policy/overrides/{quote(SPACED, safe='')}", json={"rate": 1})
        assert pinned.status_code == 200, pinned.text
        driver.get(f"{rc.url}/ui/?refresh=2")
        _until(driver, "first refresh", lambda: _refreshes(driver) >= 1)
        yield rc, driver


def test_categories_of_any_name_are_pinned_and_released(
    page: tuple[RunningController, Any],
) -> None:
    """The form once sent a known name trimmed (another category: `` a label `` pinned as
    ``a label``), and a name ``.`` or ``..`` in the path, which the browser resolved as a
    step; each name goes in the query, ``/``, ``%``, ``?`` and ``#`` encoded."""
    rc, driver = page

    def overrides() -> dict[str, dict[str, float]]:
        return dict(rc.client.get("/v1/policy/overrides").json())

    expected = {SPACED: {"rate": 1, "life_s": 5}}
    for name in (SPACED, "text_1/re", "50%?#/..", ".", ".."):
        _fill(driver, "ov-category", name)
        _fill(driver, "ov-life", "5")
        _submit(driver, "override-form")
        _confirm(driver)
        expected.setdefault(name, {"life_s": 5})
        _until(driver, f"{name!r} pinned", lambda: overrides() == expected)
    for name in list(expected):
        label = f"Remove the override of {name}"
        # Found and clicked in one script: a refresh between the two would redraw the row.
        _until(driver, f"{name!r} removed on the page", partial(_click_remove, driver, label))
        _confirm(driver)
        del expected[name]
        _until(driver, f"{name!r} released", lambda: overrides() == expected)


CLICK_REMOVE_JS = """
const button = [...document.querySelectorAll("#overrides button")]
  .find((b) => b.getAttribute("aria-label") === arguments[0]);
if (!button) return false;
button.scrollIntoView({block: "center"});
button.click();
return true;
"""


def _click_remove(driver: Any, label: str) -> bool:
    return bool(driver.execute_script(CLICK_REMOVE_JS, label))


# Runs in the page: each category chart's name and the lines it draws.
CURVES_JS = """
return [...document.querySelectorAll('#cat-charts figure')].map((f) =>
  [f.dataset.category, f.querySelectorAll('g.series path').length]);
"""


def test_the_curves_of_categories_of_any_name_are_drawn(
    page: tuple[RunningController, Any], redis_url: str, key_prefix: str
) -> None:
    """Categories fitted under names an agent can send: each one's curve is drawn, its
    empirical and fitted lines, and the section shows no error (the curves of ``.`` and
    ``..`` were read from paths the browser resolved as a step, ``/v1/categories/`` and
    ``/v1/``: no curve, a 422 and a 404 in the section)."""
    rc, driver = page
    names = (".", "..", "text_1/re", "50%?#/..")
    t0 = time.time() - 60
    r, keys = redis.Redis.from_url(redis_url), Keys(key_prefix)
    for seq, name in enumerate(names, start=1):
        send(
            r, keys, reuse_batch("w0", seq, category=name, n=200, rate=0.5, p=0.6, t0=t0, seed=seq)
        )
    ingested = rc.controller.ingestor.counters
    _until(driver, "the batches ingested", lambda: ingested.batches >= len(names))
    refit = rc.client.post("/v1/policy/refit").json()
    assert refit["published"], refit
    assert set(names) <= {c["name"] for c in rc.client.get("/v1/categories").json()}

    def drawn() -> dict[str, int] | None:
        charts = dict(driver.execute_script(CURVES_JS))
        return charts if set(names) <= set(charts) else None

    lines = _until(driver, "every category's curve", drawn)
    assert all(lines[name] >= 2 for name in names), lines
    assert driver.find_element("id", "categories-error").text == ""
    assert console_problems(driver) == []

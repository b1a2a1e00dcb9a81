"""The /ui dashboard in a real browser when things go wrong: a Redis that stalls under the
controller (SIGSTOP of a private redis-server), a controller that stops, and forms given
what they cannot send. The page must say so, let ages grow, and not flood the console.
"""

from __future__ import annotations

import os
import re
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controlplane.dev.embedded_redis import EmbeddedRedis
from tests.e2e.browser import chromium, console_problems, require_chromium
from tests.e2e.test_dashboard import (
    _artifacts_dir,
    _fill,
    _refreshes,
    _result,
    _submit,
    _until,
)
from tests.integration.controller_fixtures import live_settings, running_controller

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    require_chromium()
    with EmbeddedRedis(tmp_path) as server:
        yield server


def _text(driver: Any, element_id: str) -> str:
    return str(driver.execute_script(f"return document.getElementById('{element_id}').innerText"))


def _published_age_s(driver: Any) -> int:
    """The age the policy's "Published" fact shows, in seconds."""
    text = _text(driver, "policy-current")
    match = re.search(r"\((\d+) s ago\)", text)
    assert match is not None, text
    return int(match.group(1))


def _stall(driver: Any, redis: EmbeddedRedis, artifacts: Path) -> None:
    """Redis stopped (SIGSTOP) for a while: reads time out and say so, the page keeps
    refreshing, ages keep counting and the header stops saying Ready."""
    assert redis.proc is not None
    _until(driver, "ready", lambda: _text(driver, "health").startswith("Ready"))
    age_before = _published_age_s(driver)
    os.kill(redis.proc.pid, signal.SIGSTOP)
    try:
        seen = _refreshes(driver)
        _until(
            driver,
            "the timeout shown",
            lambda: "no answer within" in _text(driver, "policy-error"),
            timeout=20,
        )
        _until(driver, "refreshes go on", lambda: _refreshes(driver) >= seen + 2, timeout=20)
        assert not _text(driver, "health").startswith("Ready")
        assert _published_age_s(driver) >= age_before + 5
        assert "stale: the refresh at" in _text(driver, "updated")
        driver.save_screenshot(str(artifacts / "dashboard-redis-stalled.png"))
    finally:
        os.kill(redis.proc.pid, signal.SIGCONT)
    _until(driver, "recovered", lambda: not _text(driver, "policy-error"), timeout=30)


def _dialog_open(driver: Any) -> bool:
    return bool(driver.execute_script("return document.getElementById('confirm').open"))


def _forms_refuse_what_they_cannot_send(driver: Any) -> None:
    """Only the version in force is kept: Roll back says so and opens no dialog. An
    override of an unknown category asks, naming it as such."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    # The token's help says what api.js does: it goes with every request.
    help_text = driver.find_element("id", "token-help").get_attribute("textContent")
    assert "with every request" in help_text, help_text
    _submit(driver, "rollback-form")
    _until(driver, "the refusal", lambda: "No kept version" in _result(driver))
    assert not _dialog_open(driver)
    # A category the document in force does not name: asked about by name, not refused.
    _fill(driver, "ov-category", "no-such-category")
    _fill(driver, "ov-life", "7")
    _submit(driver, "override-form")
    _until(driver, "the dialog", lambda: _dialog_open(driver))
    title = driver.find_element("id", "confirm-title").text
    assert "no-such-category, which is not a known category" in title, title
    ActionChains(driver).send_keys(Keys.ESCAPE).perform()
    _until(driver, "cancelled", lambda: "cancelled" in _result(driver))
    # A comma is not a decimal point: refused with a message, not sent as 5.
    _fill(driver, "ov-p", "0,5")
    _submit(driver, "override-form")
    _until(driver, "the refusal", lambda: "“0,5” is not a number" in _result(driver))
    assert not _dialog_open(driver)
    _fill(driver, "ov-p", "")


def test_the_page_says_when_it_cannot_load(own_redis: EmbeddedRedis, tmp_path: Path) -> None:
    artifacts = _artifacts_dir(tmp_path)
    settings = live_settings(
        redis_url=own_redis.url, key_prefix=f"kvwise-ui-{uuid.uuid4().hex[:8]}:", lease_ttl_s=5
    )
    with chromium(tmp_path / "profile") as driver:
        with running_controller(settings) as rc:
            driver.get(f"{rc.url}/ui/?refresh=2")
            _until(driver, "first refresh", lambda: _refreshes(driver) >= 1)
            assert driver.title == "kvwise controller"
            _forms_refuse_what_they_cannot_send(driver)
            _stall(driver, own_redis, artifacts)
            _until(driver, "loaded again", lambda: "stale" not in _text(driver, "updated"))
        _controller_down(driver, artifacts)


def _controller_down(driver: Any, artifacts: Path) -> None:
    """The controller gone: "Updated" keeps the time of the last load and says it is stale;
    each section's error names its own read, not the health probe that stood in for it;
    the page's title says the controller is down."""
    _until(driver, "a failed refresh", lambda: "stale" in _text(driver, "updated"), timeout=20)
    first = _text(driver, "updated")
    console_problems(driver)  # drained: what follows is logged while the controller is down
    seen = _refreshes(driver)
    _until(driver, "refreshes while down", lambda: _refreshes(driver) >= seen + 3, timeout=30)
    # One probe per refresh (each a console error), not every read: the log is not flooded.
    problems = console_problems(driver)
    assert len(problems) <= _refreshes(driver) - seen + 1, problems
    updated = _text(driver, "updated")
    assert updated.split(";")[0] == first.split(";")[0], (first, updated)
    assert "; stale: the refresh at" in updated, updated
    assert "Controller unreachable" in _text(driver, "health")
    assert driver.title == "(down) kvwise controller"  # a background tab's title says so
    # Each section names its own read, not sent, and the probe's failure as the reason.
    for box, read in (
        ("policy-error", "/v1/policy"),
        ("categories-error", "/v1/categories"),
        ("workers-error", "/v1/agents"),
        ("shadow-error", "/v1/shadow"),
    ):
        said = _text(driver, box)
        assert said.startswith(f"GET {read}: unreachable: not sent, since GET /healthz"), said
    driver.save_screenshot(str(artifacts / "dashboard-controller-down.png"))

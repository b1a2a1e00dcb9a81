"""The /ui dashboard in a real browser against the stand-in controller
(tests/e2e/scripted_api), in states a reader could misread: the controller gone while the
shadow curves are shown, a controller that answers but is not ready.

Checked: the shadow section says its curves are stale, and of when, while the controller
does not answer; the title says *(not ready)* as it says *(down)*.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.e2e.scripted_api import ScriptedApi
from tests.e2e.test_dashboard_scripted import _refresh_now, _text

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

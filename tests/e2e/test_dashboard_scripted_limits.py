"""The /ui dashboard in a real browser against the stand-in controller
(tests/e2e/scripted_api), at its limits: many categories drawn in turn, a curve asked for
twice at once.

Checked: the page keeps the curves of a bounded number of categories, not of every one it
ever drew.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.scripted_api import ScriptedApi
from tests.e2e.test_dashboard import _fill, _until
from tests.e2e.test_dashboard_scripted import _categories, _charts, _refresh_now

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
    assert api.asked["/v1/categories/cat_000"] == 2
    assert api.asked["/v1/categories/cat_119"] == 1

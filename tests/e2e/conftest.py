"""Fixtures shared by the end-to-end tests."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controlplane.traces.synth import synthesize
from controlplane.traces.writer import write_bailian
from tests.conftest import delete_prefix
from tests.e2e.browser import chromium, console_problems, require_chromium
from tests.e2e.scripted_api import Answer, ScriptedApi, captured_answers, scripted_api
from tests.e2e.test_dashboard import _refreshes, _until


@pytest.fixture(scope="session")
def trace_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    """Ten minutes of synthetic to-C traffic and a cache of 10 % of its unique blocks."""
    trace = synthesize("to-c", duration_s=600, qps=3, seed=7)
    path = tmp_path_factory.mktemp("trace") / "toc.jsonl"
    write_bailian(trace, path)
    return path, max(100, trace.n_unique // 10)


@pytest.fixture(scope="module")
def real_answers(redis_url: str) -> Iterator[dict[str, Answer]]:
    """What a real controller on a real Redis answers to each of the page's reads."""
    require_chromium()  # skip before starting a controller when there is no browser
    prefix = f"kvwise-ui-{uuid.uuid4().hex[:8]}:"
    try:
        yield captured_answers(redis_url, prefix)
    finally:
        delete_prefix(redis_url, prefix)


@pytest.fixture
def page(real_answers: dict[str, Answer], tmp_path: Path) -> Iterator[tuple[ScriptedApi, Any]]:
    """The stand-in and a browser showing its dashboard (refresh paused), loaded once."""
    with scripted_api(real_answers) as api, chromium(tmp_path / "profile") as driver:
        driver.get(f"{api.url}/ui/?refresh=0")
        _until(driver, "first refresh", lambda: _refreshes(driver) >= 1)
        yield api, driver
        assert console_problems(driver) == []

"""Scheduled refits that fail with something other than Redis trouble: counted, said once
with the traceback, and the schedule goes on. Each test failed before its fix."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from controlplane.fit.reuse_window import WindowState
from controlplane.service.controller import Controller
from tests.integration.controller_fixtures import controller, recent_window
from tests.waiting import wait_until

pytestmark = pytest.mark.integration


def window_naming(name: object) -> WindowState:
    """A window (the controller's default shape) of one category ``name`` with reuses
    enough for a fit of its own, opened over the last minute."""
    return dataclasses.replace(recent_window(["a"], accesses_each=400), names=(name,))


def test_a_scheduled_refit_that_raises_is_counted_said_once_and_tried_again(
    redis_url: str, key_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Only ``redis.RedisError`` was caught: anything else went to the scheduler's log
    (kept below warning), uncounted in refits{outcome="error"}, unsaid by the controller.
    A window holding a category named 7 makes every refit's policy document refuse that
    name (a pydantic ``ValidationError``). It came from a checkpoint in Redis, which is now
    refused at takeover (test_controller_checkpoint_refused.py) and reaches no refit; no
    other real input is known to reach one with an unexpected error, so the window is
    restored here before the controller starts, as a checkpoint naming 7 restored it."""

    def restore_a_numeric_name(c: Controller) -> None:
        c.window.restore(window_naming(7))

    caplog.set_level(logging.DEBUG, logger="controlplane.service.refit")
    with controller(
        redis_url, key_prefix, before_start=restore_a_numeric_name, refit_interval_s=0.1
    ) as c:
        errors = lambda: c.metrics.registry.get_sample_value(  # noqa: E731
            "kvwise_refits_total", {"outcome": "error"}
        )
        wait_until(lambda: (errors() or 0) >= 3, timeout=20, what="three failed refits")
        assert c.scheduler.get_job("refit") is not None
    said = [
        rec
        for rec in caplog.records
        if rec.name == "controlplane.service.refit" and "refit failed" in rec.getMessage()
    ]
    loud = [rec for rec in said if rec.levelno >= logging.WARNING]
    assert len(loud) == 1, [rec.getMessage() for rec in loud]
    assert loud[0].levelno == logging.ERROR and loud[0].exc_info is not None
    assert len(said) >= 3 and all(
        rec.levelno == logging.DEBUG for rec in said if rec is not loud[0]
    )

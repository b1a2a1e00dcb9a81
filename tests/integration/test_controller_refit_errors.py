"""Scheduled refits that fail with something other than Redis trouble: counted, said once
with the traceback, and the schedule goes on. Each test failed before its fix."""

from __future__ import annotations

import dataclasses
import logging
import time

import numpy as np
import pytest
import redis

from agent.wire import Keys
from controlplane.fit.reuse_window import ReuseStats
from controlplane.service.checkpoint import encode as encode_checkpoint
from controlplane.service.settings import ControllerSettings
from tests.integration.controller_fixtures import controller
from tests.waiting import wait_until

pytestmark = pytest.mark.integration


def checkpoint_naming(name: object) -> bytes:
    """A checkpoint of a window (the controller's default shape) of one category ``name``
    (its header is JSON: a damaged or foreign one may name a number) with reuses enough for
    a fit of its own, opened over the last minute."""
    settings = ControllerSettings()
    stats = ReuseStats(
        settings.window_s,
        near_concurrent_s=settings.near_concurrent_s,
        n_buckets=settings.window_buckets,
    )
    n, now = 400, time.time()
    ts = np.linspace(now - 60, now - 1, n)
    stats.ingest(ts, np.zeros(n, np.int32), ts - 5.0, np.zeros(n, np.int32), names=["a"])
    state = dataclasses.replace(stats.state(), names=(name,))
    return encode_checkpoint(state, writer="an-older-leader", process="older")


def test_a_scheduled_refit_that_raises_is_counted_said_once_and_tried_again(
    redis_url: str, key_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Only ``redis.RedisError`` was caught: anything else went to the scheduler's log
    (kept below warning), uncounted in refits{outcome="error"}, unsaid by the controller.
    A checkpoint in Redis naming a category 7 is loaded, and every refit's policy document
    then refuses that name (a pydantic ``ValidationError``)."""
    r = redis.Redis.from_url(redis_url)
    r.set(Keys(key_prefix).checkpoint, checkpoint_naming(7))
    caplog.set_level(logging.DEBUG, logger="controlplane.service.controller")
    with controller(redis_url, key_prefix, refit_interval_s=0.1) as c:
        errors = lambda: c.metrics.registry.get_sample_value(  # noqa: E731
            "kvwise_refits_total", {"outcome": "error"}
        )
        wait_until(lambda: (errors() or 0) >= 3, timeout=20, what="three failed refits")
        assert c.scheduler.get_job("refit") is not None
    said = [
        rec
        for rec in caplog.records
        if rec.name == "controlplane.service.controller" and "refit failed" in rec.getMessage()
    ]
    loud = [rec for rec in said if rec.levelno >= logging.WARNING]
    assert len(loud) == 1, [rec.getMessage() for rec in loud]
    assert loud[0].levelno == logging.ERROR and loud[0].exc_info is not None
    assert len(said) >= 3 and all(
        rec.levelno == logging.DEBUG for rec in said if rec is not loud[0]
    )

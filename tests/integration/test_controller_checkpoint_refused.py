"""A damaged checkpoint in Redis is refused whole at takeover: said with the key, the field
and the category, counted in checkpoints{outcome="refused"}; the window starts empty and the
next checkpoint overwrites it. Each case loaded before (and a numeric name then failed every
refit)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from contextlib import AbstractContextManager

import numpy as np
import pytest
import redis

from agent.wire import MAX_CATEGORY_NAME_CHARS, Keys
from controlplane.fit.reuse_window import ReuseStats, WindowState
from controlplane.service.checkpoint import decode as decode_checkpoint
from controlplane.service.checkpoint import encode as encode_checkpoint
from controlplane.service.controller import Controller
from tests.integration.controller_fixtures import controller, recent_window

pytestmark = pytest.mark.integration

MAX_CATEGORIES = 2
"""The controllers' ``max_categories`` here: a checkpoint of three holds too many."""


def small_controller(redis_url: str, key_prefix: str) -> AbstractContextManager[Controller]:
    """A controller whose window holds ``MAX_CATEGORIES`` categories."""
    return controller(
        redis_url,
        key_prefix,
        max_categories=MAX_CATEGORIES,
        max_categories_per_worker=MAX_CATEGORIES,
    )


def with_count(field: str, value: float) -> WindowState:
    """A window of one category whose first ``field`` count is ``value`` (float counts
    are stored as floats, as a foreign writer might)."""
    state = recent_window(["a"])
    counts = getattr(state, field).astype(np.float64 if np.isnan(value) else np.int64)
    counts[(0,) * counts.ndim] = value
    return dataclasses.replace(state, **{field: counts})


DAMAGE: dict[str, tuple[Callable[[], WindowState], str]] = {
    "a numeric category name": (
        lambda: dataclasses.replace(recent_window(["a"]), names=(7,)),  # type: ignore[arg-type]
        "field 'names', category 0 (7)",
    ),
    "a name of 129 characters": (
        lambda: dataclasses.replace(
            recent_window(["a"]), names=("x" * (MAX_CATEGORY_NAME_CHARS + 1),)
        ),
        f"of {MAX_CATEGORY_NAME_CHARS + 1} characters): a category name is a string of 1 to "
        f"{MAX_CATEGORY_NAME_CHARS} characters",
    ),
    "a NaN count": (lambda: with_count("accesses", np.nan), "'accesses' holds float64 counts"),
    "a negative count": (
        lambda: with_count("near_concurrent", -1),
        "'near_concurrent', category 'a': count -1",
    ),
    "too many categories": (
        lambda: recent_window(["a", "b", "c"]),
        f"holds 3 categories > max_categories ({MAX_CATEGORIES})",
    ),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_checkpoint_is_refused_counted_and_overwritten(
    damage: str, redis_url: str, key_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    damaged, said = DAMAGE[damage]
    key = Keys(key_prefix).checkpoint
    r = redis.Redis.from_url(redis_url)
    r.set(key, encode_checkpoint(damaged(), writer="an-older-leader", process="older"))
    caplog.set_level(logging.INFO, logger="controlplane.service.controller")
    with small_controller(redis_url, key_prefix) as c:
        refused = c.metrics.registry.get_sample_value(
            "kvwise_checkpoints_total", {"outcome": "refused"}
        )
        assert refused == 1
        assert c.window.categories == 0 and c.window.revision == 0
        process = c.process_id
    warnings = [
        rec.getMessage()
        for rec in caplog.records
        if rec.name == "controlplane.service.controller" and rec.levelno == logging.WARNING
    ]
    assert any(
        "no checkpoint loaded" in m and key in m and said in m and "starts empty" in m
        for m in warnings
    ), warnings
    stored = r.get(key)
    assert stored is not None
    overwritten = decode_checkpoint(stored)
    assert overwritten.process == process and overwritten.state.names == ()


def test_a_sound_checkpoint_still_loads(
    redis_url: str, key_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The checks refuse damage only: a leader's own checkpoint of as many categories as
    the window may hold loads."""
    r = redis.Redis.from_url(redis_url)
    state = recent_window(["a", "b"])
    r.set(Keys(key_prefix).checkpoint, encode_checkpoint(state, writer="w", process="older"))
    with small_controller(redis_url, key_prefix) as c:
        assert c.window.categories == 2
        assert (
            c.metrics.registry.get_sample_value("kvwise_checkpoints_total", {"outcome": "refused"})
            == 0
        )


def test_a_checkpoint_of_other_window_settings_is_refused_and_counted(
    redis_url: str, key_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Sound but taken with another window length: ignored as before, and now counted."""
    key = Keys(key_prefix).checkpoint
    r = redis.Redis.from_url(redis_url)
    other = ReuseStats(60.0, categories=["a"]).state()
    r.set(key, encode_checkpoint(other, writer="w", process="older"))
    caplog.set_level(logging.INFO, logger="controlplane.service.controller")
    with controller(redis_url, key_prefix) as c:
        assert (
            c.metrics.registry.get_sample_value("kvwise_checkpoints_total", {"outcome": "refused"})
            == 1
        )
        assert c.window.categories == 0
    assert f"checkpoint {key} ignored (the state was taken with other window settings)" in (
        caplog.text
    )

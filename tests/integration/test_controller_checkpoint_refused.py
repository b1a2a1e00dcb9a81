"""A damaged checkpoint in Redis is refused whole at takeover: said with the key, the field
and the category (or its size, its type, what it declares), counted in
checkpoints{outcome="refused"}; the window starts empty and the next checkpoint overwrites
it. Each case loaded before (and a numeric name then failed every refit), or worse: a value
over max_checkpoint_bytes and an archive declaring far more than the window holds were read
and unpacked whole, and a key of another type read as Redis failing, so the leader never
ingested."""

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
from tests import checkpoint_bombs
from tests.integration.controller_fixtures import controller, recent_window

pytestmark = pytest.mark.integration

MAX_CATEGORIES = 2
"""The controllers' ``max_categories`` here: a checkpoint of three holds too many."""
MAX_CHECKPOINT_BYTES = 1 << 16
"""The controllers' ``max_checkpoint_bytes`` here (the least allowed)."""
BOMB_BYTES = 32 << 20
"""What the zip bomb's gap counts declare (in about 32 KiB): ten thousand times what the
window holds."""


def small_controller(redis_url: str, key_prefix: str) -> AbstractContextManager[Controller]:
    """A controller whose window holds ``MAX_CATEGORIES`` categories."""
    return controller(
        redis_url,
        key_prefix,
        max_categories=MAX_CATEGORIES,
        max_categories_per_worker=MAX_CATEGORIES,
        max_checkpoint_bytes=MAX_CHECKPOINT_BYTES,
    )


Store = Callable[[redis.Redis, str], object]
"""Writes a damaged checkpoint to the key."""


def storing(damaged: Callable[[], WindowState]) -> Store:
    """Stores ``damaged()`` as an older leader's checkpoint."""
    return lambda r, key: r.set(
        key, encode_checkpoint(damaged(), writer="an-older-leader", process="older")
    )


def with_count(field: str, value: float) -> WindowState:
    """A window of one category whose first ``field`` count is ``value`` (float counts
    are stored as floats, as a foreign writer might)."""
    state = recent_window(["a"])
    counts = getattr(state, field).astype(np.float64 if np.isnan(value) else np.int64)
    counts[(0,) * counts.ndim] = value
    return dataclasses.replace(state, **{field: counts})


DAMAGE: dict[str, tuple[Store, str]] = {
    "a numeric category name": (
        storing(lambda: dataclasses.replace(recent_window(["a"]), names=(7,))),  # type: ignore[arg-type]
        "field 'names', category 0 (7)",
    ),
    "a name of 129 characters": (
        storing(
            lambda: dataclasses.replace(
                recent_window(["a"]), names=("x" * (MAX_CATEGORY_NAME_CHARS + 1),)
            )
        ),
        f"of {MAX_CATEGORY_NAME_CHARS + 1} characters): a category name is a string of 1 to "
        f"{MAX_CATEGORY_NAME_CHARS} characters",
    ),
    "a NaN count": (
        storing(lambda: with_count("accesses", np.nan)),
        "'accesses' holds float64 counts",
    ),
    "a negative count": (
        storing(lambda: with_count("near_concurrent", -1)),
        "'near_concurrent', category 'a': count -1",
    ),
    "too many categories": (
        storing(lambda: recent_window(["a", "b", "c"])),
        f"holds 3 categories > max_categories ({MAX_CATEGORIES})",
    ),
    "a value over max_checkpoint_bytes": (
        lambda r, key: r.set(key, b"x" * (MAX_CHECKPOINT_BYTES + 1)),
        f"checkpoint of {MAX_CHECKPOINT_BYTES + 1:,} bytes > max_checkpoint_bytes "
        f"({MAX_CHECKPOINT_BYTES:,}; not read)",
    ),
    "a key of another type": (
        lambda r, key: r.rpush(key, b"a list"),
        "the key holds a list, not a checkpoint (not read)",
    ),
    "a zip bomb": (
        lambda r, key: r.set(
            key, checkpoint_bombs.declaring(encode_checkpoint(recent_window(["a"])), BOMB_BYTES)
        ),
        f"'gaps' declares shape ({BOMB_BYTES // 4},) of int32 ({BOMB_BYTES:,} bytes): more than "
        "a window of these settings holds",
    ),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_checkpoint_is_refused_counted_and_overwritten(
    damage: str, redis_url: str, key_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    store, said = DAMAGE[damage]
    key = Keys(key_prefix).checkpoint
    r = redis.Redis.from_url(redis_url)
    store(r, key)
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

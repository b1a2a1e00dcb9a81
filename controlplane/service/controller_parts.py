"""The controller's parts as its settings build them: its Redis clients, its statistics
window and the window's checkpoint store.

Owns ``redis_client`` (with ``CALL_RETRIES`` retries, or none for a probe bounded by
``PROBE_TIMEOUT_S``; its calls optionally given up as the controller stops),
``live_window`` and ``checkpoint_store``: each sized and bounded by ``ControllerSettings``,
built once at start (and by the offline benches alike). It must never start anything,
take the lease or read the environment (the settings do).
"""

from __future__ import annotations

import threading

from agent.runtime.connection import RedisClient, connect
from agent.wire import Keys
from controlplane.fit.reuse_window import ReuseStats
from controlplane.service.checkpoint import CheckpointBounds, CheckpointStore
from controlplane.service.settings import ControllerSettings
from controlplane.service.window import LiveWindow, WindowLimits

CALL_TIMEOUT_S = 5.0
"""Longest wait of one attempt of a controller's Redis call (connect, send or read)."""
CALL_RETRIES = 3
"""Retries of one Redis call (capped exponential backoff) before the controller sees it."""
PROBE_TIMEOUT_S = 1.0
"""Longest wait of a probe (one call, no retry): a stalled Redis costs readiness and a
scrape this long, within a kubelet's timeout, not the retried calls' tens of seconds."""


def redis_client(
    settings: ControllerSettings,
    *,
    timeout_s: float = CALL_TIMEOUT_S,
    retries: int = CALL_RETRIES,
    give_up: threading.Event | None = None,
) -> RedisClient:
    """The controller's client for ``settings.redis_url`` (``RedisUrlError`` if malformed);
    once ``give_up`` is set, its calls fail at once and retry nothing (``connect``)."""
    return connect(
        settings.redis_url,
        timeout_s=timeout_s,
        retries=retries,
        cluster=settings.redis_cluster,
        health_check_s=15,
        give_up=give_up,
    )


def live_window(settings: ControllerSettings) -> LiveWindow:
    """An empty statistics window as ``settings`` size and bound it."""
    return LiveWindow(
        ReuseStats(
            window_s=settings.window_s,
            near_concurrent_s=settings.near_concurrent_s,
            n_buckets=settings.window_buckets,
        ),
        WindowLimits(
            clock_tolerance_s=settings.clock_tolerance_s,
            max_categories=settings.max_categories,
            max_categories_per_worker=settings.max_categories_per_worker,
        ),
    )


def checkpoint_store(
    client: RedisClient, keys: Keys, settings: ControllerSettings, window: LiveWindow
) -> CheckpointStore:
    """The checkpoint of ``window``, bounded as ``settings`` bound the window and its size."""
    return CheckpointStore(
        client,
        keys.checkpoint,
        max_bytes=settings.max_checkpoint_bytes,
        bounds=CheckpointBounds.of(window.stats, settings.max_categories),
    )

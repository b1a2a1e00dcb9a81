"""A real controller for tests: uvicorn on a free loopback port, real Redis, real HTTP;
its settings for live tests, and wire batches to feed it."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
import redis
from fastapi import FastAPI

from agent.wire import EventBatch, EventKind, Keys, encode_batch
from controlplane.api.server import build_app
from controlplane.dev.embedded_redis import free_port
from controlplane.fit.reuse_window import ReuseStats, WindowState
from controlplane.service.controller import Controller
from controlplane.service.settings import ControllerSettings
from tests.loopback_server import serving
from tests.waiting import wait_until
from tests.wire_samples import event_batch

TOKEN = "test-api-token"
"""The API token (``api_token``) of the controllers the tests that need one start."""
AUTH = {"Authorization": f"Bearer {TOKEN}"}
"""Request headers that carry ``TOKEN``."""


@dataclass
class RunningController:
    url: str
    controller: Controller
    client: httpx.Client
    app: FastAPI


def live_settings(**fields: Any) -> ControllerSettings:
    """Settings of a controller under test: it refits only when the test asks and waits
    100 ms after an ingest pass that found nothing; ``fields`` set the others (Redis URL
    and key prefix at least) or override these."""
    return ControllerSettings(**{"refit_interval_s": 3600, "ingest_block_ms": 100, **fields})


@contextmanager
def controller(
    redis_url: str,
    prefix: str,
    before_start: Callable[[Controller], None] | None = None,
    **settings: Any,
) -> Iterator[Controller]:
    """A started controller without HTTP, once it leads and ingests (``settings`` override
    the defaults: no scheduled refit or checkpoint); stopped on exit. ``before_start`` is
    given the controller before any of its threads runs (to wrap a part its first pass
    uses)."""
    defaults: dict[str, Any] = {
        "refit_interval_s": 3600,
        "checkpoint_interval_s": 3600,
        "min_samples": 50,
        "ingest_block_ms": 50,
        "lease_ttl_s": 5,
        "consumer_name": "ctl-test",
        "stream_trim_grace_s": 0,  # tests that look at trimming see it at once
    }
    c = Controller(
        ControllerSettings(redis_url=redis_url, key_prefix=prefix, **{**defaults, **settings})
    )
    if before_start is not None:
        before_start(c)
    c.start()
    try:
        wait_until(lambda: c.lease.is_leader and c.ingestor.running, what="leadership")
        yield c
    finally:
        c.stop()


@contextmanager
def running_controller(settings: ControllerSettings) -> Iterator[RunningController]:
    port = free_port()
    settings = settings.model_copy(update={"host": "127.0.0.1", "port": port})
    controller = Controller(settings)
    app = build_app(settings, controller)
    with (
        serving(app, port, what="the controller") as url,
        httpx.Client(base_url=url, timeout=10) as client,
    ):

        def healthy() -> bool:
            try:
                return client.get("/healthz").status_code == 200
            except httpx.TransportError:
                return False

        wait_until(healthy, timeout=20, what="the controller to answer /healthz")
        yield RunningController(url, controller, client, app)


def reuse_batch(
    worker: str,
    seq: int,
    *,
    category: str,
    n: int,
    rate: float,
    p: float,
    t0: float,
    seed: int,
    epoch: str = "e1",
) -> EventBatch:
    """``n`` accesses of one category at times t0.., a share ``p`` of which are reused
    after an exponential gap of ``rate``: 2n events at most (access, then its reuse)."""
    rng = np.random.default_rng(seed)
    ts = t0 + np.sort(rng.uniform(0, 5.0, n))
    reused = rng.random(n) < p
    gaps = rng.exponential(1 / rate, n)
    re_ts = ts[reused] + gaps[reused]
    all_ts = np.concatenate([ts, re_ts])
    prev = np.concatenate([np.full(n, np.nan), ts[reused]])
    prev_cat = np.concatenate([np.full(n, -1), np.zeros(int(reused.sum()))]).astype(np.int32)
    return event_batch(
        worker=worker,
        seq=seq,
        epoch=epoch,
        categories=(category,),
        ts=all_ts,
        block=rng.integers(0, 2**62, len(all_ts)),
        kind=EventKind.INSERT,
        prev_ts=prev,
        prev_category=prev_cat,
    )


def send(client: redis.Redis, keys: Keys, batch: EventBatch) -> None:
    client.xadd(keys.events_stream(batch.worker), encode_batch(batch))  # type: ignore[arg-type]


def good_batch(worker: str, seq: int, *, t0: float | None = None, n: int = 200) -> EventBatch:
    """A batch of ``n`` accesses of ``text_1`` that the window takes (10 s old by default)."""
    t0 = time.time() - 10 if t0 is None else t0
    return reuse_batch(worker, seq, category="text_1", n=n, rate=0.5, p=0.5, t0=t0, seed=seq)


def ingest_good_batches(c: Controller, client: redis.Redis, worker: str, n: int) -> None:
    """Send ``worker``'s good batches 1..``n`` and wait until ``c`` has ingested them and
    committed the pass (acknowledged: a batch is counted when applied, before the commit,
    and a test that deposes the leader in between would find them unacknowledged)."""
    keys = Keys(c.settings.key_prefix)
    stream, group = keys.events_stream(worker), c.settings.consumer_group
    for seq in range(1, n + 1):
        send(client, keys, good_batch(worker, seq))
    wait_until(lambda: c.ingestor.counters.batches == n, what=f"{n} batches ingested")
    wait_until(lambda: client.xpending(stream, group)["pending"] == 0, what="the pass committed")


def acknowledged_stream(client: redis.Redis, keys: Keys, worker: str) -> str:
    """``worker``'s stream holding one batch, read and acknowledged by consumer ``ctl`` of
    the group ``controller``: nothing unread or pending, as a sweep finds a dead worker's."""
    stream = keys.events_stream(worker)
    client.xadd(stream, encode_batch(good_batch(worker, 1)))  # type: ignore[arg-type]
    client.xgroup_create(stream, "controller", id="0")
    [(_, [(entry_id, _)])] = client.xreadgroup("controller", "ctl", {stream: ">"})
    client.xack(stream, "controller", entry_id)
    return stream


def recent_window(names: list[str], accesses_each: int = 100) -> WindowState:
    """A window of the controller's default shape holding ``names``, each with
    ``accesses_each`` accesses (and their reuses, 5 s apart) over the last minute, as a
    leader would checkpoint it."""
    settings = ControllerSettings()
    stats = ReuseStats(
        settings.window_s,
        near_concurrent_s=settings.near_concurrent_s,
        n_buckets=settings.window_buckets,
    )
    now = time.time()
    ts = np.linspace(now - 60, now - 1, accesses_each)
    for code in range(len(names)):
        cat = np.full(accesses_each, code, np.int32)
        stats.ingest(ts, cat, ts - 5.0, cat, names=names)
    return stats.state()

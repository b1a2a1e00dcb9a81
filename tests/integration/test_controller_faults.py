"""Faults the controller rides out without counting a batch twice, losing an entry or its
checkpoint, or failing a request: a lease lost between apply and commit, a worker coming
back while the sweep deletes its stream, a body nested past the JSON parser, a checkpoint
read that fails at takeover, a ledger stored in a shape this release cannot read, one
stream's commit failing beside others or before its entries are reclaimed, a bug in the
shadow."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis

from agent.wire import EventBatch, Keys, encode_batch
from controlplane.dev.embedded_redis import free_port
from controlplane.service.checkpoint import decode as decode_checkpoint
from controlplane.service.controller import Controller
from controlplane.service.housekeeping import Housekeeper, HousekeepingSettings
from controlplane.service.stream_io import Committed
from tests.integration.controller_fixtures import (
    AUTH,
    TOKEN,
    acknowledged_stream,
    controller,
    good_batch,
    live_settings,
    running_controller,
    send,
)
from tests.waiting import wait_until

pytestmark = pytest.mark.integration


def test_a_lease_lost_between_apply_and_commit_does_not_count_a_batch_twice(
    redis_url: str, key_prefix: str, r: redis.Redis, keys: Keys
) -> None:
    applied: list[int] = []
    with controller(redis_url, key_prefix, lease_ttl_s=60, reclaim_idle_ms=200) as c:
        apply = c.ingestor.apply

        def apply_then_lose_the_lease(batch: EventBatch) -> int:
            applied.append(batch.seq)
            rejected = apply(batch)
            if len(applied) == 1:
                r.delete(keys.leader)  # the lease lapsed (a pause past its TTL)
            return rejected

        c.ingestor.apply = apply_then_lose_the_lease  # type: ignore[method-assign]
        batch = good_batch("w1", 1)
        send(r, keys, batch)
        wait_until(lambda: not c.ingestor.running, what="ingest to stop at its commit")
        c._tick_lease()  # nobody else took it: this replica leads again
        wait_until(lambda: c.ingestor.running, what="ingest again")
        stream = keys.events_stream("w1")
        wait_until(lambda: r.xpending(stream, "controller")["pending"] == 0, what="the commit")
        time.sleep(0.3)
        assert c.window.snapshot(time.time()).total_accesses == len(batch)
        assert applied == [1]


class _WorkerComesBackDuringTheSweep(redis.Redis):
    """A real client on which the worker restarts and XADDs a batch just before the first
    command the sweep sends after its XINFO (a pipeline, which this hook does not see):
    Redis serves the worker between any two of the sweep's calls."""

    def __init__(self, client: redis.Redis, stream: str) -> None:
        super().__init__(connection_pool=client.connection_pool)
        self._worker, self._stream, self._came_back = client, stream, False

    def execute_command(self, *args: Any, **options: Any) -> Any:
        if not self._came_back:
            self._came_back = True
            self._worker.xadd(self._stream, encode_batch(good_batch("w1", 1)))  # type: ignore[arg-type]
        return super().execute_command(*args, **options)


def test_housekeeping_never_deletes_an_entry_added_after_it_judged_the_stream(
    r: redis.Redis, keys: Keys
) -> None:
    stream = acknowledged_stream(r, keys, "w1")
    sweep = HousekeepingSettings(interval_s=1, worker_expire_s=1, stale_consumer_s=1)
    racing = _WorkerComesBackDuringTheSweep(r, stream)
    keeper = Housekeeper(racing, keys, group="controller", consumer="ctl", settings=sweep)
    keeper.sweep([stream.encode()], now=time.time() + 3600)
    assert r.xlen(stream) >= 1, "the batch the worker sent during the sweep is gone"


NESTED_JSON = b'{"force": ' + b"[" * 6000 + b"]" * 6000 + b"}"
"""A body under the 16 KiB bound, nested deeper than Python's json parser recurses."""


@pytest.mark.parametrize(
    ("method", "path"),
    [("POST", "/v1/policy/refit"), ("DELETE", "/v1/policy/evictor")],
)
def test_a_deeply_nested_body_on_a_route_that_takes_none_is_a_422(
    redis_url: str, key_prefix: str, method: str, path: str
) -> None:
    settings = live_settings(redis_url=redis_url, key_prefix=key_prefix, api_token=TOKEN)
    with running_controller(settings) as rc:
        answer = rc.client.request(method, path, content=NESTED_JSON, headers=AUTH)
        assert answer.status_code == 422, answer.text
        assert answer.json()["field"] == "body"


def test_a_failed_checkpoint_read_at_takeover_does_not_overwrite_the_checkpoint(
    redis_url: str, key_prefix: str, r: redis.Redis, keys: Keys
) -> None:
    with controller(redis_url, key_prefix, consumer_name="old") as old:
        send(r, keys, good_batch("w1", 1))
        wait_until(lambda: old.ingestor.counters.batches == 1, what="the old leader's batch")
        kept = old.window.snapshot(time.time()).total_accesses
    assert kept > 0 and r.exists(keys.checkpoint)  # written as the old leader stopped
    new = Controller(
        live_settings(
            redis_url=redis_url,
            key_prefix=key_prefix,
            consumer_name="new",
            checkpoint_interval_s=0.1,
        )
    )
    checkpoint_client = new.checkpoints.r
    new.checkpoints.r = redis.Redis(port=free_port(), socket_connect_timeout=0.2)  # nobody
    try:
        new.start()  # takes the lease; its one read of the checkpoint fails
        new.checkpoints.r = checkpoint_client  # Redis answers again
        checkpoints = new.metrics.registry.get_sample_value
        wait_until(
            lambda: (checkpoints("kvwise_checkpoints_total", {"outcome": "written"}) or 0) >= 1,
            what="a checkpoint by the new leader",
        )
    finally:
        new.stop()
    restored = decode_checkpoint(r.get(keys.checkpoint) or b"")
    assert restored.state.accesses.sum() >= kept, "the old leader's window is gone"


def test_one_unreadable_ledger_does_not_stop_ingest_of_other_workers(
    redis_url: str, key_prefix: str, r: redis.Redis, keys: Keys
) -> None:
    r.hset(keys.ingest_state("w1"), mapping={"epochs": '{"e1": 5}'})
    with controller(redis_url, key_prefix) as c:
        send(r, keys, good_batch("w1", 1))
        send(r, keys, good_batch("w2", 1))
        wait_until(lambda: c.ingestor.counters.batches == 2, what="both workers' batches")


def test_a_stream_whose_commit_fails_leaves_the_others_dead_letters_written(
    redis_url: str, key_prefix: str, r: redis.Redis, keys: Keys
) -> None:
    """One pass reads a poison entry from w1 and a good batch from w2; w2's commit fails
    (its key is no longer a stream). w1's commit deleted the poison entry: its dead letter
    must be written all the same, or nothing records it at all."""
    r.xadd(keys.events_stream("w1"), {b"v": b"\xff"})
    send(r, keys, good_batch("w2", 1))
    both: list[bool] = []

    def w2_gone_at_first_commit(c: Controller) -> None:
        """Wrapped before the controller starts: its first pass may commit at once."""
        commit = c.ingestor.io.commit

        def w2_gone_at_commit(ledger_keys: Any, commits: Any, grace_ms: int = 0) -> Committed:
            w2 = keys.events_stream("w2")
            both.append(len(commits) == 2)
            if both == [True]:
                r.delete(w2)
                r.set(w2, "not a stream")
            return commit(ledger_keys, commits, grace_ms)

        c.ingestor.io.commit = w2_gone_at_commit  # type: ignore[method-assign]

    with controller(redis_url, key_prefix, before_start=w2_gone_at_first_commit):
        wait_until(lambda: bool(both), what="a commit")
        assert both[0], "the two streams were not read in one pass"
        wait_until(lambda: r.xlen(keys.dead_letter) == 1, what="w1's dead letter")
        assert r.xlen(keys.events_stream("w1")) == 0
        r.delete(keys.events_stream("w2"))


def test_entries_of_a_failed_commit_are_counted_once_when_reclaimed(
    redis_url: str, key_prefix: str, r: redis.Redis, keys: Keys
) -> None:
    """w1's first commit fails before it writes anything (Redis refuses an id its script
    acknowledges): its good batch and its poison entry stay pending. The reclaim brings
    them back; the ledger had counted them in memory at the failed pass and counted them
    again (a duplicate, a second dead letter). Each must be counted, and applied, once."""
    batch = good_batch("w1", 1)
    send(r, keys, batch)
    r.xadd(keys.events_stream("w1"), {b"v": b"\xff"})
    failed: list[bool] = []

    def first_commit_refused(c: Controller) -> None:
        commit = c.ingestor.io.commit

        def refused_once(ledger_keys: Any, commits: Any, grace_ms: int = 0) -> Committed:
            if not failed:
                failed.append(True)
                for job in commits.values():
                    job.ack.append(b"not-an-id")  # XACK refuses it before acknowledging any
            return commit(ledger_keys, commits, grace_ms)

        c.ingestor.io.commit = refused_once  # type: ignore[method-assign]

    with controller(
        redis_url, key_prefix, reclaim_idle_ms=200, before_start=first_commit_refused
    ) as c:
        stream = keys.events_stream("w1")
        wait_until(lambda: bool(failed), what="the failed commit")
        wait_until(lambda: r.xlen(stream) == 0, what="the entries reclaimed and committed")
        ledger = r.hgetall(keys.ingest_state("w1"))
        assert ledger[b"events"] == str(len(batch)).encode()
        assert ledger[b"batches"] == b"1"
        assert ledger[b"duplicates"] == b"0"
        assert ledger[b"dead_letters"] == b"1"
        wait_until(lambda: r.xlen(keys.dead_letter) == 1, what="the dead letter")
        assert c.window.snapshot(time.time()).total_accesses == len(batch)
        counted = c.ingestor.counters  # this process's: applied once, counted once
        assert (counted.batches, counted.events, counted.duplicates) == (1, len(batch), 0)


def test_a_batch_the_shadow_fails_on_is_applied_not_dead_lettered(
    redis_url: str, key_prefix: str, r: redis.Redis, keys: Keys
) -> None:
    """The window takes a batch before the shadow sees it: a failure in the shadow (a
    bug) must leave the batch applied and acknowledged, not refused as well."""
    with controller(redis_url, key_prefix) as c:
        assert c.shadow.evaluator is not None

        def fail(batch: EventBatch) -> None:
            raise RuntimeError("a bug in the shadow")

        c.shadow.evaluator.apply = fail  # type: ignore[method-assign]
        send(r, keys, good_batch("w1", 1))
        stream = keys.events_stream("w1")
        wait_until(lambda: r.xlen(stream) == 0, what="the batch judged and committed")
        assert c.ingestor.counters.batches == 1
        # The ledger is written by that commit; a dead letter only after it.
        assert r.hget(keys.ingest_state("w1"), "dead_letters") == b"0"
        assert r.xlen(keys.dead_letter) == 0


def test_a_redis_that_never_answers_leaves_the_api_serving_at_once(key_prefix: str) -> None:
    """A Redis that takes the connection but never answers (stalled, or a rediss:// URL
    on a plain port) held the lifespan in the first lease tick's retried calls for over a
    minute: no /healthz, so a kubelet restarted the pod before it said why. The API serves
    within a second or two, /readyz saying why it is not ready."""
    import socket
    import threading

    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    done = threading.Event()

    def take_and_hold() -> None:
        listener.settimeout(0.2)
        while not done.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                continue

    taker = threading.Thread(target=take_and_hold, daemon=True)
    taker.start()
    port = listener.getsockname()[1]
    settings = live_settings(redis_url=f"redis://127.0.0.1:{port}/0", key_prefix=key_prefix)
    started = time.monotonic()
    try:
        with running_controller(settings) as rc:
            assert time.monotonic() - started < 10
            ready = rc.client.get("/readyz")
            assert ready.status_code == 503
            assert ready.json()["reason"].startswith("redis unavailable: Timeout")
            # Redis gone for good (refused, not stalled): the stop does not wait on it.
            done.set()
            taker.join()
            for conn in (*held, listener):
                conn.close()
    finally:
        done.set()
        listener.close()

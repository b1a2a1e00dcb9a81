"""The controller across failures of its own: a damaged checkpoint, a restart, a lease
lost and won back, a Redis that forgot everything. Each test failed before its fix."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from agent.policy_document import CategoryParams
from agent.wire import EventBatch, Keys
from controlplane.dev.embedded_redis import EmbeddedRedis
from controlplane.service.controller import Controller
from controlplane.service.settings import ControllerSettings
from tests.conftest import delete_prefix
from tests.integration.controller_fixtures import (
    controller,
    good_batch,
    ingest_good_batches,
    send,
)
from tests.waiting import wait_until

pytestmark = pytest.mark.integration


def test_a_damaged_checkpoint_leaves_an_empty_window_and_a_leader_that_ingests(
    redis_url: str, key_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A damaged zip raised ``BadZipFile`` out of the lease tick after the lease was won:
    ingest never started, and later ticks ("still leader") never started it."""
    r = redis.Redis.from_url(redis_url)
    keys = Keys(key_prefix)
    r.set(keys.checkpoint, b"PK\x03\x04" + b"\x00" * 64)
    with controller(redis_url, key_prefix) as c:
        assert c.window.categories == 0
        send(r, keys, good_batch("w1", 1))
        wait_until(lambda: c.ingestor.counters.batches == 1, what="the batch ingested")
    assert "no checkpoint loaded (unreadable checkpoint: not a zip archive" in caplog.text


def test_every_leader_tick_starts_ingest_when_it_is_not_running(
    redis_url: str, key_prefix: str
) -> None:
    with controller(redis_url, key_prefix, lease_ttl_s=0.6) as c:
        assert c.ingestor.close(timeout=5)
        wait_until(lambda: c.ingestor.running, timeout=2, what="a tick to start ingest again")
        assert c.lease.is_leader


def test_a_restart_under_the_same_name_keeps_the_window(redis_url: str, key_prefix: str) -> None:
    """A checkpoint written under this controller's name was taken for this process's own
    and skipped: a pod restarted under its name (or pid 1 again) started empty."""
    r = redis.Redis.from_url(redis_url)
    keys = Keys(key_prefix)
    with controller(redis_url, key_prefix, consumer_name="ctl-pod-0") as c:
        send(r, keys, good_batch("w1", 1))
        wait_until(lambda: c.ingestor.counters.batches == 1, what="the batch ingested")
        before = c.window.snapshot(time.time())
    with controller(redis_url, key_prefix, consumer_name="ctl-pod-0") as c:
        after = c.window.snapshot(before.now)
    assert after.total_accesses == before.total_accesses > 0


def test_a_leader_that_ingests_again_reads_the_ledgers_another_wrote_meanwhile(
    redis_url: str, key_prefix: str
) -> None:
    """The ledgers stayed in memory across a handover: the old leader, leading again,
    wrote its stale copy over the one the other leader had kept up to date."""
    r = redis.Redis.from_url(redis_url)
    keys = Keys(key_prefix)
    with controller(redis_url, key_prefix) as c:
        send(r, keys, good_batch("w1", 1))
        wait_until(lambda: c.ingestor.counters.batches == 1, what="the first batch")
        assert c.ingestor.close(timeout=5)
        other = Controller(
            ControllerSettings(redis_url=redis_url, key_prefix=key_prefix, consumer_name="other")
        )
        send(r, keys, good_batch("w1", 2))
        r.set(keys.leader, other.lease.holder, px=60_000)  # the other leads a while
        wait_until(lambda: other.ingestor.poll_once() > 0, what="the other's pass")
        r.set(keys.leader, c.lease.holder, px=60_000)  # and hands the lease back
        send(r, keys, good_batch("w1", 3))  # a lease tick starts ingest here again
        wait_until(lambda: c.ingestor.counters.batches == 2, what="the third batch")
    ledger = r.hgetall(keys.ingest_state("w1"))
    assert ledger[b"batches"] == b"3" and ledger[b"missing"] == b"0"


def test_a_redis_that_forgot_the_policy_gets_a_current_version_from_the_same_leader(
    redis_url: str, key_prefix: str
) -> None:
    """The initial policy was published only when the lease was won: a Redis restarted
    empty under the same leader left no current version, and /readyz said 503 until a
    refit published."""
    with controller(redis_url, key_prefix, lease_ttl_s=0.6, restore_wait_s=0) as c:
        assert c.ready() == (True, "")
        c.r.delete(c.keys.policy_current)  # the lease key stays: the same leader
        wait_until(lambda: c.ready()[0], timeout=3, what="a current version again")
        assert c.lease.is_leader


def test_a_redis_restarted_empty_gets_the_operators_state_back_not_the_defaults(
    redis_url: str, key_prefix: str
) -> None:
    """A Redis restarted empty got the built-in defaults: every worker ran them until
    the next refit, the operator's overrides and evictor pin were gone without a word,
    and version numbers started again at 1 below the ones agents had applied."""
    with controller(redis_url, key_prefix, lease_ttl_s=0.6, restore_wait_s=0) as c:
        fitted = CategoryParams(p_reuse=0.7, rate=0.2, life_s=30.0)
        c.store.publish_fit({"text_1": fitted}, None, "a fit")
        c.store.set_override("text_2", {"p_reuse": 0.5})
        c.store.pin_evictor("s3fifo")
        before = c.store.current()
        assert before is not None
        wait_until(
            lambda: c.store_state is not None and c.store_state.version == before.version,
            what="the state read",
        )
        delete_prefix(redis_url, key_prefix)  # every key, the lease's too
        wait_until(lambda: c.ready()[0], timeout=5, what="a current version again")
        after = c.store.current()
        assert after is not None and after.version == before.version + 1
        assert after.note.startswith("restored after Redis lost its state")
        assert (after.categories, after.evictor) == (before.categories, "s3fifo")
        assert c.store.overrides() == {"text_2": {"p_reuse": 0.5}}
        assert c.store.evictor().pinned == "s3fifo"


def test_a_refit_that_runs_across_a_lost_lease_does_not_publish(
    redis_url: str, key_prefix: str
) -> None:
    """Refits checked ``is_leader`` once, at their start: one that ran across a lease loss
    published a stale fit over the new leader's."""
    r = redis.Redis.from_url(redis_url)
    keys = Keys(key_prefix)
    with controller(redis_url, key_prefix) as c:
        ingest_good_batches(c, r, "w1", 3)
        before = c.store.current_version()
        r.set(keys.leader, "the-new-leader", px=60_000)  # taken before this replica's tick
        outcome = c.refit(manual=True)
        assert not outcome.published and "no longer leads" in outcome.reason
        assert c.store.current_version() == before
        lost = c.metrics.registry.get_sample_value("kvwise_refits_total", {"outcome": "lost_lease"})
        assert lost == 1


def test_a_checkpoint_never_holds_a_batch_its_ledger_does_not(
    redis_url: str, key_prefix: str
) -> None:
    """The checkpoint job ran beside the ingest thread: one taken between a batch's apply
    and its commit held a batch the ledger did not, counted twice after a crash."""
    r = redis.Redis.from_url(redis_url)
    keys = Keys(key_prefix)
    uncommitted: list[bool] = []  # per checkpoint written: was a pass between apply and commit?
    in_pass = threading.Event()
    with controller(redis_url, key_prefix, checkpoint_interval_s=0.2) as c:
        apply, commit, save = c.ingestor.apply, c.ingestor.io.commit, c.checkpoints.save

        def slow_apply(batch: EventBatch) -> int:
            in_pass.set()
            time.sleep(1.0)  # a long pass: a checkpoint interval passes before its commit
            return apply(batch)

        def commit_then_clear(*args: Any) -> int:
            trimmed = commit(*args)
            in_pass.clear()
            return trimmed

        def recorded_save(*args: Any, **kwargs: Any) -> int:
            uncommitted.append(in_pass.is_set())
            return save(*args, **kwargs)

        c.ingestor.apply, c.ingestor.io.commit = slow_apply, commit_then_clear  # type: ignore[method-assign]
        c.checkpoints.save = recorded_save  # type: ignore[method-assign]
        send(r, keys, good_batch("w1", 1))
        wait_until(lambda: c.ingestor.counters.batches == 1, what="the batch committed")
        wait_until(lambda: len(uncommitted) >= 2, what="checkpoints after it")
    assert not any(uncommitted)


def test_an_ingest_thread_that_outlives_the_lease_writes_no_checkpoint(
    redis_url: str, key_prefix: str
) -> None:
    r = redis.Redis.from_url(redis_url)
    keys = Keys(key_prefix)
    with controller(redis_url, key_prefix, checkpoint_interval_s=0.05, lease_ttl_s=30) as c:
        wait_until(lambda: r.exists(keys.checkpoint), what="a checkpoint while it leads")
        c.lease.release()  # the next lease tick is 10 s away; the ingest thread ends its pass
        time.sleep(0.2)  # a checkpoint begun before the release ends
        r.delete(keys.checkpoint)
        time.sleep(0.5)
        assert not r.exists(keys.checkpoint)
        wait_until(lambda: not c.ingestor.running, what="ingest to stop itself")


def test_a_deposed_leader_stops_ingesting_before_its_lease_tick_notices(
    redis_url: str, key_prefix: str
) -> None:
    """A leader paused past its lease (SIGSTOP, a long GC) woke and went on ingesting until
    its next lease tick: it acknowledged entries the new leader never saw, and its stale
    ledger overwrote the new leader's."""
    r = redis.Redis.from_url(redis_url)
    keys = Keys(key_prefix)
    with controller(redis_url, key_prefix, lease_ttl_s=60) as c:  # ticks every 20 s
        ingest_good_batches(c, r, "w1", 1)
        r.set(keys.leader, "the-new-leader", px=60_000)  # taken while this one slept
        send(r, keys, good_batch("w1", 2))
        wait_until(lambda: not c.ingestor.running, what="ingest to stop itself")
        assert c.ingestor.counters.batches == 1
        assert r.xlen(keys.events_stream("w1")) == 1  # unread: the new leader's to take
        assert r.xpending(keys.events_stream("w1"), "controller")["pending"] == 0


def test_a_replica_that_stops_ingesting_exports_no_frozen_gap_figures(
    redis_url: str, key_prefix: str
) -> None:
    """A former leader kept exporting the gaps it last saw beside the leader's live ones
    (a dashboard takes the largest across replicas)."""
    r = redis.Redis.from_url(redis_url)
    keys = Keys(key_prefix)
    with controller(redis_url, key_prefix, lease_ttl_s=60) as c:
        send(r, keys, good_batch("w1", 1))
        send(r, keys, good_batch("w1", 3))  # batch 2 missing
        wait_until(lambda: c.ingestor.counters.batches == 2, what="two batches")
        gaps = c.metrics.registry.get_sample_value("kvwise_ingest_gap_batches", {"worker": "w1"})
        assert gaps == 1
        r.set(keys.leader, "the-new-leader", px=60_000)
        wait_until(lambda: not c.ingestor.running, what="ingest to stop itself")
        gone = c.metrics.registry.get_sample_value("kvwise_ingest_gap_batches", {"worker": "w1"})
        assert gone is None


def test_a_scheduled_refit_that_fails_on_redis_says_so_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """It counted `kvwise_refits_total{outcome="error"}` and logged nothing."""
    caplog.set_level(logging.INFO, logger="controlplane.service.controller")
    with (
        EmbeddedRedis(tmp_path) as server,
        controller(server.url, "kvwise-refit-error:", refit_interval_s=0.2, lease_ttl_s=60) as c,
    ):
        server.stop()

        def failed_refits() -> float:
            sample = c.metrics.registry.get_sample_value(
                "kvwise_refits_total", {"outcome": "error"}
            )
            return sample or 0.0

        wait_until(lambda: failed_refits() >= 3, what="three failed refits")
    said = [r.getMessage() for r in caplog.records]
    assert sum(m.startswith("refit published nothing: redis unavailable") for m in said) == 1


def test_a_current_pointer_to_a_missing_version_is_not_ready(
    redis_url: str, key_prefix: str
) -> None:
    """/readyz said ok while every replica answered GET /v1/policy with 503."""
    with controller(redis_url, key_prefix) as c:
        assert c.ready() == (True, "")
        c.r.set(c.keys.policy_current, "999")
        assert c.ready() == (False, "current names version 999, not stored")


def test_a_damaged_current_pointer_is_written_back_by_the_leader(
    redis_url: str, key_prefix: str
) -> None:
    """A damaged ``current`` pointer, read as the newest readable kept version, stayed
    damaged until some change published (a refit that moves nothing publishes nothing),
    and agents cannot follow it: the leader's next tick publishes the state in force
    again, which writes it back (counted once under part=current)."""
    with controller(redis_url, key_prefix) as c:
        c.store.set_override("text_1", {"life_s": 5.0})
        in_force = c.store.current()
        assert in_force is not None
        c.r.set(c.keys.policy_current, "damaged")

        def written_back() -> bool:
            raw = c.r.get(c.keys.policy_current)
            return raw is not None and raw.isdigit() and int(raw) > in_force.version

        wait_until(written_back, timeout=20, what="the pointer written back")
        again = c.store.current()
        assert again is not None and again.categories == in_force.categories
        assert again.note.startswith("current pointer written back (current is not a version")
        refused = c.metrics.registry.get_sample_value(
            "kvwise_policy_state_refused_total", {"part": "current"}
        )
        assert refused == 1

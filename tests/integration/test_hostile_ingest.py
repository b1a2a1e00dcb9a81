"""Issue 14's attacks on ingest, each against a real controller and a real Redis: poison
entries, a clock hours ahead, a category bomb, oversized entries, a restart mid-sequence,
streams that grow, and a restart that must keep the fit. Each test failed before its fix."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import redis

from agent.wire import WIRE_SCHEMA_VERSION, AgentStatus, Keys, encode_batch
from controlplane.service.agents import AgentReader
from controlplane.service.controller import Controller
from controlplane.service.housekeeping import Housekeeper, HousekeepingSettings
from controlplane.service.settings import ControllerSettings
from controlplane.service.stream_io import Commit, StreamIO
from controlplane.service.trace_recording import RecordingNotice
from tests.integration.controller_fixtures import (
    acknowledged_stream,
    controller,
    good_batch,
    ingest_good_batches,
    reuse_batch,
    send,
)
from tests.waiting import wait_until

pytestmark = pytest.mark.integration


def heartbeat(r: redis.Redis, keys: Keys, worker: str) -> None:
    status = AgentStatus(id=worker, engine="sim", capacity=10, updated_at=time.time())
    r.set(keys.agent(worker), status.to_json(), px=60_000)


def raw_fields(**fields: bytes) -> dict[bytes, bytes]:
    base = {
        b"v": str(WIRE_SCHEMA_VERSION).encode(),
        b"w": b"w1",
        b"e": b"x",
        b"s": b"1",
        b"c": b"[]",
        b"n": b"0",
        b"d": b"",
    }
    base.update({k.encode(): v for k, v in fields.items()})
    return base


def dead_letters(r: redis.Redis, keys: Keys) -> list[dict[bytes, bytes]]:
    return [f for _, f in r.xrange(keys.dead_letter)]


def test_poison_entries_are_dead_lettered_and_the_reclaim_loop_goes_on(
    redis_url: str, key_prefix: str, r: redis.Redis, keys: Keys
) -> None:
    """B1: bad UTF-8 and deep nesting escaped decode_batch as UnicodeDecodeError and
    RecursionError: never acknowledged, every reclaim pass aborted, ``reclaimed`` grew."""
    stream = keys.events_stream("w1")
    poison = [
        {**raw_fields(), b"\xff\xfe": b"x"},
        raw_fields(v=b"\xff"),
        raw_fields(w=b"\xc3\x28"),
        raw_fields(c=b"[" * 50_000 + b"]" * 50_000),
    ]
    for fields in poison:
        r.xadd(stream, fields)  # type: ignore[arg-type]
    send(r, keys, good_batch("w1", 1))
    with controller(redis_url, key_prefix, reclaim_idle_ms=200) as c:
        wait_until(lambda: c.ingestor.counters.batches == 1, what="the good batch")
        wait_until(lambda: len(dead_letters(r, keys)) == 4, what="four dead letters")
        wait_until(lambda: c.ingestor.pending() == 0, what="nothing pending")
        time.sleep(0.5)  # two reclaim passes' worth: nothing may come back
        assert c.ingestor.counters.reclaimed == 0
        reasons = sorted(f[b"reason"].decode() for f in dead_letters(r, keys))
        assert any("not UTF-8" in x for x in reasons), reasons
        assert any("RecursionError" in x for x in reasons), reasons
        assert r.xlen(stream) == 0  # dead-lettered sources deleted, applied ones trimmed


def test_another_schemas_entry_is_dead_lettered_for_its_schema(
    redis_url: str, key_prefix: str, r: redis.Redis, keys: Keys
) -> None:
    """An entry of schema 9 lacking this schema's fields was dead-lettered with "missing
    field 'e'", not the schema reason docs/controller.md documents."""
    r.xadd(keys.events_stream("junk"), {b"v": b"9", b"w": b"junk", b"n": b"1"})
    with controller(redis_url, key_prefix, reclaim_idle_ms=200):
        wait_until(lambda: len(dead_letters(r, keys)) == 1, what="the dead letter")
        (reason,) = [f[b"reason"].decode() for f in dead_letters(r, keys)]
        assert "v: the sender speaks wire schema 9, this side 2" in reason, reason


def test_the_log_names_dead_lettered_entries_and_streams_in_plain_text(
    redis_url: str, key_prefix: str, r: redis.Redis, keys: Keys, caplog: pytest.LogCaptureFixture
) -> None:
    """The log once read "dead-lettered entry b'1796599269086-0' of b'...'": bytes reprs
    (and "stream b'...\\xc3\\xa9' is not a schema-2 worker stream")."""
    stream = keys.events_stream("junk")
    entry = r.xadd(stream, raw_fields(v=b"\xff")).decode()
    r.xadd(f"{key_prefix}events:\u00e9", raw_fields())
    with controller(redis_url, key_prefix, reclaim_idle_ms=200):
        wait_until(lambda: len(dead_letters(r, keys)) == 2, what="the dead letters")
    told = [m for m in caplog.messages if "dead-lettered entry" in m or "schema-2" in m]
    assert any(f"dead-lettered entry {entry} of {stream}: v: not UTF-8" in m for m in told), told
    assert any(f"stream {key_prefix}events:\u00e9 is not" in m for m in told), told
    named = ("entry b'", "of b'", "stream b'")  # the reason may quote payload bytes
    assert not [m for m in told if any(bad in m for bad in named)], told


@pytest.mark.parametrize("name", [b"\xff", b"{\xff}"])
def test_a_stream_named_in_bytes_that_are_not_utf8_stops_no_ingest(
    redis_url: str, key_prefix: str, r: redis.Redis, keys: Keys, name: bytes
) -> None:
    """Its name's decoding raised out of the round: every round failed, and no worker's
    batches were ingested while the stream was there."""
    r.xadd(f"{key_prefix}events:".encode() + name, raw_fields())
    send(r, keys, good_batch("w1", 1))
    with controller(redis_url, key_prefix, reclaim_idle_ms=200) as c:
        wait_until(lambda: c.ingestor.counters.batches == 1, what="the good batch")
        wait_until(lambda: len(dead_letters(r, keys)) == 1, what="the dead letter")


def test_a_clock_hours_ahead_moves_nothing_and_is_counted(
    redis_url: str, key_prefix: str, r: redis.Redis, keys: Keys
) -> None:
    """B2: one event at now + 7200 slid the window into the future; every later event was
    dropped while still counted, and refits starved."""
    heartbeat(r, keys, "evil")
    heartbeat(r, keys, "good")
    with controller(redis_url, key_prefix, clock_tolerance_s=30, shadow_rate=1.0) as c:
        send(r, keys, good_batch("evil", 1, t0=time.time() + 7200, n=50))
        wait_until(lambda: c.ingestor.counters.batches == 1, what="the future batch")
        good = good_batch("good", 1)
        send(r, keys, good)
        wait_until(lambda: c.ingestor.counters.batches == 2, what="the good batch")
        snap = c.window.snapshot(time.time())
        assert snap.total_accesses == len(good)  # every access of the good worker counts
        assert c.ingestor.counters.clock_rejected > 0
        rejected = c.metrics.registry.get_sample_value(
            "kvwise_ingest_clock_rejected_events_total", {"worker": "evil"}
        )
        assert rejected == c.ingestor.counters.clock_rejected
        (evil,) = [a for a in c.agents() if a.id == "evil"]
        assert evil.clock_rejected == rejected and evil.events_ingested == 0
        assert c.refit(manual=True).published
        # Nor does it reach the shadow, whose clock it once moved two hours ahead: every
        # worker's sampled requests then fell out of the window.
        assert c.shadow.evaluator is not None
        c.shadow.evaluator.set_capacities({"evil": 10, "good": 10})
        c.shadow.evaluator.flush("good")  # its last run too
        (group,) = c.shadow.evaluator.view().groups
        assert group.sampled_accesses == group.accesses_seen == len(good)


def test_a_category_bomb_is_refused_per_worker_and_in_total(
    redis_url: str, key_prefix: str, r: redis.Redis, keys: Keys
) -> None:
    """B3: every name of ``c`` joined the table for good (20,000 names: +2 GB)."""
    limits = {"max_categories_per_worker": 4, "max_categories": 6}
    with controller(redis_url, key_prefix, **limits) as c:
        bomb = raw_fields(w=b"bomb", c=json.dumps([f"c{i}" for i in range(20_000)]).encode())
        r.xadd(keys.events_stream("bomb"), bomb)  # type: ignore[arg-type]
        wait_until(lambda: r.xlen(keys.dead_letter) == 1, what="the bomb refused")
        assert dead_letters(r, keys)[0][b"reason"].startswith(b"c: ")
        assert b"> limit" in dead_letters(r, keys)[0][b"reason"]
        # Only the names a batch uses join; one worker may bring at most 4.
        for seq, cat in enumerate(["a", "b", "c", "d", "e"], start=1):
            b = reuse_batch("w1", seq, category=cat, n=5, rate=1, p=0.5, t0=time.time(), seed=1)
            send(r, keys, b)
        wait_until(lambda: r.xlen(keys.dead_letter) == 2, what="the fifth refused")
        assert c.window.categories == 4
        assert b"max_categories_per_worker (4)" in dead_letters(r, keys)[1][b"reason"]
        for seq, cat in enumerate(["f", "g", "h"], start=1):
            b = reuse_batch("w2", seq, category=cat, n=5, rate=1, p=0.5, t0=time.time(), seed=1)
            send(r, keys, b)
        wait_until(lambda: r.xlen(keys.dead_letter) == 3, what="the total refused")
        assert c.window.categories == 6
        assert b"max_categories (6)" in dead_letters(r, keys)[2][b"reason"]
        # A refused entry is dead-lettered before its read is acknowledged: nothing stays.
        wait_until(lambda: c.ingestor.pending() == 0, what="every entry acknowledged")


def test_oversized_entries_never_reach_the_controller_whole(
    redis_url: str, key_prefix: str, r: redis.Redis, keys: Keys
) -> None:
    """B13/B7: a 176 MB entry was ingested whole, and its dead letter copied it whole."""
    stream = keys.events_stream("w1")
    with controller(redis_url, key_prefix, ingest_max_events=1000) as c:
        too_many = encode_batch(good_batch("w1", 1, n=1500))  # 1500 accesses + reuses
        huge = raw_fields(n=b"300000", d=b"\0" * (300_000 * 37))  # 11 MB in one entry
        big_id = r.xadd(stream, too_many)  # type: ignore[arg-type]
        huge_id = r.xadd(stream, huge)  # type: ignore[arg-type]
        send(r, keys, good_batch("w1", 2, n=100))
        wait_until(lambda: c.ingestor.counters.batches == 1, what="the small batch")
        wait_until(lambda: r.xlen(keys.dead_letter) == 2, what="two dead letters")
        # The sources are deleted in the commit that comes before the dead letters.
        wait_until(lambda: r.xlen(stream) == 0, what="the refused entries deleted")
        letters = dead_letters(r, keys)
        assert {f[b"id"] for f in letters} == {big_id, huge_id}
        assert all(f[b"stream"] == stream.encode() for f in letters)
        assert all(len(f[b"prefix"]) <= 1024 for f in letters)
        reasons = b" ".join(f[b"reason"] for f in letters)
        assert b"events in one entry > limit 1000" in reasons
        assert b"bytes > max_entry_bytes" in reasons
        assert r.xrange(stream, big_id, big_id) == r.xrange(stream, huge_id, huge_id) == []
        assert r.xlen(keys.dead_letter) == 2 and r.memory_usage(keys.dead_letter) < 64_000


def test_a_restart_keeps_sequence_tracking_and_the_fit(
    redis_url: str, key_prefix: str, r: redis.Redis, keys: Keys
) -> None:
    """B6 and "restart keeps the fit": the gap gauge jumped by every batch seen before a
    restart, and the window restarted empty."""
    with controller(redis_url, key_prefix) as c:
        ingest_good_batches(c, r, "w1", 5)
        before = c.window.snapshot(time.time())
        assert c.ingestor.counters.gaps["w1"] == 0
    # stop() wrote a checkpoint; a new controller (another consumer) takes over.
    with controller(redis_url, key_prefix, consumer_name="ctl-next") as c:
        after = c.window.snapshot(before.now)
        assert after.total_accesses == before.total_accesses > 0
        np.testing.assert_array_equal(after.observed, before.observed)
        send(r, keys, good_batch("w1", 3))  # resent: applied before the restart
        for seq in (6, 7):
            send(r, keys, good_batch("w1", seq))
        wait_until(lambda: c.ingestor.counters.batches == 2, what="two new batches")
        wait_until(lambda: c.ingestor.counters.duplicates == 1, what="the resent one seen")
        assert c.ingestor.counters.gaps["w1"] == 0
        gap = c.metrics.registry.get_sample_value("kvwise_ingest_gap_batches", {"worker": "w1"})
        assert gap == 0


def test_an_epoch_past_its_bound_is_a_limit_dead_letter_and_the_ledger_reads_back(
    redis_url: str, key_prefix: str, r: redis.Redis, keys: Keys
) -> None:
    """A batch's epoch was taken at any length: a 400 KB entry whose epoch is 200,000 "é"
    was applied, its worker's ledger stored it escaped (1.2 MB of ``epochs``) and every
    later start refused that ledger, so its counts began again and a resent batch was
    applied twice. The entry is refused as over a limit; the ledger reads back whole."""
    with controller(redis_url, key_prefix) as c:
        r.xadd(keys.events_stream("w1"), raw_fields(e="\u00e9".encode() * 200_000))
        ingest_good_batches(c, r, "w1", 2)
        # Written after its pass's commit, counted before: once it is there, all of it is.
        wait_until(lambda: dead_letters(r, keys), what="the entry refused, its letter written")
        limit = c.metrics.registry.get_sample_value(
            "kvwise_ingest_dead_letters_total", {"reason": "limit"}
        )
        assert limit == 1 and c.ingestor.counters.dead_letters == 1
        (letter,) = dead_letters(r, keys)
        assert letter[b"reason"].startswith(b"e: an epoch of 200000 characters > limit")
    with controller(redis_url, key_prefix, consumer_name="ctl-next") as c:
        send(r, keys, good_batch("w1", 2))  # resent: applied before the restart
        send(r, keys, good_batch("w1", 3))
        wait_until(lambda: c.ingestor.counters.batches == 1, what="the new batch")
        wait_until(lambda: c.ingestor.counters.duplicates == 1, what="the resent one seen")
        assert c.ingestor.ledger_reader.refused == 0
    ledger = r.hgetall(keys.ingest_state("w1"))
    assert (ledger[b"batches"], ledger[b"dead_letters"], ledger[b"duplicates"]) == (
        b"3",
        b"1",
        b"1",
    )


def test_streams_stay_small_and_dead_workers_and_consumers_go(
    redis_url: str, key_prefix: str, r: redis.Redis, keys: Keys
) -> None:
    """B8: acknowledged entries stayed until the next capped XADD; dead workers' streams
    and consumers stayed for ever."""
    heartbeat(r, keys, "alive")
    sweep = {"housekeeping_interval_s": 0.3, "worker_expire_s": 1, "stale_consumer_s": 0.5}
    with controller(redis_url, key_prefix, **sweep) as c:
        for worker in ("alive", "dead"):
            send(r, keys, good_batch(worker, 1))
        wait_until(lambda: c.ingestor.counters.batches == 2, what="both batches")
        wait_until(lambda: r.xlen(keys.events_stream("alive")) == 0, what="acked trimmed")
        alive = keys.events_stream("alive")
        r.xreadgroup("controller", "ghost", {alive: "0"})  # a consumer of another process
        wait_until(lambda: not r.exists(keys.events_stream("dead")), what="dead expired")
        assert not r.exists(keys.ingest_state("dead"))
        assert r.exists(alive) and r.exists(keys.ingest_state("alive"))
        wait_until(
            lambda: [x["name"] for x in r.xinfo_consumers(alive, "controller")] == [b"ctl-test"],
            what="the ghost consumer removed",
        )


def test_a_refused_dead_letter_does_not_block_the_commit(
    redis_url: str, key_prefix: str, r: redis.Redis, keys: Keys, caplog: pytest.LogCaptureFixture
) -> None:
    """The dead letters were written before the commit: a Redis refusing that write (out
    of memory) aborted the pass, so nothing was acknowledged or trimmed, at every reclaim."""
    r.set(keys.dead_letter, b"not a stream")  # XADD refused, as over maxmemory
    stream = keys.events_stream("w1")
    with controller(redis_url, key_prefix) as c:
        r.xadd(stream, raw_fields(n=b"not a number"))  # type: ignore[arg-type]
        send(r, keys, good_batch("w1", 1))
        wait_until(lambda: c.ingestor.counters.batches == 1, what="the good batch")
        wait_until(lambda: r.xlen(stream) == 0, what="both entries acknowledged and trimmed")
        # The dead letter is tried after that commit: its refusal is counted a moment later.
        unwritten = wait_until(
            lambda: c.metrics.registry.get_sample_value(
                "kvwise_ingest_dead_letters_unwritten_total"
            ),
            what="the dead letter Redis refused counted",
        )
        assert unwritten == 1 and c.ingestor.counters.dead_letters == 1
    assert "1 dead letters not written (WRONGTYPE" in caplog.text


def test_housekeeping_keeps_a_dead_workers_stream_that_holds_unread_entries(
    r: redis.Redis, keys: Keys
) -> None:
    """Only pending entries were checked: a stream whose entries no consumer had read yet
    (a controller that was down) was deleted with them."""
    stream = keys.events_stream("gone")
    r.xadd(stream, encode_batch(good_batch("gone", 1)))  # type: ignore[arg-type]
    r.xgroup_create(stream, "controller", id="0")
    sweep = HousekeepingSettings(interval_s=1, worker_expire_s=1, stale_consumer_s=1)
    keeper = Housekeeper(r, keys, group="controller", consumer="ctl", settings=sweep)
    swept = keeper.sweep([stream.encode()], now=time.time() + 3600)
    assert swept.workers == [] and r.xlen(stream) == 1


def test_one_commit_acknowledges_the_largest_ingest_count(r: redis.Redis, keys: Keys) -> None:
    """The bound of ``ingest_count`` (4096) fits the commit script's ``unpack``."""
    stream = keys.events_stream("w1")
    pipe = r.pipeline(transaction=False)
    for _ in range(4096):
        pipe.xadd(stream, {"x": "1"})
    pipe.execute()
    r.xgroup_create(stream, "g", id="0")
    [(_, entries)] = r.xreadgroup("g", "c", {stream: ">"}, count=4096)
    job = Commit(ack=[entry_id for entry_id, _ in entries])
    StreamIO(r, group="g", consumer="c").commit(
        {stream.encode(): keys.ingest_state("w1")}, {stream.encode(): job}
    )
    assert len(job.ack) == 4096 and r.xpending(stream, "g")["pending"] == 0


def test_acknowledged_entries_stay_for_other_readers_until_the_grace_ends(
    r: redis.Redis, keys: Keys
) -> None:
    """Acknowledged entries were trimmed at once: a plain reader of the stream (``kvwise
    trace record``) that had not reached them yet lost them, though a running controller
    was to leave the streams as they were. Only those older than the grace go."""
    stream = keys.events_stream("w1")
    now_ms = int(r.time()[0]) * 1000
    old = [f"{now_ms - 60_000 + i}-0" for i in range(3)]  # a minute old
    for i, entry_id in enumerate([*old, "*", "*"]):
        r.xadd(stream, encode_batch(good_batch("w1", i + 1)), id=entry_id)  # type: ignore[arg-type]
    r.xgroup_create(stream, "g", id="0")
    [(_, entries)] = r.xreadgroup("g", "c", {stream: ">"})
    io = StreamIO(r, group="g", consumer="c")
    job = Commit(ack=[entry_id for entry_id, _ in entries])
    ledgers, jobs = {stream.encode(): keys.ingest_state("w1")}, {stream.encode(): job}
    trimmed = io.commit(ledgers, jobs, grace_ms=30_000).trimmed
    assert trimmed == 3 and r.xlen(stream) == 2  # the two new ones stay, acknowledged
    assert r.xpending(stream, "g")["pending"] == 0


def test_a_running_controller_leaves_new_entries_in_the_stream_while_a_recording_reads(
    redis_url: str, key_prefix: str, r: redis.Redis, keys: Keys
) -> None:
    """With its default grace, the controller applies and acknowledges the entries and,
    while a recording says it reads (``Keys.recording``), leaves them in the stream, where
    the recording still finds them; without one it trims them at once: the streams hold
    nothing extra for a recording that is not there."""
    stream = keys.events_stream("w1")
    grace = ControllerSettings.model_fields["stream_trim_grace_s"].default
    assert grace >= 10
    with controller(redis_url, key_prefix, stream_trim_grace_s=grace) as c:
        ingest_good_batches(c, r, "w1", 2)
        wait_until(lambda: r.xlen(stream) == 0, what="no recording: trimmed at once")
        notice = RecordingNotice(r, keys)  # type: ignore[arg-type]
        notice.renew()
        send(r, keys, good_batch("w1", 3))
        send(r, keys, good_batch("w1", 4))
        wait_until(lambda: c.ingestor.counters.batches == 4, what="two more batches")
        wait_until(lambda: c.ingestor.pending() == 0, what="acknowledged")
        assert r.xlen(stream) == 2
        assert len(r.xread({stream: "0"})[0][1]) == 2
        notice.withdraw()
        assert not r.exists(keys.recording)


def test_housekeeping_removes_a_dead_workers_stream_that_holds_only_acknowledged_entries(
    r: redis.Redis, keys: Keys
) -> None:
    """Entries read and acknowledged, kept only for the trim's grace, keep no dead worker."""
    stream = acknowledged_stream(r, keys, "gone")
    sweep = HousekeepingSettings(interval_s=1, worker_expire_s=1, stale_consumer_s=1)
    keeper = Housekeeper(r, keys, group="controller", consumer="ctl", settings=sweep)
    swept = keeper.sweep([stream.encode()], now=time.time() + 3600)
    assert swept.workers == ["gone"] and not r.exists(stream)


def test_streams_past_max_workers_are_not_ingested_counted_named_and_told_once(
    redis_url: str, key_prefix: str, r: redis.Redis, keys: Keys, caplog: pytest.LogCaptureFixture
) -> None:
    """Every stream found was read and shadowed, each with a ledger, gauges and miniature
    caches of its own: a flood of worker streams grew the controller without limit. Past
    ``max_workers`` a new stream is left unread, counted, named and logged once; the
    workers already ingested keep working."""
    for worker in ("w1", "w2"):
        heartbeat(r, keys, worker)
        send(r, keys, good_batch(worker, 1))
    with controller(redis_url, key_prefix, max_workers=2, shadow_rate=1.0) as c:
        wait_until(lambda: c.ingestor.counters.batches == 2, what="both workers' batches")
        for late in ("w3", "w4"):
            heartbeat(r, keys, late)
            send(r, keys, good_batch(late, 1))
        refused = "kvwise_ingest_streams_refused"
        wait_until(lambda: c.metrics.registry.get_sample_value(refused) == 2, what="two refused")
        send(r, keys, good_batch("w1", 2))
        wait_until(lambda: c.ingestor.counters.batches == 3, what="w1 goes on")
        c.ingestor.discover()  # and again: told once
        listing = c.agent_listing()  # as many heartbeats as streams read, those read first
        assert [(a.id, a.ingest_refused) for a in listing.agents] == [
            ("w1", False),
            ("w2", False),
        ]
        assert listing.not_listed == 2
        assert r.xlen(keys.events_stream("w3")) == 1  # left for a controller that reads it
        told = [m for m in caplog.messages if "KVWISE_MAX_WORKERS" in m]
        assert len(told) == 2, told
        assert c.shadow.evaluator is not None
        c._refresh_shadow()  # the shadow job: the heartbeats of w3 and w4 are not its
        assert sorted(c.shadow.evaluator._workers) == ["w1", "w2"]


def test_a_stream_rediscovered_keeps_its_place_before_the_streams_refused(
    redis_url: str, key_prefix: str, r: redis.Redis, keys: Keys
) -> None:
    """A stream whose group Redis forgot (a restart, here destroyed) is discovered again:
    it was read, so it is read again, not one of those waiting past ``max_workers``."""
    send(r, keys, good_batch("w1", 1))
    with controller(redis_url, key_prefix, max_workers=1) as c:
        wait_until(lambda: c.ingestor.counters.batches == 1, what="w1's batch")
        for late in range(2, 10):
            send(r, keys, good_batch(f"w{late}", 1))
        refused = "kvwise_ingest_streams_refused"
        wait_until(lambda: c.metrics.registry.get_sample_value(refused) == 8, what="refused")
        for seq in range(2, 5):
            r.xgroup_destroy(keys.events_stream("w1"), "controller")
            send(r, keys, good_batch("w1", seq))
            wait_until(lambda n=seq: c.ingestor.counters.batches == n, what=f"w1's batch {seq}")
        assert c.ingestor.counters.batches == 4


def test_heartbeats_past_max_workers_are_counted_not_read_those_ingested_kept(
    redis_url: str, key_prefix: str, r: redis.Redis, keys: Keys
) -> None:
    """Every heartbeat key was read at each GET /v1/agents, scrape and shadow refresh, one
    gauge series per worker: any writer of heartbeat keys grew all three. At most
    ``max_workers`` are read, the workers ingested first, the rest counted."""
    for worker in ("w8", "w9"):
        heartbeat(r, keys, worker)
        send(r, keys, good_batch(worker, 1))
    with controller(redis_url, key_prefix, max_workers=2) as c:
        wait_until(lambda: c.ingestor.counters.batches == 2, what="both workers' batches")
        for extra in ("w1", "w2", "w3"):  # before w8 and w9 by name, never ingested
            heartbeat(r, keys, extra)
        listing = c.agent_listing()
        assert [a.id for a in listing.agents] == ["w8", "w9"]
        assert listing.not_listed == 3
        c.refresh_gauges()
        gauge = c.metrics.registry.get_sample_value
        assert gauge("kvwise_agents_not_listed") == 3
        series = c.metrics.per_agent["applied_version"].collect()[0].samples
        assert sorted(s.labels["agent"] for s in series) == ["w8", "w9"]
        r.delete(keys.agent("w9"))  # w9 left: its series goes, w1 takes its place
        c.refresh_gauges()
        series = c.metrics.per_agent["applied_version"].collect()[0].samples
        assert sorted(s.labels["agent"] for s in series) == ["w1", "w8"]
        assert gauge("kvwise_agents_not_listed") == 2


def test_a_huge_or_mistyped_heartbeat_is_refused_by_size_and_the_others_listed(
    redis_url: str, key_prefix: str, r: redis.Redis, keys: Keys, caplog: pytest.LogCaptureFixture
) -> None:
    """A heartbeat key holding megabytes of valid JSON was read and parsed whole at every
    listing, and one holding a hash failed the listing of every agent (WRONGTYPE). Each is
    refused (the large one by its size, before parsing), counted and told once."""
    heartbeat(r, keys, "w1")
    huge = AgentStatus(id="big", engine="sim", capacity=10, last_rejection="x" * 2_000_000)
    r.set(keys.agent("big"), huge.to_json(), px=60_000)
    r.hset(keys.agent("hashy"), "a", "b")
    with controller(redis_url, key_prefix) as c:
        for _ in range(2):
            listing = c.agent_listing()
            assert [a.id for a in listing.agents] == ["w1"]
            assert listing.refused == 2 and listing.not_listed == 0
        c.refresh_gauges()
        assert c.metrics.registry.get_sample_value("kvwise_agent_heartbeats_refused") == 2
        told = [m for m in caplog.messages if "ignoring the heartbeat" in m]
        assert len(told) == 2 and any("bytes" in m for m in told), told


def test_a_mistyped_or_bloated_ledger_leaves_its_worker_counts_unknown_the_others_listed(
    r: redis.Redis, keys: Keys, caplog: pytest.LogCaptureFixture
) -> None:
    """Each listed worker's ledger was read whole (HGETALL): a ledger holding a hash key of
    another type failed the listing of every agent (WRONGTYPE), and megabytes beside the
    counts were read and parsed at every listing (and, unparsable, zeroed the counts). Then
    its counts' fields were read with no bound: a count of a megabyte (a digit and spaces,
    which int() takes) was read at every listing and scrape. Only the counts' fields are
    read, each within its bound, as ingest reads a ledger; a mistyped ledger or one with a
    count over its bound leaves its worker's counts unknown, counted and told once."""
    for worker in ("w1", "w2", "w3", "w4"):
        heartbeat(r, keys, worker)
    r.hset(keys.ingest_state("w1"), mapping={"events": 7, "missing": 2, "epochs": "x" * 4_000_000})
    r.set(keys.ingest_state("w2"), b"not a hash")
    r.hset(keys.ingest_state("w3"), mapping={"events": "9" * 5000})  # past int()'s digits
    r.hset(keys.ingest_state("w4"), mapping={"events": "7" + " " * 1_000_000})
    reader = AgentReader(r, keys, max_agents=10)
    for _ in range(2):
        listing = reader.read()
        views = {a.id: a for a in listing.agents}
        assert sorted(views) == ["w1", "w2", "w3", "w4"] and listing.ledgers_refused == 3
        assert (views["w1"].events_ingested, views["w1"].gap_batches) == (7, 2)
        known = [views[w].counts_known for w in ("w1", "w2", "w3", "w4")]
        assert known == [True, False, False, False]
    told = sorted(m for m in caplog.messages if "its ledger is unreadable" in m)
    assert len(told) == 3, told
    assert "a string, not a hash" in told[0]
    assert "events: 5000 bytes > limit" in told[1]
    assert "events: 1000001 bytes > limit" in told[2]


def forgotten(c: Controller, worker: str) -> bool:
    """Neither a ledger nor a gap series of ``worker`` is left in controller ``c``."""
    assert c.metrics is not None
    series = c.metrics.gaps.collect()[0].samples
    return worker not in c.ingestor.ledgers and all(s.labels["worker"] != worker for s in series)


def test_a_worker_whose_stream_went_leaves_its_ledger_and_series(
    redis_url: str, key_prefix: str, r: redis.Redis, keys: Keys
) -> None:
    """A stream deleted by another hand (an operator, another leader's housekeeping) was
    dropped from the streams read but its ledger and per-worker series stayed: workers that
    came and went grew them past ``max_workers``. Its worker is forgotten at discovery."""
    with controller(redis_url, key_prefix, max_workers=1) as c:
        for n, worker in enumerate(("w1", "w2", "w3"), start=1):
            send(r, keys, good_batch(worker, 2))  # seq 1 missing: a gap series
            wait_until(lambda n=n: c.ingestor.counters.batches == n, what=f"{worker}'s batch")
            r.delete(keys.events_stream(worker))
            # The commit of its batch can fail on the deleted stream, which takes its
            # ledger out of ``ledgers`` (to be read back) and leaves its gap series until
            # discovery forgets it: forgotten means both gone.
            wait_until(lambda w=worker: forgotten(c, w), what=f"{worker} forgotten")
        gaps = c.metrics.gaps.collect()[0].samples
        assert gaps == [] and len(c.ingestor.ledgers) == 0


def test_a_standby_does_not_claim_to_know_which_streams_the_leader_refused(
    redis_url: str, key_prefix: str, r: redis.Redis, keys: Keys
) -> None:
    """A replica that does not lead knows nothing of ingest's refusals, yet listed every
    agent with ``ingest_refused: false``: it says null (not known here) instead."""
    heartbeat(r, keys, "w1")
    with controller(redis_url, key_prefix) as leader:
        standby = Controller(ControllerSettings(redis_url=redis_url, key_prefix=key_prefix))
        assert not standby.lease.is_leader
        assert [(a.id, a.ingest_refused) for a in standby.agents()] == [("w1", None)]
        assert [(a.id, a.ingest_refused) for a in leader.agents()] == [("w1", False)]


def test_housekeeping_names_the_stream_of_a_removed_consumer_as_text(
    r: redis.Redis, keys: Keys, caplog: pytest.LogCaptureFixture
) -> None:
    """The log read "removed consumer c1 of b'kvwise:events:{w1}'": the key's bytes."""
    stream = keys.events_stream("w1")
    r.xadd(stream, {"x": "1"})
    r.xgroup_create(stream, "controller", id="$")
    r.xgroup_createconsumer(stream, "controller", "ghost")  # another process's, holding none
    time.sleep(0.05)
    sweep = HousekeepingSettings(interval_s=1, worker_expire_s=3600, stale_consumer_s=0.01)
    keeper = Housekeeper(r, keys, group="controller", consumer="ctl", settings=sweep)
    with caplog.at_level("INFO", logger="controlplane.service.housekeeping"):
        keeper.sweep([stream.encode()], now=time.time())
    assert f"removed consumer ghost of {stream} (idle " in caplog.text

"""Two agents given one worker id (a fixed ``KVWISE_WORKER_ID`` in a Deployment of several
replicas) write into one stream, each under its own epoch: ingest counted both as one
worker (951k events ingested against the heartbeat's 361k sent), and nothing said so.

Each test writes batches with the entry ids Redis would have given them (the stream's clock
is what the controller judges by), so that a minute of two agents side by side takes a
moment; a real controller ingests them from a real Redis. Each failed before the fix (the
ledger kept no ``id_conflict``)."""

from __future__ import annotations

import logging
import time

import pytest
import redis

from agent.wire import AgentStatus, Keys, encode_batch
from controlplane.service.agents import AgentReader
from controlplane.service.controller import Controller
from controlplane.service.ledger import EPOCHS_KEPT, ID_CONFLICT_GRACE_MS, WorkerLedger
from tests.integration.controller_fixtures import controller, reuse_batch
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

WORKER = "dup"
STEP_MS = 2_000
"""Stream time between two batches of one agent."""
CONFLICT_LOG = "agent processes write events under it at once"


class Stream:
    """``WORKER``'s stream, written batch by batch at stream times of our choosing."""

    def __init__(self, r: redis.Redis, keys: Keys) -> None:
        self.r, self.keys = r, keys
        self.t0_ms = int(time.time() * 1000) - 3_600_000  # an hour ago: ids stay ahead
        self.seqs: dict[str, int] = {}
        self.events = 0
        self.batches = 0

    def write(self, epoch: str, at_ms: int) -> None:
        """The next batch of ``epoch``, entered at ``at_ms`` past the start."""
        seq = self.seqs[epoch] = self.seqs.get(epoch, 0) + 1
        batch = reuse_batch(
            WORKER, seq, category="text_1", n=20, rate=0.5, p=0.5,
            t0=time.time() - 10, seed=seq, epoch=epoch,
        )  # fmt: skip
        entry = f"{self.t0_ms + at_ms}-0"
        self.r.xadd(self.keys.events_stream(WORKER), encode_batch(batch), id=entry)  # type: ignore[arg-type]
        self.events += len(batch)
        self.batches += 1

    def side_by_side(self, epochs: list[str], start_ms: int, span_ms: int) -> int:
        """``epochs`` writing in turn from ``start_ms`` for ``span_ms``; the end."""
        at = start_ms
        while at < start_ms + span_ms:
            for i, epoch in enumerate(epochs):
                self.write(epoch, at + i)
            at += STEP_MS
        return at

    def alone(self, epoch: str, start_ms: int, span_ms: int) -> int:
        return self.side_by_side([epoch], start_ms, span_ms)


def heartbeat(r: redis.Redis, keys: Keys) -> None:
    status = AgentStatus(id=WORKER, engine="sim", capacity=10, updated_at=time.time())
    r.set(keys.agent(WORKER), status.to_json(), px=60_000)


def ingested(c: Controller, stream: Stream) -> None:
    """Wait until ``c`` applied every batch written and committed its pass."""
    wait_until(lambda: c.ingestor.counters.batches == stream.batches, what="every batch")
    group = c.settings.consumer_group
    events = stream.keys.events_stream(WORKER)
    wait_until(lambda: stream.r.xpending(events, group)["pending"] == 0, what="the commit")


def listed(r: redis.Redis, keys: Keys) -> tuple[int, int]:
    """``GET /v1/agents``'s view of ``WORKER``: its ``id_conflict`` and events ingested."""
    (view,) = AgentReader(r, keys, max_agents=10).read().agents
    return view.id_conflict, view.events_ingested


def gauge(c: Controller) -> float | None:
    return c.metrics.registry.get_sample_value(
        "kvwise_ingest_worker_id_conflict", {"worker": WORKER}
    )


def test_two_agents_with_one_id_are_flagged_and_nothing_is_lost(
    redis_url: str, key_prefix: str, r: redis.Redis, keys: Keys, caplog: pytest.LogCaptureFixture
) -> None:
    """Two epochs writing side by side for a minute: flagged 2 (gauge, listing, one
    warning), every event of both still ingested once; the one left writing alone for
    longer than the grace clears it (said once)."""
    caplog.set_level(logging.INFO)
    heartbeat(r, keys)
    stream = Stream(r, keys)
    end = stream.side_by_side(["aaaa", "bbbb"], 0, 60_000)
    with controller(redis_url, key_prefix) as c:
        ingested(c, stream)
        assert listed(r, keys) == (2, stream.events)
        assert gauge(c) == 2
        stream.alone("aaaa", end, ID_CONFLICT_GRACE_MS // 2)  # "bbbb" stopped: still recent
        ingested(c, stream)
        assert listed(r, keys) == (2, stream.events)
        stream.alone("aaaa", end + ID_CONFLICT_GRACE_MS // 2, ID_CONFLICT_GRACE_MS)
        ingested(c, stream)
        assert listed(r, keys) == (0, stream.events)
        assert gauge(c) == 0
    warned = [m for m in caplog.messages if CONFLICT_LOG in m]
    assert len(warned) == 1, warned
    assert f"worker id {WORKER!r}: 2 agent processes" in warned[0]
    assert "KVWISE_WORKER_ID" in warned[0]
    cleared = "no longer written by several processes at once"
    assert sum(cleared in m for m in caplog.messages) == 1


def test_the_flag_falls_once_no_process_writes_under_the_id(
    redis_url: str, key_prefix: str, r: redis.Redis, keys: Keys
) -> None:
    """Both processes stopped (or were given their own ids): no batch recomputes the flag,
    so it stood until housekeeping expired the worker (an hour), an alert firing on after
    the fix. Once the stream is quiet for the grace by Redis's clock, it is 0."""
    heartbeat(r, keys)
    stream = Stream(r, keys)
    stream.t0_ms = int(r.time()[0] * 1000) - 60_000 - ID_CONFLICT_GRACE_MS - 5_000
    stream.side_by_side(["aaaa", "bbbb"], 0, 60_000)  # ended over the grace ago
    with controller(redis_url, key_prefix) as c:
        ingested(c, stream)
        wait_until(lambda: gauge(c) == 0, timeout=10, what="the flag to fall")
        c.ingestor.ledgers.clear()  # read back: what a commit wrote, not what settled
        wait_until(lambda: listed(r, keys)[0] == 0, timeout=10, what="the stored flag to fall")


def test_a_restart_is_not_flagged_even_with_the_old_epochs_last_batches_late(
    redis_url: str, key_prefix: str, r: redis.Redis, keys: Keys, caplog: pytest.LogCaptureFixture
) -> None:
    """An agent restarted (a new epoch), the old one's last batches landing after the new
    one's first, as a closing agent's flush may: one worker, no conflict, and a second
    restart soon after is none either."""
    heartbeat(r, keys)
    stream = Stream(r, keys)
    at = stream.alone("old1", 0, 60_000)
    stream.write("new2", at)
    stream.write("old1", at + 500)  # in flight when the new one started
    stream.write("old1", at + 5_000)  # the close's last flush
    at = stream.alone("new2", at + 5_001, 20_000)  # the old one's last still recent
    with controller(redis_url, key_prefix) as c:
        ingested(c, stream)
        assert listed(r, keys) == (0, stream.events)
        assert gauge(c) == 0
        stream.alone("new3", at, 60_000)  # restarted again within the grace
        ingested(c, stream)
        assert listed(r, keys) == (0, stream.events)
        assert gauge(c) == 0
    assert not [m for m in caplog.messages if CONFLICT_LOG in m]


def test_more_agents_than_the_ledger_keeps_epochs_of_are_flagged(
    redis_url: str, key_prefix: str, r: redis.Redis, keys: Keys
) -> None:
    """Six replicas on one id: the ledger keeps 4 epochs, so each batch pushes out one still
    writing (and its sequence tracking starts again); that alone says more write than are
    kept."""
    heartbeat(r, keys)
    stream = Stream(r, keys)
    stream.side_by_side([f"e{i}" for i in range(6)], 0, 10_000)
    with controller(redis_url, key_prefix) as c:
        ingested(c, stream)
        assert listed(r, keys)[0] == EPOCHS_KEPT + 1


def test_the_order_ingest_reads_in_does_not_matter() -> None:
    """A restart read out of stream order (the old epoch's entries reclaimed after the new
    one's were read, as after a controller's crash) is still no conflict: the ledger judges
    by each entry's stream time, not by when it came."""
    ledger = WorkerLedger(WORKER)
    for seq, at in enumerate(range(100_000, 200_000, STEP_MS), start=1):
        assert ledger.see("new", seq, at)
    for seq, at in enumerate(range(0, 100_000, STEP_MS), start=1):
        assert ledger.see("old", seq, at)
    assert ledger.id_conflict == 0
    ledger.see("old", 10_000, 199_000)  # but the old one writing a minute past the new's start
    assert ledger.id_conflict == 2

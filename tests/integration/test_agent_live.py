"""The agent's live loop against a real Redis: event publishing (flood, outage, recovery),
policy subscription (apply, reject, keep), heartbeats."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis

from agent.policies.lru import LRUPolicy
from agent.policy_document import BUILTIN_POLICY, CategoryParams, PolicyDocument
from agent.runtime.agent import Agent
from agent.runtime.heartbeat import LAST_BEAT_TTL_S
from agent.runtime.publisher import tally
from agent.wire import AgentStatus, EventBatch, Keys, decode_batch, encode_policy
from controlplane.dev.embedded_redis import EmbeddedRedis, free_port
from controlplane.service.agents import AgentReader
from tests.conftest import delete_prefix
from tests.integration.agent_fixtures import fast_settings
from tests.waiting import wait_until
from tests.wire_samples import filled

pytestmark = pytest.mark.integration


def stream_batches(r: redis.Redis, prefix: str, worker: str = "w1") -> list[EventBatch]:
    return [decode_batch(f) for _, f in r.xrange(Keys(prefix).events_stream(worker))]


class Requests:
    """Distinct miss-only requests of ``width`` blocks, freed tail first."""

    def __init__(self, width: int = 100) -> None:
        self.width = width
        self.next = 0
        self.offsets = range(width - 1, -1, -1)

    def send(self, agent: Agent) -> float:
        blocks = list(range(self.next + self.width - 1, self.next - 1, -1))
        self.next += self.width
        t0 = time.perf_counter()
        agent.free(blocks, self.offsets, time.time(), "text_1")
        agent.evict(len(agent.policy) - agent.capacity, time.time())
        return time.perf_counter() - t0


# --- publisher -------------------------------------------------------------------------


def test_events_arrive_as_decodable_batches_with_consecutive_seq(
    redis_url: str, key_prefix: str, r: redis.Redis
) -> None:
    s = fast_settings(redis_url, key_prefix, batch_events=64)
    reqs = Requests(width=50)
    with Agent(s, capacity=500) as agent:
        for _ in range(40):
            reqs.send(agent)
        agent.touch(list(range(reqs.next - 1, reqs.next - 11, -1)), time.time(), "image_2")
    batches = stream_batches(r, key_prefix)
    assert [b.seq for b in batches] == list(range(1, len(batches) + 1))
    assert {b.epoch for b in batches} == {agent.epoch}
    assert all(len(b) <= 64 for b in batches)
    total = sum(len(b) for b in batches)
    assert total == agent.events_sent == agent.recorder.recorded
    assert agent.publisher.filtered == 0  # misses and hits only: no held block released
    assert agent.events_dropped == 0
    last = batches[-1]
    assert last.categories[last.category[-1]] == "image_2"
    kinds = np.concatenate([b.kind for b in batches])
    assert np.bincount(kinds, minlength=3).tolist() == [10, 2000, 1500]


def test_batches_redis_refuses_are_counted_dropped_and_the_rest_sent(
    redis_url: str, key_prefix: str, r: redis.Redis
) -> None:
    """A refused XADD (here the stream's key holds a string) drops its batch, counted;
    nothing is lost uncounted, and sending resumes once Redis takes batches again."""
    stream = Keys(key_prefix).events_stream("w1")
    r.set(stream, "not a stream")
    s = fast_settings(redis_url, key_prefix, batch_events=50)
    agent = Agent(s, capacity=500)  # not started: this test drives the publisher itself
    reqs = Requests(width=50)
    for _ in range(3):
        reqs.send(agent)
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        agent.publisher.flush()
    assert (agent.events_sent, agent.events_dropped) == (0, 150)
    r.delete(stream)
    reqs.send(agent)
    assert agent.publisher.flush() == 50
    assert agent.events_sent + agent.events_dropped == agent.recorder.recorded == 200
    agent.close()


def test_tally_judges_each_batch_of_a_pipeline_by_its_own_reply() -> None:
    refused = redis.ResponseError("OOM command not allowed")
    assert tally([10, 20, 30], [b"1-0", refused, b"1-1"]) == (40, refused)
    assert tally([10, 20], [b"1-0", b"1-1"]) == (30, None)


def rss_bytes() -> int:
    """Resident memory of this process now (Linux)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="needs Linux /proc")
def test_flood_is_bounded_and_every_event_is_sent_or_counted(
    redis_url: str, key_prefix: str, r: redis.Redis
) -> None:
    s = fast_settings(
        redis_url, key_prefix, buffer_events=256, batch_events=32, stream_maxlen=1_000_000
    )
    reqs = Requests(width=250)
    with Agent(s, capacity=1_000) as agent:
        for _ in range(20):  # warm up the evictor, history and allocator
            reqs.send(agent)
        before = rss_bytes()
        for _ in range(4_000):  # 2,000,000 events: 74 MB even in the wire format
            reqs.send(agent)
        grown = rss_bytes() - before
    recorded = agent.recorder.recorded
    assert recorded == 4_020 * 250 * 2 - 1_000  # inserts + evictions (capacity reached)
    assert agent.events_dropped > 0
    # Every operation is sent, dropped, or (a release of a held block) not an event.
    assert agent.events_sent + agent.events_dropped + agent.publisher.filtered == recorded
    batches = stream_batches(r, key_prefix)
    assert sum(len(b) for b in batches) == agent.events_sent
    assert [b.seq for b in batches] == list(range(1, len(batches) + 1))
    # Flooding never grows memory with the events.
    assert grown < 20_000_000, grown


def test_an_event_numpy_cannot_read_costs_its_own_run_only(
    redis_url: str, key_prefix: str, r: redis.Redis
) -> None:
    """An engine passing offsets that are not numbers: draining the buffer raised, and
    every event recorded with them (half the buffer) was lost, neither sent nor counted."""
    agent = Agent(fast_settings(redis_url, key_prefix), capacity=100)
    agent.free([3, 2, 1], [2, 1, 0], time.time(), "text_1")
    agent.free([6, 5, 4], ["2", "one", None], time.time(), "text_1")  # an engine's bug
    agent.free([9, 8, 7], [2, 1, 0], time.time(), "text_1")
    with agent:  # one drain finds all three runs
        wait_until(lambda: agent.events_sent == 6, what="the sound runs sent")
    assert agent.events_dropped == 3 and agent.recorder.recorded == 9
    assert sorted(stream_batches(r, key_prefix)[0].block) == [1, 2, 3, 7, 8, 9]


def test_redis_down_never_blocks_recording_then_recovers(tmp_path: Path, key_prefix: str) -> None:
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    s = fast_settings(url, key_prefix, buffer_events=2_000, batch_events=100, redis_timeout_s=2.0)
    reqs = Requests(width=50)
    slowest = 0.0
    with Agent(s, capacity=500) as agent:

        def outage_seen() -> bool:
            nonlocal slowest
            slowest = max(slowest, reqs.send(agent))
            return agent.publisher.failures >= 2 and agent.recorder.dropped > 0

        wait_until(outage_seen, timeout=20, what="the publisher to notice the outage", every=0)
        dropped_down = agent.events_dropped
        assert dropped_down > 0 and agent.events_sent == 0
        # A call that waited on the network would take the 2 s timeout: half of it is a
        # bound no load on the machine reaches.
        assert slowest < 1.0, slowest
        with EmbeddedRedis(tmp_path, port=port) as server:
            r = redis.Redis.from_url(server.url)
            wait_until(
                lambda: reqs.send(agent) >= 0 and agent.events_sent > 0,
                timeout=20,
                what="the publisher to reconnect",
            )
            assert agent.publisher.failures == 0
            agent.close()  # flush while the server is still up
            batches = stream_batches(r, key_prefix)
            r.close()
    assert sum(len(b) for b in batches) == agent.events_sent > 0
    accounted = agent.events_sent + agent.events_dropped + agent.publisher.filtered
    assert accounted == agent.recorder.recorded
    # Batches lost in the outage spent their sequence numbers: the controller sees a gap.
    assert batches[0].seq > 1
    assert [b.seq for b in batches] == list(range(batches[0].seq, batches[-1].seq + 1))


def test_silent_redis_never_blocks_recording(key_prefix: str) -> None:
    """A server that accepts connections and never answers: the publisher waits on its
    socket timeout, the engine thread does not."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        url = f"redis://127.0.0.1:{silent.getsockname()[1]}/0"
        s = fast_settings(
            url, key_prefix, buffer_events=1_000, batch_events=100, redis_timeout_s=2.0
        )
        reqs = Requests(width=50)
        slowest = 0.0
        agent = Agent(s, capacity=500).start()

        def dropping() -> bool:
            nonlocal slowest
            slowest = max(slowest, reqs.send(agent))
            return agent.recorder.dropped > 0

        wait_until(dropping, timeout=20, what="the buffer to overflow", every=0)
        for _ in range(200):
            slowest = max(slowest, reqs.send(agent))
        assert slowest < 1.0, slowest  # a call that waited would take the 2 s timeout
        assert agent.events_sent == 0
        assert agent.close(timeout=10.0)
    assert agent.events_dropped + agent.publisher.filtered == agent.recorder.recorded


# --- subscriber ------------------------------------------------------------------------


class PolicyLRU(LRUPolicy):
    """LRU that keeps the documents it was given (the ``set_policy`` hook of an evictor)."""

    def __init__(self) -> None:
        super().__init__()
        self.docs: list[PolicyDocument] = []

    def set_policy(self, doc: PolicyDocument) -> None:
        self.docs.append(doc)


def publish(
    r: redis.Redis, prefix: str, version: int, raw: bytes | str, notify: bool = True
) -> None:
    """What the controller's store does: document, index, pointer, notice."""
    k = Keys(prefix)
    r.set(k.policy_doc(version), raw)
    r.zadd(k.policy_versions, {str(version): version})
    r.set(k.policy_current, version)
    if notify:
        r.publish(k.policy_channel, version)


def doc(version: int, rate: float = 0.5) -> PolicyDocument:
    return PolicyDocument(
        version=version,
        categories={"text_1": CategoryParams(rate=rate, p_reuse=0.4, life_s=30.0)},
        note=f"test v{version}",
    )


def apply_when_staged(agent: Agent, timeout: float = 10.0) -> None:
    wait_until(agent.apply_pending, timeout=timeout, what="a staged policy")


def bad_json(version: int, **default: object) -> str:
    params = {"rate": 0.1, "p_reuse": 0.5, "life_s": 60.0, **default}
    return json.dumps({"version": version, "default": params})


def test_subscriber_applies_valid_and_rejects_bad_documents(
    redis_url: str, key_prefix: str, r: redis.Redis
) -> None:
    ev = PolicyLRU()
    s = fast_settings(redis_url, key_prefix)
    with Agent(s, capacity=10, policy=ev) as agent:
        # No controller yet: the built-in policy stays and nothing is staged.
        assert agent.subscriber.check() is None
        assert agent.document is BUILTIN_POLICY and not agent.apply_pending()
        first = doc(1)
        publish(r, key_prefix, 1, encode_policy(first))
        apply_when_staged(agent)
        assert agent.applied_version == 1 and ev.docs == [first]

        bad = [
            (2, bad_json(2, rate=float("nan")), "default.rate"),
            (3, bad_json(3, rate=-0.5), "default.rate"),
            (4, '{"version": 4, "default": {', "policy:"),
            (5, encode_policy(doc(6)), "document says version 6"),
        ]
        for n, (version, raw, reason) in enumerate(bad, start=1):
            publish(r, key_prefix, version, raw)
            wait_until(lambda n=n: agent.subscriber.rejected == n, what=f"rejection of v{version}")
            assert not agent.apply_pending()
            assert agent.applied_version == 1 and len(ev.docs) == 1
            assert agent.subscriber.last_rejection.startswith(f"v{version}: ")
            assert reason in agent.subscriber.last_rejection
        # A rejected version is not fetched and counted again at every poll.
        threading.Event().wait(3 * s.poll_interval_s)
        assert agent.subscriber.rejected == len(bad)
        agent.heartbeat.beat()
        status = AgentStatus.from_json(r.get(Keys(key_prefix).agent("w1")) or b"")
        assert status.rejected == len(bad) and status.applied_version == 1
        assert "document says version 6" in status.last_rejection

        publish(r, key_prefix, 7, encode_policy(doc(7, rate=2.0)))
        apply_when_staged(agent)
        assert agent.applied_version == 7 and ev.docs[-1].categories["text_1"].rate == 2.0


def test_missing_oversized_and_garbled_documents_are_reported_once(
    redis_url: str, key_prefix: str, r: redis.Redis
) -> None:
    """Issue 14, B11/B12 on the agent: a repeated refusal counted at every poll; `current`
    pointing at a missing document said nothing; no bound on the document's size."""
    s = fast_settings(redis_url, key_prefix, max_policy_bytes=2048, max_policy_categories=3)
    k = Keys(key_prefix)
    with Agent(s, capacity=10) as agent:
        sub = agent.subscriber
        r.set(k.policy_current, "not-a-number" + "9" * 10_000_000)  # read 32 bytes of it
        wait_until(lambda: sub.rejected == 1, what="the garbled pointer refused")
        head = b"not-a-number" + b"9" * 20
        assert sub.last_rejection == f"current is not a version number: {head!r}"
        r.set(k.policy_current, 5)  # no document under v5
        wait_until(lambda: sub.rejected == 2, what="the missing document reported")
        assert sub.last_rejection == "v5: current points at a missing document"
        many = {f"c{i}": CategoryParams(rate=1, p_reuse=0.5, life_s=1) for i in range(4)}
        publish(r, key_prefix, 6, encode_policy(PolicyDocument(version=6, categories=many)))
        wait_until(lambda: sub.rejected == 3, what="too many categories refused")
        assert "4 categories > limit 3" in sub.last_rejection
        publish(r, key_prefix, 7, json.dumps({"version": 7, "note": "x" * 3000}))
        wait_until(lambda: sub.rejected == 4, what="the large document refused")
        assert sub.last_rejection.endswith("bytes > limit 2048 (not read)")  # sized first
        threading.Event().wait(5 * s.poll_interval_s)  # polls go on: no new count
        assert sub.rejected == 4
        # A missing document that appears later is applied: it is fetched at each poll.
        r.set(k.policy_current, 5)
        wait_until(lambda: sub.rejected == 5, what="v5 missing again")
        r.set(k.policy_doc(5), encode_policy(doc(5)))
        apply_when_staged(agent)
        assert agent.applied_version == 5 and sub.rejected == 5


def test_a_document_that_grows_once_sized_is_never_read_whole(
    redis_url: str, key_prefix: str, r: redis.Redis
) -> None:
    """The document's size was asked, then the document read whole: one that grew in
    between (a writer replacing it) was brought in whole, however large."""
    k = Keys(key_prefix)
    agent = Agent(fast_settings(redis_url, key_prefix, max_policy_bytes=2048), capacity=10)
    sub = agent.subscriber  # the test polls
    replies: list[int] = []
    send = sub.client.execute_command
    large = json.dumps({"version": 1, "note": "x" * 4_000_000})

    def observed(*args: Any, **options: Any) -> Any:
        reply = send(*args, **options)
        replies.append(len(reply) if isinstance(reply, bytes) else 0)
        if args[1:2] == (k.policy_doc(1),) and len(replies) == 2:  # after current, then it
            r.set(k.policy_doc(1), large)  # grows
        return reply

    sub.client.execute_command = observed  # type: ignore[method-assign]
    publish(r, key_prefix, 1, encode_policy(doc(1)), notify=False)
    staged = sub.check()
    assert max(replies) <= 2049, f"a reply of {max(replies)} bytes read"
    assert staged is not None and staged.version == 1  # what it held when read
    publish(r, key_prefix, 2, large.replace('"version": 1', '"version": 2'), notify=False)
    assert sub.check() is None and sub.rejected == 1
    size = r.strlen(k.policy_doc(2))
    assert sub.last_rejection == f"v2: policy: document of {size} bytes > limit 2048 (not read)"
    assert max(replies) <= 2049, f"a reply of {max(replies)} bytes read"
    agent.close()


def test_a_document_over_the_category_limit_is_refused_before_its_categories_are_checked(
    redis_url: str, key_prefix: str, r: redis.Redis
) -> None:
    """Categories were counted only once each was validated as a model: a document of
    40,000 small categories held the GIL (the engine's thread) for a fifth of a second
    before its count refused it. Counted first, a bad parameter among too many is not reached."""
    agent = Agent(fast_settings(redis_url, key_prefix), capacity=10)  # the test polls
    limit = agent.settings.max_policy_categories
    many = {f"c{i}": {"rate": 1, "p_reuse": 0.5, "life_s": 1} for i in range(40_000)}
    many["c7"] = {"rate": -1, "p_reuse": 0.5, "life_s": 1}
    raw = json.dumps({"version": 1, "categories": many}, separators=(",", ":"))
    assert len(raw) <= agent.settings.max_policy_bytes  # read, and parsed
    publish(r, key_prefix, 1, raw, notify=False)
    assert agent.subscriber.check() is None
    assert agent.subscriber.last_rejection == f"v1: policy: 40000 categories > limit {limit}"
    agent.close()


def test_a_document_of_empty_arrays_is_refused_unparsed_and_the_policy_stays(
    redis_url: str, key_prefix: str, r: redis.Redis
) -> None:
    """A document of the size limit made of empty arrays (under a field refused as
    unknown) held the GIL 0.9 to 1.7 s: parsed to count its categories, parsed again to be
    validated. Refused by its bytes, counted once, and the version in force stays."""
    agent = Agent(fast_settings(redis_url, key_prefix), capacity=10)  # the test polls
    sub = agent.subscriber
    publish(r, key_prefix, 1, encode_policy(doc(1)), notify=False)
    assert sub.check() is not None
    raw = filled(b'{"version":2,"x":[', b"[]", b"]}", agent.settings.max_policy_bytes)
    publish(r, key_prefix, 2, raw, notify=False)
    assert sub.check() is None and sub.check() is None
    assert (sub.rejected, sub.staged_version) == (1, 1)
    assert sub.last_rejection == (
        'v2: policy: an array at byte 17 (after b\'{"version":2,"x":\'): a policy '
        "document holds none"
    )
    agent.close()


def test_a_rejection_names_a_long_category_name_by_its_head(
    redis_url: str, key_prefix: str, r: redis.Redis
) -> None:
    """A document whose bad parameters sit under a category name of 1 MB: the reason held
    the whole name, so it was logged and written in every heartbeat."""
    params = {"rate": -1.0, "p_reuse": 0.5, "life_s": 1.0}
    raw = json.dumps({"version": 1, "categories": {"n" * 1_000_000: params}})
    with Agent(fast_settings(redis_url, key_prefix), capacity=10) as agent:
        publish(r, key_prefix, 1, raw)
        wait_until(lambda: agent.subscriber.rejected == 1, what="the document refused")
        reason = agent.subscriber.last_rejection
        assert reason.startswith("v1: policy: categories.nnn"), reason[:200]
        assert "rate: Input should be greater than 0" in reason, reason[:200]
        assert len(reason) < 500, f"a reason of {len(reason)} characters"
        agent.heartbeat.beat()
        assert r.strlen(Keys(key_prefix).agent("w1")) < 4096


def test_policy_keys_of_another_type_are_refused_by_name(
    redis_url: str, key_prefix: str, r: redis.Redis
) -> None:
    """``current`` or a document that is not a string (a list, say): every poll failed as
    a Redis error ("WRONGTYPE ..." naming no key), backing off and counting no rejection."""
    k = Keys(key_prefix)
    with Agent(fast_settings(redis_url, key_prefix), capacity=10) as agent:
        sub = agent.subscriber
        r.rpush(k.policy_current, "7")
        wait_until(lambda: sub.rejected == 1, what="current of another type refused")
        assert sub.last_rejection == f"{k.policy_current} is a list, not a version number"
        r.delete(k.policy_current)
        r.set(k.policy_current, 7)
        r.rpush(k.policy_doc(7), "{}")
        wait_until(lambda: sub.rejected == 2, what="a document of another type refused")
        assert sub.last_rejection == f"v7: {k.policy_doc(7)} is a list, not a document"
        threading.Event().wait(3 * agent.settings.poll_interval_s)
        assert (sub.rejected, sub.failures, sub.last_error) == (2, 0, "")
        publish(r, key_prefix, 8, encode_policy(doc(8)))
        apply_when_staged(agent)
        assert agent.applied_version == 8


def test_an_older_controllers_key_of_another_type_is_told_once_by_name(
    redis_url: str, key_prefix: str, r: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """The key where a controller of wire schema 1 kept ``current``, held as another type
    than a string: while ``current`` was absent, every poll failed as a Redis error
    (WRONGTYPE, naming no key) and the subscriber backed off."""
    schema1 = Keys(key_prefix).schema1_policy_current
    r.rpush(schema1, "7")
    agent = Agent(fast_settings(redis_url, key_prefix), capacity=10)  # the test polls
    for _ in range(3):
        assert agent.subscriber.run_step()
    told = [m for m in caplog.messages if schema1 in m]
    assert told == [f"kvwise subscriber: {schema1} is a list, not a schema-1 controller's "
                    "current: ignored"]  # fmt: skip
    assert agent.subscriber.rejected == 0  # nothing of this agent's policy was refused
    agent.close()
    r.delete(schema1)
    r.set(schema1, "7")  # an older controller's: said once too
    agent = Agent(fast_settings(redis_url, key_prefix), capacity=10)
    for _ in range(3):
        assert agent.subscriber.run_step()
    told = [m for m in caplog.messages if schema1 in m]
    assert len(told) == 2 and "older release (wire schema 1)" in told[1]
    agent.close()


def test_a_number_that_comes_back_with_another_document_after_a_lost_store_is_staged(
    redis_url: str, key_prefix: str, r: redis.Redis
) -> None:
    """A Redis restarted empty whose controller published another document under the
    number the agent held: the agent kept its own (same number: "nothing new") and its
    heartbeat reported it in sync."""
    agent = Agent(fast_settings(redis_url, key_prefix), capacity=10)  # the test polls
    sub = agent.subscriber
    publish(r, key_prefix, 3, encode_policy(doc(3, rate=0.5)), notify=False)
    assert sub.check() is not None and agent.apply_pending()
    delete_prefix(redis_url, key_prefix)  # the store is lost
    assert sub.check() is None
    other = doc(3, rate=0.9)
    publish(r, key_prefix, 3, encode_policy(other), notify=False)
    assert sub.check() == other and agent.apply_pending()
    assert agent.document == other and agent.status().staged_version == 3
    delete_prefix(redis_url, key_prefix)  # lost again, back with the same document
    assert sub.check() is None
    publish(r, key_prefix, 3, encode_policy(other), notify=False)
    assert sub.check() is None and sub.take() is None  # nothing new to stage
    agent.close()


def test_a_refused_number_that_comes_back_after_a_lost_store_is_read_again(
    redis_url: str, key_prefix: str, r: redis.Redis
) -> None:
    """A refusal was remembered across a lost store: once Redis came back (empty, then
    restored) with a valid document under the number once refused, the agent never read
    it and kept its old version while ``current`` named another."""
    agent = Agent(fast_settings(redis_url, key_prefix), capacity=10)  # the test polls
    sub = agent.subscriber
    publish(r, key_prefix, 3, encode_policy(doc(3)), notify=False)
    assert sub.check() is not None and agent.apply_pending()
    publish(r, key_prefix, 4, bad_json(4, rate=-1.0), notify=False)
    assert sub.check() is None and sub.rejected == 1
    delete_prefix(redis_url, key_prefix)  # the store is lost
    assert sub.check() is None
    publish(r, key_prefix, 4, encode_policy(doc(4)), notify=False)
    staged = sub.check()
    assert staged is not None and staged.version == 4 and agent.apply_pending()
    agent.close()


def test_pubsub_hint_is_fast_and_polling_is_the_guarantee(
    redis_url: str, key_prefix: str, r: redis.Redis
) -> None:
    channel = Keys(key_prefix).policy_channel
    # Polling is slow here, so only the notice can make the change arrive quickly.
    s = fast_settings(redis_url, key_prefix, poll_interval_s=60.0)
    with Agent(s, capacity=10) as agent:
        wait_until(lambda: dict(r.pubsub_numsub(channel)).get(channel.encode(), 0) > 0)
        t0 = time.monotonic()
        publish(r, key_prefix, 1, encode_policy(doc(1)))
        apply_when_staged(agent, timeout=5.0)
        assert time.monotonic() - t0 < 5.0
    # Without any notice, polling picks it up.
    s = fast_settings(redis_url, key_prefix, poll_interval_s=0.1, worker_id="w2")
    with Agent(s, capacity=10) as agent:
        apply_when_staged(agent)
        assert agent.applied_version == 1
        publish(r, key_prefix, 2, encode_policy(doc(2)), notify=False)
        apply_when_staged(agent)
        assert agent.applied_version == 2


def test_a_burst_of_notices_costs_one_poll_not_one_each(
    redis_url: str, key_prefix: str, r: redis.Redis
) -> None:
    """Every notice on the channel made a poll of its own: a burst of them (a runaway
    publisher) kept the subscriber thread making round trips, one per notice."""
    channel = Keys(key_prefix).policy_channel
    s = fast_settings(redis_url, key_prefix, poll_interval_s=60.0)  # notices only
    with Agent(s, capacity=10) as agent:
        sub = agent.subscriber
        polls = 0
        poll = sub.check

        def counted() -> PolicyDocument | None:
            nonlocal polls
            polls += 1
            return poll()

        sub.check = counted  # type: ignore[method-assign]
        wait_until(lambda: dict(r.pubsub_numsub(channel)).get(channel.encode(), 0) > 0)
        burst = r.pipeline(transaction=False)
        for _ in range(2000):
            burst.publish(channel, "0")
        burst.execute()
        publish(r, key_prefix, 1, encode_policy(doc(1)))  # its notice comes last
        apply_when_staged(agent)
        threading.Event().wait(1.0)  # an absence is awaited: the burst's polls, done
        assert polls < 50, f"{polls} polls for a burst of 2001 notices"


def test_an_evictor_refusing_a_document_counts_as_a_rejection(
    redis_url: str, key_prefix: str, r: redis.Redis
) -> None:
    class Picky(PolicyLRU):
        def set_policy(self, doc: PolicyDocument) -> None:
            if "image_1" not in doc.categories:
                raise ValueError("no image_1 parameters")
            super().set_policy(doc)

    s = fast_settings(redis_url, key_prefix)
    with Agent(s, capacity=10, policy=Picky()) as agent:
        publish(r, key_prefix, 1, encode_policy(doc(1)))
        wait_until(lambda: agent.subscriber.known_version == 1)
        assert not agent.apply_pending()
        assert agent.applied_version == 0 and agent.subscriber.rejected == 1
        assert "evictor refused it: no image_1" in agent.subscriber.last_rejection


def test_an_evictor_refusal_of_any_length_is_kept_short(
    redis_url: str, key_prefix: str, r: redis.Redis
) -> None:
    class Verbose(PolicyLRU):
        def set_policy(self, doc: PolicyDocument) -> None:
            raise ValueError("no parameters for " + ", ".join(f"c{i}" for i in range(10**5)))

    with Agent(fast_settings(redis_url, key_prefix), capacity=10, policy=Verbose()) as agent:
        publish(r, key_prefix, 1, encode_policy(doc(1)))
        wait_until(lambda: agent.subscriber.known_version == 1)
        assert not agent.apply_pending()
        reason = agent.subscriber.last_rejection
        assert reason.startswith("v1: evictor refused it: no parameters for c0, c1")
        assert len(reason) < 500, f"a reason of {len(reason)} characters"


def test_a_version_the_evictor_refused_is_not_staged_again_whatever_the_pointer_spells(
    redis_url: str, key_prefix: str, r: redis.Redis
) -> None:
    """``current`` spelling the number otherwise than the agent does (``07``, `` 7``):
    after the evictor refused v7, the refusal was remembered as ``7``, so every poll
    fetched, validated and staged v7 again and the engine offered it to the evictor
    again."""
    refusals: list[int] = []

    class Refusing(PolicyLRU):
        def set_policy(self, doc: PolicyDocument) -> None:
            refusals.append(doc.version)
            raise ValueError("not this one")

    agent = Agent(fast_settings(redis_url, key_prefix), capacity=10, policy=Refusing())
    publish(r, key_prefix, 7, encode_policy(doc(7)), notify=False)
    r.set(Keys(key_prefix).policy_current, "07")
    assert agent.subscriber.check() is not None and not agent.apply_pending()
    assert refusals == [7] and agent.subscriber.rejected == 1
    assert agent.subscriber.check() is None and not agent.apply_pending()
    assert refusals == [7]
    agent.close()


def test_a_refusal_after_the_fact_keeps_a_newer_version_staged_meanwhile(
    redis_url: str, key_prefix: str, r: redis.Redis
) -> None:
    """The engine takes v1, the subscriber stages v2, then the evictor refuses v1: v2
    stays staged (it was once reset to v0, then fetched and applied a second time)."""
    agent = Agent(fast_settings(redis_url, key_prefix), capacity=10)  # the test polls
    sub = agent.subscriber
    publish(r, key_prefix, 1, encode_policy(doc(1)), notify=False)
    assert sub.check() is not None and sub.take() is not None  # the engine has v1
    publish(r, key_prefix, 2, encode_policy(doc(2)), notify=False)
    assert sub.check() is not None  # v2 staged
    sub.reject(1, "evictor refused it", keep=0)
    assert (sub.known_version, sub.staged_version, sub.rejected) == (2, 2, 1)
    staged = sub.take()
    assert staged is not None and staged.version == 2
    assert sub.check() is None  # not fetched and staged again
    agent.close()


# --- heartbeat -------------------------------------------------------------------------


def test_heartbeat_key_has_ttl_and_current_counters(
    redis_url: str, key_prefix: str, r: redis.Redis
) -> None:
    key = Keys(key_prefix).agent("w1")
    s = fast_settings(redis_url, key_prefix, heartbeat_ttl_s=3.0)
    with Agent(s, capacity=123, engine="sim") as agent:
        wait_until(lambda: r.exists(key) == 1)
        ttl = r.pttl(key)
        assert 0 < ttl <= 3_000
        agent.free([3, 2, 1], [2, 1, 0], time.time(), "text_1")
        agent.touch([1, 2], time.time(), "text_1")
        wait_until(lambda: AgentStatus.from_json(r.get(key) or b"").hits == 2)
        st = AgentStatus.from_json(r.get(key) or b"")
        assert (st.id, st.engine, st.capacity) == ("w1", "sim", 123)
        assert (st.accesses, st.applied_version, st.rejected) == (3, 0, 0)
        assert st.started_at <= st.updated_at
    final = AgentStatus.from_json(r.get(key) or b"")
    assert final.events_sent == 5 and final.hit_ratio == pytest.approx(2 / 3)
    assert 0 < r.pttl(key) <= 3_000


def test_a_closed_agent_leaves_the_controllers_view_soon_after_its_last_beat(
    redis_url: str, key_prefix: str, r: redis.Redis
) -> None:
    """The last beat, written at close, took the full heartbeat TTL: a cleanly closed
    worker stayed listed alive (GET /v1/agents, the dashboard) for up to 30 s after."""
    key = Keys(key_prefix).agent("w1")
    reader = AgentReader(r, Keys(key_prefix), max_agents=10)
    s = fast_settings(redis_url, key_prefix, heartbeat_ttl_s=60.0)
    with Agent(s, capacity=10, engine="sim") as agent:
        wait_until(lambda: r.exists(key) == 1, what="the first beat")
        assert r.pttl(key) > 50_000  # a live worker's beat keeps the TTL asked
        agent.free([2, 1], [1, 0], time.time(), "text_1")
    assert 0 < r.pttl(key) <= LAST_BEAT_TTL_S * 1000
    [listed] = reader.read().agents  # its final counters, for the controller to read meanwhile
    assert (listed.id, listed.accesses, listed.events_sent) == ("w1", 2, 2)

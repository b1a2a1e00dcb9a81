"""``EngineAgent`` behind a ``KvwiseFreeQueue``, on a real Redis: categories (explicit,
default, folded into ``other``), hit and store accounting, eviction events by hash, and a
policy version written to Redis reaching the evictor at the next queue call, and an idle
engine reporting a version staged but not yet applied.

``Blk`` stands for vLLM's ``KVCacheBlock`` (the real one runs in tests/e2e/test_vllm.py).
"""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import asdict
from types import SimpleNamespace
from typing import Any

import pytest
import redis

from agent.history import AccessHistory
from agent.integrations.block_queue import KvwiseFreeQueue, hash64
from agent.integrations.engine_agent import DEFAULT_CATEGORY, EngineAgent
from agent.policies.wa import WAPolicy
from agent.policy_document import CategoryParams, PolicyDocument
from agent.settings import AgentSettings
from agent.wire import EventBatch, EventKind, Keys, encode_policy
from controlplane.service.settings import ControllerSettings
from controlplane.shadow.rebuild import CategoryTable, RequestRebuilder
from controlplane.shadow.sampler import PrefixSampler
from tests.integration.controller_fixtures import RunningController, running_controller
from tests.vllm_block import Blk
from tests.waiting import wait_until

pytestmark = pytest.mark.integration


@pytest.fixture
def engine(redis_url: str, key_prefix: str) -> Iterator[tuple[EngineAgent, KvwiseFreeQueue]]:
    settings = AgentSettings(
        enable=True, redis_url=redis_url, key_prefix=key_prefix, max_tracked_categories=5
    )
    evictor = WAPolicy()
    ea = EngineAgent(settings, evictor, capacity=8, engine="vllm", infer=False)
    queue = KvwiseFreeQueue([Blk(i) for i in range(8)], evictor, hooks=ea)
    yield ea, queue
    ea.close()


def store(queue: KvwiseFreeQueue, ea: EngineAgent, blocks: list[Any], name: str) -> None:
    """What the plugin does for ``cache_full_blocks``: hash, side table, INSERT events."""
    for b in blocks:
        b.block_hash = (1000 + b.block_id).to_bytes(32, "big") + bytes(4)
    _, code = ea.category(name, (), 0)
    hashes = queue.note_stored(blocks, 0, code)[0]
    ea.cached(hashes, range(len(blocks)), 1.0, ea.category(name, (), 0)[0])


def test_categories_are_explicit_default_or_folded(engine: Any) -> None:
    ea, _ = engine
    assert ea.category("chat", (), 0)[0] == "chat"
    assert ea.category(None, (), 0)[0] == DEFAULT_CATEGORY  # no inference asked for
    ea.category("doc", (), 0)
    # max_categories 5: the agent's "unknown", chat, default, doc, then "other" for all.
    assert ea.category("late", (), 0)[0] == "other"
    assert ea.category("later", (), 0) == ea.category("late", (), 0)
    codes = {ea.category(n, (), 0)[1] for n in ("chat", DEFAULT_CATEGORY, "doc", "late")}
    assert len(codes) == 4  # the evictor got one code per table entry


def test_long_client_names_are_folded_and_never_kept(engine: Any) -> None:
    """The name cache once kept 4 x max_categories client strings of any length (1 MB
    names: about 4 GB at the defaults)."""
    ea, _ = engine
    tracemalloc.start()
    try:
        for i in range(16):  # 1.6 MB of names, each gone after its call unless kept
            assert ea.category(f"{i:04d}" + "x" * 100_000, (), 0)[0] == "other"
        kept, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert kept < 100_000, kept


def test_inference_counts_new_tokens_in_the_engines_block_size(
    redis_url: str, key_prefix: str
) -> None:
    """vLLM with ``--block-size 32``: chat requests of a 4-block system prompt plus 69
    new tokens (6 full blocks of 32) have 69 new tokens, under the first edge (128)."""
    settings = AgentSettings(enable=True, redis_url=redis_url, key_prefix=key_prefix)
    ea = EngineAgent(settings, WAPolicy(), capacity=64, engine="vllm", block_tokens=32)
    system = [1, 2, 3, 4]
    names = []
    for chat in range(3):
        hashes = [*system, 100 + 10 * chat, 101 + 10 * chat]  # 197 tokens: 6 full blocks
        names.append(ea.category(None, hashes, 4 * 32 + 69)[0])
    ea.close()
    # First: all 197 tokens new; second: taken for a follow-up of the first (one
    # divergence after the system prompt); third: a first turn with 69 new tokens.
    # Counted in 16-token blocks the new tokens would be 197 - 64 = 133: bucket 1.
    assert names == ["t1_n1", "t2_n0", "t1_n0"]


def test_stores_hits_and_evictions_are_recorded_by_hash(engine: Any) -> None:
    ea, queue = engine
    got = queue.popleft_n(4)
    store(queue, ea, got, "chat")
    hits, offs = queue.note_hits(got[:2], ea.category("chat", (), 0)[1])
    ea.hit(hits, offs, 2.0, "chat")
    assert ea.agent.hits == 2 and ea.agent.accesses == 6
    queue.append_n(got[::-1])
    queue.popleft_n(4 + 2)  # the 4 fresh blocks, then two cached victims (tail first)
    cols = ea.agent.recorder.drain()
    kinds = list(cols.kind)
    # Every access is recorded as a release (INSERT kind: the publisher keeps those of
    # blocks not cached before); the two hits also as HIT.
    assert kinds.count(EventKind.INSERT) == 6 and kinds.count(EventKind.HIT) == 2
    evicted = [b for b, k in zip(cols.block, kinds, strict=True) if k == EventKind.EVICT]
    assert evicted == [hash64(got[3].block_hash), hash64(got[2].block_hash)]


def _rebuilt(ea: EngineAgent) -> Any:
    """What the controller's shadow rebuilds from the events recorded so far (resolved as
    the publisher resolves them, every request sampled)."""
    events = AccessHistory(64).resolve(ea.agent.recorder.drain(), unknown_category=0)
    batch = EventBatch.of(
        events, worker="w", seq=1, epoch="e", categories=ea.agent.categories.snapshot()
    )
    rebuilder = RequestRebuilder(PrefixSampler(1.0), CategoryTable())
    got = rebuilder.feed(batch)
    tail = rebuilder.flush()
    return got.sampled + tail.sampled, got.incomplete + tail.incomplete, got.continued


def test_a_request_reported_over_several_steps_is_recorded_whole(engine: Any) -> None:
    """vLLM reports a request's hits and stored blocks over one or more scheduling steps;
    held on the request, they are recorded once its prompt is whole, at its first time:
    the shadow rebuilds the request exactly. Blocks past the prompt go out as they come."""
    ea, _ = engine
    first = SimpleNamespace()  # a 2-block prompt: stores blocks 1, 2 at once
    report = ea.report_of(first, "chat", 2 * 16 + 5, now=10.0)
    ea.hold_stored(report, [1, 2], range(2), now=10.0)
    assert report.whole
    ea.record(report)
    second = SimpleNamespace()  # 5 prompt blocks: hits 1, 2, stores 3, 4 then 5, then 6
    report = ea.report_of(second, "chat", 5 * 16, now=20.0)
    ea.hold_hits(report, [1, 2], [0, 1])
    ea.hold_stored(report, [3, 4], range(2, 4), now=20.5)
    assert not report.whole and ea.agent.accesses == 2  # held: nothing recorded yet
    ea.hold_stored(report, [5, 6], range(4, 6), now=21.0)  # 6: past the prompt, at once
    assert report.whole
    ea.record(report)
    ea.record(report)  # a second record (the request freed) records nothing more
    requests, incomplete, continued = _rebuilt(ea)
    assert [(r.ts, r.blocks, r.seen_hits) for r in requests] == [
        (10.0, [1, 2], 0),
        (20.0, [1, 2, 3, 4, 5], 2),
    ]
    assert (incomplete, continued) == (0, 1)  # block 6 is a continuation, not broken
    assert ea.agent.hits == 2 and ea.agent.accesses == 2 + 2 + 3 + 1
    assert asdict(ea.agent.status())["whole_requests"] is True
    assert asdict(ea.agent.status())["reuse_classes"] is False
    assert asdict(ea.agent.status())["supersedes_branches"] is False  # the generic API


def test_a_request_hitting_blocks_another_still_holds_is_recorded_after_it(
    engine: Any,
) -> None:
    """Chunked prefill: A stores blocks 1, 2 in its first chunk (held, its prompt not
    whole yet), B hits them and is whole first. B once went out first: its HITs of blocks
    no INSERT had made, then A's INSERTs of 1, 2 taken for releases and filtered away.
    B now waits for A: both are rebuilt whole, in time order."""
    ea, _ = engine
    a_report = ea.report_of(SimpleNamespace(), "chat", 4 * 16, now=10.0)
    ea.hold_stored(a_report, [1, 2], range(2), now=10.0)
    b_report = ea.report_of(SimpleNamespace(), "chat", 3 * 16, now=11.0)
    ea.hold_hits(b_report, [1, 2], [0, 1])
    ea.hold_stored(b_report, [7], range(2, 3), now=11.0)
    assert b_report.whole
    ea.record(b_report)
    assert ea.agent.accesses == 0  # B waits for A
    ea.record(b_report)  # B freed meanwhile: still waits, nothing twice
    ea.hold_stored(a_report, [3, 4], range(2, 4), now=12.0)
    ea.record(a_report)
    requests, incomplete, _ = _rebuilt(ea)
    assert [(r.ts, r.blocks, r.seen_hits) for r in requests] == [
        (10.0, [1, 2, 3, 4], 0),
        (11.0, [1, 2, 7], 2),
    ]
    assert incomplete == 0
    assert ea.agent.hits == 2 and ea.agent.accesses == 4 + 3


def test_a_request_without_attributes_has_its_blocks_recorded_at_once(engine: Any) -> None:
    ea, _ = engine
    report = ea.report_of(object(), "chat", 4 * 16, now=5.0)
    ea.hold_stored(report, [1, 2], range(2), now=5.0)
    assert ea.agent.accesses == 2  # not held: a later record would never come


def test_a_published_version_reaches_the_evictor_at_the_next_queue_call(
    engine: Any, redis_url: str, key_prefix: str
) -> None:
    ea, queue = engine
    doc = PolicyDocument(
        version=7, categories={"doc": CategoryParams(rate=0.1, p_reuse=0.0, life_s=10)}
    )
    keys = Keys(key_prefix)
    client = redis.Redis.from_url(redis_url)
    client.set(keys.policy_doc(7), encode_policy(doc))
    client.set(keys.policy_current, 7)
    assert ea.agent.subscriber.check() is not None  # one poll (the thread does it live)
    assert ea.order.evictor.policy.version == 0  # staged only: the engine has not run
    queue.popleft_n(1)
    assert ea.order.evictor.policy == doc and ea.agent.applied_version == 7


def test_a_published_supersede_rule_reaches_the_queue_at_its_next_call(
    engine: Any, redis_url: str, key_prefix: str
) -> None:
    ea, queue = engine
    ea.order.add_follower(queue.follow)  # as the vLLM plugin wires it
    queue.set_supersede("tree")
    branches = queue.branches
    assert branches is not None
    client, keys = redis.Redis.from_url(redis_url), Keys(key_prefix)
    for version, rule in ((7, "tree"), (8, "off"), (9, "tree")):
        client.set(
            keys.policy_doc(version), encode_policy(PolicyDocument(version=version, supersede=rule))
        )
        client.set(keys.policy_current, version)
        assert ea.agent.subscriber.check() is not None
        assert queue.supersede == ("tree" if version != 9 else "off")  # staged only
        queue.append_n(queue.popleft_n(1))
        assert queue.supersede == rule and ea.agent.applied_version == version
        assert (queue.branches is branches) == (version == 7)  # kept while left on
        assert (queue.branches is None) == (rule == "off")


def test_an_idle_engine_reports_the_version_staged_and_applies_it_at_its_next_call(
    redis_url: str, key_prefix: str
) -> None:
    """``/v1/agents`` on a real controller: a version pushed while the engine is idle shows
    as ``staged_version`` with the old ``applied_version``, until the queue is called."""
    token = "staged-token"
    settings = AgentSettings(
        enable=True,
        redis_url=redis_url,
        key_prefix=key_prefix,
        worker_id="idle-engine",
        poll_interval_s=0.1,
        heartbeat_interval_s=0.1,
    )
    controller = ControllerSettings(
        redis_url=redis_url,
        key_prefix=key_prefix,
        api_token=token,  # type: ignore[arg-type]
        refit_interval_s=3600,
    )
    evictor = WAPolicy()
    with running_controller(controller) as ctl:
        ea = EngineAgent(settings, evictor, capacity=8, engine="vllm", infer=False).start()
        try:
            queue = KvwiseFreeQueue([Blk(i) for i in range(8)], evictor, hooks=ea)
            # The controller's first version reaches the idle engine: staged, not applied.
            me = _wait_agent(ctl, lambda a: a["staged_version"] == 1)
            assert me["applied_version"] == 0
            queue.popleft_n(1)  # the engine's next queue call applies it
            me = _wait_agent(ctl, lambda a: a["applied_version"] == 1)
            assert me["staged_version"] == 1  # nothing waits
            r = ctl.client.put(
                "/v1/policy/overrides/doc",
                json={"p_reuse": 0.0},
                headers={"Authorization": f"Bearer {token}"},
            )
            pushed = r.json()["version"]
            me = _wait_agent(ctl, lambda a: a["staged_version"] == pushed)
            assert me["applied_version"] == 1  # idle: received, not in force
            time.sleep(0.5)  # still idle after several polls and heartbeats
            assert _wait_agent(ctl, lambda a: True)["applied_version"] == 1
            queue.popleft_n(1)  # the next queue call applies it
            me = _wait_agent(ctl, lambda a: a["applied_version"] == pushed)
            assert me["staged_version"] == pushed
            assert evictor.policy.version == pushed
        finally:
            ea.close()


def _wait_agent(ctl: RunningController, ok: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    def state() -> dict[str, Any] | None:
        me = {a["id"]: a for a in ctl.client.get("/v1/agents").json()}.get("idle-engine")
        return me if me is not None and ok(me) else None

    found: dict[str, Any] = wait_until(state, timeout=15, what="the idle engine's agent state")
    return found


def test_reuse_classes_give_hits_the_reuse_class_of_their_category(
    redis_url: str, key_prefix: str
) -> None:
    """``reuse_classes``: what a request finds cached is reported and filed as
    ``chat/re`` (what the vLLM plugin's ``touch`` wrapper does), its inserts as ``chat``;
    "chat/re" is never reused, so its blocks are evicted first."""
    settings = AgentSettings(
        enable=True, redis_url=redis_url, key_prefix=key_prefix, reuse_classes=True
    )
    doc = PolicyDocument(
        version=1,
        categories={"chat/re": CategoryParams(rate=1.0, p_reuse=0.0, life_s=0.1)},
        default=CategoryParams(rate=0.01, p_reuse=0.9, life_s=0.1),
    )
    evictor = WAPolicy(doc=doc)
    ea = EngineAgent(settings, evictor, capacity=8, engine="vllm", infer=False)
    queue = KvwiseFreeQueue([Blk(i) for i in range(8)], evictor, hooks=ea)
    got = queue.popleft_n(4)
    store(queue, ea, got, "chat")
    name, code = ea.hit_category(*ea.category("chat", (), 0))
    assert name == "chat/re" and evictor.category_names[code] == "chat/re"
    hits, offs = queue.note_hits(got[2:], code)
    ea.hit(hits, offs, 2.0, name)
    queue.append_n(got[::-1])
    queue.popleft_n(4 + 2)  # the 4 fresh blocks, then the two found cached
    cols = ea.agent.recorder.drain()
    table = ea.agent.categories
    hit_codes = {
        int(c) for c, k in zip(cols.category, cols.kind, strict=True) if k == EventKind.HIT
    }
    assert hit_codes == {table.code("chat/re")}
    evicted = [b for b, k in zip(cols.block, cols.kind, strict=True) if k == EventKind.EVICT]
    assert sorted(evicted) == sorted(hash64(b.block_hash) for b in got[2:])
    ea.close()


def test_reuse_classes_file_a_block_stored_again_after_its_eviction_as_a_return(
    redis_url: str, key_prefix: str
) -> None:
    """What the vLLM plugin asks before it files stored blocks: one evicted lately is a
    return (``chat/re``), a new one is not; asking changes nothing."""
    settings = AgentSettings(
        enable=True, redis_url=redis_url, key_prefix=key_prefix, reuse_classes=True
    )
    evictor = WAPolicy()
    ea = EngineAgent(settings, evictor, capacity=8, engine="vllm", infer=False)
    name, code = ea.category("chat", (), 0)
    assert ea.stored_codes([7, 8], name, code) == [code, code]
    ea.cached([8, 7], [1, 0], 1.0, name)
    ea.evicted([7], 2.0)
    again = ea.hit_category(name, code)[1]
    assert ea.stored_codes([7, 9], name, code) == [again, code]
    assert ea.stored_codes([7, 9], name, code) == [again, code]
    assert ea.cached([7], [0], 3.0, name) == [again]  # the recording agrees, and takes it
    assert ea.stored_codes([7], name, code) == [code]
    ea.close()
    off = EngineAgent(
        AgentSettings(enable=True, redis_url=redis_url, key_prefix=key_prefix),
        WAPolicy(),
        capacity=8,
        engine="vllm",
        infer=False,
    )
    assert off.stored_codes([7], name, code) is None
    off.close()

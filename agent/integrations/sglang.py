"""The kvwise SGLang plugin: ``register`` (entry point ``sglang.srt.plugins: kvwise``).

Owns the seam into SGLang's radix prefix cache, and is the only kvwise module that imports
SGLang:

- ``register`` adds a radix-cache backend named ``kvwise`` to SGLang's registry
  (``sglang.srt.mem_cache.registry``); a server started with ``--radix-cache-backend
  kvwise`` builds its tree cache through ``build_cache``: SGLang's own ``RadixCache``, whose
  ``eviction_strategy`` (read by ``RadixCache.evict`` on every call) is a ``RadixOrder``
  ranking the evictable leaves by ``wa``;
- ``attach`` wraps that one cache's methods, on the instance (no class is patched):
  ``match_prefix`` with a request (prefix hits), ``insert`` (new nodes), ``_split_node``,
  ``_delete_leaf`` (evictions), ``evict`` (one pass: the clock, the pending policy),
  ``reset`` and ``_insert_cache`` (which request is being cached). Each wrapper calls
  SGLang's method first and only reads what it left. A hit's path and each new node also
  feed the order's superseded-branch rule (the document's ``supersede``): a request's
  first new node is where it parts from the path it hit. Its reports (hits, inserts, victims
  and a victim's id) are timed on a sample (``agent.engine_time``); the order's ranking,
  inside SGLang's own eviction loop, is not.

SGLang loads general plugins in each of its processes (``SGLANG_PLUGINS`` filters them);
registering a backend costs nothing, and the agent (threads, Redis connection) starts when
the scheduler builds its cache. Without ``KVWISE_ENABLE``, outside the tested SGLang
versions or if the surface it relies on is missing, the backend builds a stock
``RadixCache`` (SGLang's own ``--radix-eviction-policy``), with a warning. It must never
change what SGLang computes, only which cached leaf is evicted first.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import logging
import re
import time
from array import array
from collections.abc import Callable, Iterator
from typing import Any

from agent.integrations.engine_agent import (
    DEFAULT_CATEGORY,
    EngineAgent,
    read_engine_settings,
)
from agent.integrations.radix_order import RadixOrder, path_ids, prompt_block_hashes
from agent.policy_document import DEFAULT_FAMILY
from agent.settings import AgentSettings, agent_enabled, environment_value

# Under "sglang": SGLang configures that logger tree, so these lines show in its log.
log = logging.getLogger("sglang.kvwise")

BACKEND = "kvwise"
"""The ``--radix-cache-backend`` name the plugin registers."""
TESTED = ((0, 5, 23), (0, 5, 24))
"""SGLang versions the plugin installs itself in: ``[0.5.23, 0.5.24)`` (run on 0.5.23)."""
CACHE_SURFACE = (
    "match_prefix",
    "insert",
    "evict",
    "reset",
    "inc_lock_ref",
    "dec_lock_ref",
    "_split_node",
    "_delete_leaf",
    "_insert_cache",
)
INFER_BLOCK_TOKENS = 16
"""Tokens per block of the prompt hashes that category inference reads."""
_REPORTED_ATTR = "_kvwise_reported"
_STORED_ATTR = "_kvwise_stored"
"""Set on a request once it added a node (its later nodes do not part from its hits)."""


def version_ok(version: str) -> bool:
    """Whether ``version`` (e.g. ``0.5.23``, ``0.5.23.post1``) is in the tested range."""
    m = re.match(r"(\d+)\.(\d+)\.(\d+)", version)
    if m is None:
        return False
    v = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
    return TESTED[0] <= v < TESTED[1]


def _token_bytes(key: Any) -> bytes:
    """The tokens of a ``RadixKey`` as bytes (int64 each)."""
    tokens = key.raw_token_ids()
    if not isinstance(tokens, array) or tokens.typecode != "q":
        tokens = array("q", tokens)
    return tokens.tobytes()


def _namespace(key: Any) -> bytes:
    """The tree namespace of a key (LoRA name, cache salt): part of its content ids."""
    if key.extra_key is None and key.cache_salt is None:
        return b""
    return repr((key.extra_key, key.cache_salt)).encode()


class RadixHooks:
    """The agent side of one ``RadixCache``: wrappers on the instance, the side table's
    feed, and the category of each request. Scheduler thread only."""

    def __init__(
        self,
        cache: Any,
        engine: EngineAgent,
        order: RadixOrder,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.cache = cache
        self.engine = engine
        self.order = order
        self.clock = clock
        self.page_size = max(int(cache.page_size), 1)
        self.request: Any = None  # the request whose KV is being inserted
        self._victims: list[int] = []
        self._evicting = False

    def install(self) -> RadixHooks:
        """Make the order the cache's strategy and wrap the cache's methods (each wrapper
        takes its method's name and docstring)."""
        cache = self.cache
        cache.eviction_strategy = self.order
        for name, wrap in (
            ("match_prefix", self._wrap_match_prefix),
            ("insert", self._wrap_insert),
            ("evict", self._wrap_evict),
            ("reset", self._wrap_reset),
            ("_split_node", self._wrap_split_node),
            ("_delete_leaf", self._wrap_delete_leaf),
            ("_insert_cache", self._wrap_insert_cache),
        ):
            orig = getattr(cache, name)
            setattr(cache, name, functools.update_wrapper(wrap(orig), orig))
        return self

    # --- categories ----------------------------------------------------------------------
    @contextlib.contextmanager
    def serving(self, request: Any) -> Iterator[Any]:
        """Inserts inside this block are ``request``'s (what ``_insert_cache`` does)."""
        previous, self.request = self.request, request
        try:
            yield request
        finally:
            self.request = previous

    def category(self, request: Any) -> tuple[str, int]:
        """The request's ``(name, code)``: ``custom_params["kv_category"]``, else inferred
        from its prompt, else the default; worked out once and kept on the request."""
        if request is None:
            return self.engine.category(DEFAULT_CATEGORY, (), 0)
        return self.engine.request_category(request, "custom_params", _prompt)

    # --- reports -------------------------------------------------------------------------
    def _path(self, node: Any, end: int, stop: int) -> tuple[list[Any], list[int]]:
        """Nodes from the root's child down to ``node`` (which ends at token ``end``) that
        end past token ``stop``, with their first tokens, in prompt order."""
        root = self.cache.root_node
        nodes: list[Any] = []
        starts: list[int] = []
        while node is not root and node is not None and end > stop:
            end -= len(node.key)
            nodes.append(node)
            starts.append(end)
            node = node.parent
        nodes.reverse()
        starts.reverse()
        return nodes, starts

    def _ids(self, nodes: list[Any]) -> list[int]:
        """Content ids of ``nodes``, the last ones of a path from the root: known ones from
        the side table, else all computed from the tokens of that path."""
        marks = self.order.marks(nodes)
        known = [m.block for m in marks if m is not None and m.block]
        if len(known) == len(nodes):
            return known
        chain, _ = self._path(nodes[-1], 1 << 62, -1)
        tokens = [_token_bytes(n.key) for n in chain]
        return path_ids(_namespace(nodes[-1].key), tokens, last=len(nodes))

    def _id_of(self, node: Any) -> int:
        return self._ids([node])[0]

    def _hit(self, request: Any, last: Any, prefix_len: int) -> int:
        """A request's prefix matched ``prefix_len`` tokens: report the nodes it had not
        reported yet (a waiting request is matched again every scheduling round); how
        many."""
        reported = getattr(request, _REPORTED_ATTR, 0)
        if prefix_len <= reported:
            return 0
        name, code = self.engine.hit_category(*self.category(request))
        nodes, starts = self._path(last, prefix_len, reported)
        ids = self._ids(nodes)
        depths = [s // self.page_size for s in starts]
        mark = self.order.mark
        for node, depth, block in zip(nodes, depths, ids, strict=True):
            mark(node, code, depth, block)
        self.order.walked(nodes)
        self.engine.hit(ids, depths, self.clock(), name)
        with contextlib.suppress(AttributeError):
            setattr(request, _REPORTED_ATTR, prefix_len)
        return len(ids)

    def _inserted(self, node: Any, start: int) -> None:
        """``node`` (first token ``start``) was just added by the request being served."""
        name, code = self.category(self.request)
        block = self._id_of(node)
        depth = start // self.page_size
        codes = self.engine.cached([block], [depth], self.clock(), name)
        self.order.mark(node, code if codes is None else codes[0], depth, block)
        self.order.stored(node, self._first_store(self.request))

    @staticmethod
    def _first_store(request: Any) -> bool:
        """Whether this is ``request``'s first new node (where it parts from its hits);
        one inserted without a request stands alone."""
        if request is None or getattr(request, _STORED_ATTR, False):
            return request is None
        with contextlib.suppress(AttributeError):
            setattr(request, _STORED_ATTR, True)
        return True

    # --- wrappers ------------------------------------------------------------------------
    def _wrap_match_prefix(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        timing = self.engine.engine_time

        def match_prefix(params: Any) -> Any:
            self.engine.before_call()
            result = orig(params)
            if params.req is not None and result.device_prefix_len > 0:
                started = timing.begin()
                nodes = self._hit(params.req, result.last_device_node, result.device_prefix_len)
                if started:
                    timing.end(started, nodes)
            return result

        return match_prefix

    def _wrap_insert(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        timing = self.engine.engine_time

        def insert(params: Any) -> Any:
            result = orig(params)
            key = params.key
            if key is not None and len(key.page_aligned(self.page_size)) > result.prefix_len:
                started = timing.begin()
                self._inserted(result.last_device_node, result.prefix_len)
                if started:
                    timing.end(started, 1)
            return result

        return insert

    def _wrap_evict(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        timing = self.engine.engine_time

        def evict(params: Any) -> Any:
            self.engine.before_call()
            self.order.begin(time.monotonic())  # the clock of the tree's access times
            self._evicting = True
            try:
                return orig(params)
            finally:
                self._evicting = False
                started = timing.begin()
                victims = self._report_victims()
                if started:
                    timing.end(started, victims)

        return evict

    def _report_victims(self) -> int:
        """EVICT events for the leaves deleted since the last report; how many."""
        victims, self._victims = self._victims, []
        if victims:
            self.engine.evicted(victims, self.clock())
        return len(victims)

    def _wrap_delete_leaf(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        timing = self.engine.engine_time

        def _delete_leaf(node: Any) -> Any:
            started = timing.begin()
            block = self._id_of(node)  # before the tree forgets its place
            if started:
                timing.end(started, 1)
            result = orig(node)
            self.order.forget(node)
            self._victims.append(block)
            if not self._evicting:
                self._report_victims()
            return result

        return _delete_leaf

    def _wrap_split_node(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        def _split_node(key: Any, child: Any, split_len: int) -> Any:
            upper = orig(key, child, split_len)
            self.order.split(upper, child, split_len // self.page_size)
            return upper

        return _split_node

    def _wrap_reset(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        def reset(*args: Any, **kwargs: Any) -> Any:
            gone = self.order.blocks()
            result = orig(*args, **kwargs)
            self.order.clear()
            if gone:  # a flushed tree evicted everything it held
                self.engine.evicted(gone, self.clock())
            return result

        return reset

    def _wrap_insert_cache(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        def _insert_cache(req: Any, *args: Any, **kwargs: Any) -> Any:
            with self.serving(req):
                return orig(req, *args, **kwargs)

        return _insert_cache


class _State:
    """The plugin's process-wide state (one scheduler, one tree cache per process)."""

    settings: AgentSettings | None = None
    hooks: RadixHooks | None = None
    registered = False


_state = _State()


def register() -> None:
    """SGLang's plugin hook: register the ``kvwise`` radix-cache backend. Idempotent."""
    if _state.registered:
        return
    _state.registered = True
    try:
        from sglang.srt.mem_cache.registry import register_radix_cache_backend
    except ImportError as exc:
        log.warning("kvwise: this SGLang has no radix-cache registry (%s); not loaded", exc)
        return
    register_radix_cache_backend(BACKEND, build_cache)


def _gate() -> str | None:
    """Why kvwise must not install itself here (None: it may)."""
    import sglang
    from sglang.srt.mem_cache import radix_cache

    version = str(getattr(sglang, "__version__", "unknown"))
    if not version_ok(version):
        lo, hi = (".".join(map(str, v)) for v in TESTED)
        return f"SGLang {version} is outside the tested range {lo}-{hi}"
    cls = getattr(radix_cache, "RadixCache", None)
    missing = [m for m in CACHE_SURFACE if not hasattr(cls, m)]
    return f"RadixCache lacks {', '.join(missing)}" if missing else None


def build_cache(ctx: Any) -> Any:
    """The ``kvwise`` backend: SGLang's ``RadixCache`` for ``ctx.params``, with kvwise's
    order and agent when ``KVWISE_ENABLE`` is true (the stock tree otherwise)."""
    from sglang.srt.mem_cache.radix_cache import RadixCache

    cache = RadixCache(ctx.params)
    if not agent_enabled():
        log.info("kvwise: KVWISE_ENABLE is off; stock RadixCache (%s)", cache.eviction_policy)
        return cache
    settings = engine_settings()
    why = _gate()
    if why is not None:
        log.warning("kvwise: %s; keeping SGLang's own eviction (%s)", why, cache.eviction_policy)
        return cache
    if cache.disable:
        return cache
    attach(cache, settings)
    return cache


def engine_settings() -> AgentSettings:
    """The agent's settings in SGLang: the tree's order is ``wa``'s whatever
    ``KVWISE_EVICTOR`` says (said once if it says another), so the agent reports ``wa`` and
    follows the document's family, refusing a baseline it cannot run."""
    configured = environment_value("KVWISE_EVICTOR")
    if configured is not None and configured != DEFAULT_FAMILY:
        log.warning(
            "kvwise: KVWISE_EVICTOR=%s does not apply in SGLang: its radix tree runs %s's order",
            configured,
            DEFAULT_FAMILY,
        )
    return read_engine_settings(evictor=DEFAULT_FAMILY)


def attach(cache: Any, settings: AgentSettings) -> RadixHooks:
    """Install kvwise's order and agent into ``cache`` (a ``RadixCache``); start the agent."""
    if _state.hooks is not None:
        raise RuntimeError("kvwise is already attached to a radix cache in this process")
    order = RadixOrder()
    allocator = cache.token_to_kv_pool_allocator
    size = int(getattr(allocator, "size", 0) or 0)
    capacity = max(size // max(int(cache.page_size), 1), 1)
    # A radix node is a run of pages, reported at its first page: its events do not
    # rebuild into requests of whole blocks.
    engine = EngineAgent(
        settings,
        order,
        capacity=capacity,
        engine="sglang",
        whole_requests=False,
        supersedes_branches=True,
    )
    hooks = RadixHooks(cache, engine, order).install()
    _state.settings, _state.hooks = settings, hooks
    engine.start()
    atexit.register(engine.close)
    log.info(
        "kvwise: agent %s on a radix cache of %d pages (page %d), order %s",
        engine.agent.worker_id,
        capacity,
        cache.page_size,
        type(order).__name__,
    )
    return hooks


def attached() -> RadixHooks | None:
    """The hooks of the cache kvwise is attached to in this process, if any."""
    return _state.hooks


def detach() -> None:
    """Close the attached agent (tests; the process's exit does it otherwise)."""
    hooks, _state.hooks = _state.hooks, None
    if hooks is not None:
        hooks.engine.close()


def _prompt(request: Any, infer: bool) -> tuple[list[int], int]:
    """An SGLang request's block hashes (if ``infer``) and prompt tokens."""
    tokens = getattr(request, "origin_input_ids", None) or ()
    if not infer:
        return [], len(tokens)
    token_bytes = array("q", tokens).tobytes()
    return prompt_block_hashes(token_bytes, INFER_BLOCK_TOKENS * 8), len(tokens)

"""The agent inside an engine whose eviction order is kvwise's: ``EngineAgent``.

Owns the glue between the engine's own eviction path (vLLM: a ``KvwiseFreeQueue``, which
drives the evictor itself, by block id; SGLang: a radix tree ranking its leaves with a
``RadixOrder``) and the ``Agent`` facade (which keeps the access history, the events, the
hit counters, the subscriber and the heartbeat, by block hash). The facade's policy slot
holds an ``EngineOrder``: its ``touch``, ``free`` and ``evict`` do nothing (the engine
already told the order, and reports the victims it took through ``Agent.record_evicted``), and
``set_policy`` reaches the order, so a hot-reloaded document is swapped in, whole, on the
engine thread at the next ``before_call``. It also owns the request -> category step:
``kv_category`` from the request's extra arguments, else ``agent.category_inference``'s
inference, bounded by the agent's category table. And it owns ``RequestReport``: an engine
that learns a request's prefix hits and the blocks it stores at different moments (vLLM,
over one or several scheduling steps) reports them through one, which holds them until the
request's prompt is whole and then records them in one go, at one time: the request's HITs
in prompt order, then its INSERTs tail first, as a replayed request would make them. A
controller can then rebuild each request from the event stream (the shadow evaluation).
Made, it warns of each ``KVWISE_*`` variable of the engine's environment that nothing
reads (``agent.setting_names``): once per engine, where the agent starts, not in each
process the engine's plugin loads in. ``read_engine_settings`` is what a plugin reads its
settings with: what the agent would refuse only once the engine builds its cache (minutes
into its start, the model loaded) is refused there, naming its variable. It must never
import an engine or wait on I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from agent.category_inference import CategoryInferrer, InferSettings
from agent.category_table import reused_name
from agent.policies import UnknownPolicyError
from agent.policies.handover import NamesCategories, SwitchRefused
from agent.policy_document import PolicyDocument
from agent.runtime.agent import Agent, set_parameters
from agent.runtime.connection import RedisUrlError, connect
from agent.runtime.family import configured_family
from agent.setting_names import warn_of_unread_variables
from agent.settings import AgentSettings, bad_agent_setting, read_agent_settings
from agent.wire import MAX_CATEGORY_NAME_CHARS

DEFAULT_CATEGORY = "default"
"""Category of requests that name none when inference is off."""
CATEGORY_KEY = "kv_category"
"""Key of the category in a request's extra arguments (vLLM: OpenAI ``vllm_xargs``; SGLang:
``custom_params``)."""
REQUEST_CATEGORY_ATTR = "_kvwise_category"
"""Attribute where a request keeps its ``(name, code)`` once worked out."""
REQUEST_REPORT_ATTR = "_kvwise_report"
"""Attribute where a request keeps its ``RequestReport``."""
BuildFamily = Callable[[str], "EngineEvictor"]
"""A fresh evictor of the family named."""
FollowDocument = Callable[[PolicyDocument], None]
"""Reads, on the engine thread, each document put in force, after the evictor took it
(vLLM: the free queue's ``supersede`` rule)."""
InstallEvictor = Callable[[Any], None]
"""Hands every block of the engine's order over to a fresh evictor and drives it from
then on (vLLM: ``KvwiseFreeQueue.switch_evictor``)."""
PromptOf = Callable[[Any, bool], tuple[Sequence[int], int]]
"""An engine's reading of a request's prompt: called with the request and whether its
category is to be inferred, it gives the prompt's block hashes (empty when not) and its
token count."""


def read_engine_settings(**fixed: str) -> AgentSettings:
    """``read_agent_settings``, with the values in ``fixed`` (an engine whose order is
    fixed: SGLang's is ``wa``'s), and the evictor and the Redis URL checked as the agent
    checks them when it is made: an unknown ``KVWISE_EVICTOR`` or a ``KVWISE_REDIS_URL``
    that is not a Redis URL stops the engine as it loads the plugin, one line naming the
    variable, not minutes later in the engine's cache build. Nothing is connected."""
    settings = read_agent_settings().model_copy(update=fixed)
    try:
        configured_family(settings)
    except UnknownPolicyError as exc:
        raise bad_agent_setting("evictor", str(exc)) from None
    try:
        url, timeout_s = settings.redis_url, settings.redis_timeout_s
        connect(url, timeout_s=timeout_s, retries=0, cluster=settings.redis_cluster).close()
    except RedisUrlError as exc:
        raise bad_agent_setting("redis_url", str(exc)) from None
    return settings


@dataclass(slots=True)
class RequestReport:
    """One request's hits and stored blocks, held until its prompt's blocks are all known.

    ``at`` is when the request first reported (its events all carry that time) and
    ``prompt_blocks`` how many whole blocks its prompt has; blocks past them (filled while
    it decodes) are not held but recorded as they come.
    """

    at: float
    name: str
    prompt_blocks: int
    code: int = 0
    """The evictor code its stored blocks are filed under (its category's; with reuse
    classes, a stored block that returns is filed under the class's code instead)."""
    hit_code: int = 0
    """The evictor code the blocks it finds cached are filed under (``hit_category``)."""
    hit_hashes: list[int] = field(default_factory=list)
    hit_offsets: list[int] = field(default_factory=list)
    stored_hashes: list[int] = field(default_factory=list)
    stored_offsets: list[int] = field(default_factory=list)
    recorded: bool = False
    """Whether its held blocks went to the agent (afterwards it holds nothing)."""
    stored_any: bool = False
    """Whether it stored a block yet: its first store leaves its prefix hits, where a
    branch it supersedes is looked for (``KvwiseFreeQueue.note_stored``'s ``parting``)."""
    waiting: bool = False
    """Whole, but waiting for another request that still holds blocks it hit."""
    holder: RequestReport | None = None
    """The request it waits for (while ``waiting``)."""
    waiters: list[RequestReport] = field(default_factory=list)
    """Requests recorded right after this one (each hit a block it holds)."""

    @property
    def whole(self) -> bool:
        """Whether every block of the prompt has been reported."""
        return len(self.hit_hashes) + len(self.stored_hashes) >= self.prompt_blocks


class EngineEvictor(Protocol):
    """What ``EngineOrder`` needs of the order the engine drives: its size. An evictor
    (``agent.policies``) or a tree strategy (``radix_order``); either may also take
    ``set_policy`` and ``add_category``."""

    def __len__(self) -> int: ...


class EngineOrder:
    """The ``Agent``'s view of a policy that the engine drives directly (vLLM's free queue,
    SGLang's radix tree)."""

    def __init__(self, evictor: EngineEvictor) -> None:
        self.evictor = evictor
        self.codes: dict[str, int] = {}
        self._build: BuildFamily | None = None
        self._install: InstallEvictor | None = None
        self._follow: FollowDocument | None = None

    def add_follower(self, follow: FollowDocument) -> None:
        """Let the engine's own order read each document put in force (``follow``)."""
        self._follow = follow

    def enable_switch(self, build: BuildFamily, install: InstallEvictor) -> None:
        """Let a document's evictor family replace the engine's evictor (``switch_family``)."""
        self._build, self._install = build, install

    def switch_family(self, doc: PolicyDocument) -> None:
        """A fresh evictor of ``doc``'s family takes ``doc`` and the categories in code
        order (so the codes the engine's side table holds stay valid), and only then is
        installed, taking over every block: a refusal comes before any block moved."""
        if self._build is None or self._install is None:
            raise SwitchRefused("this engine's order cannot switch evictor family")
        new = self._build(doc.evictor)
        set_parameters(new, doc)
        if isinstance(new, NamesCategories):
            for name, code in sorted(self.codes.items(), key=lambda item: item[1]):
                if new.add_category(name) != code:
                    raise SwitchRefused(f"category {name!r} would change code")
        self._install(new)
        self.evictor = new
        if self._follow is not None:
            self._follow(doc)

    def touch(self, blocks: Sequence[int], now: float) -> None:
        """Already applied by the queue (by block id)."""

    def free(
        self, blocks: Sequence[int], offsets: Sequence[int], now: float, category: int
    ) -> None:
        """Already applied by the queue (by block id)."""

    def evict(self, n: int) -> list[int]:
        """Nothing to give: the engine takes its victims itself (``EngineAgent.evicted``)."""
        return []

    def set_policy(self, doc: PolicyDocument) -> None:
        set_parameters(self.evictor, doc)
        if self._follow is not None:
            self._follow(doc)

    def add_category(self, name: str) -> int:
        evictor = self.evictor
        code = (
            evictor.add_category(name) if isinstance(evictor, NamesCategories) else len(self.codes)
        )
        self.codes[name] = code
        return code

    def __len__(self) -> int:
        return len(self.evictor)

    def __contains__(self, block: object) -> bool:
        return False  # hashes are not the evictor's ids; nothing asks


class EngineAgent:
    """The queue hooks (``before_call``, ``evicted``) plus the cache and hit reports."""

    def __init__(
        self,
        settings: AgentSettings,
        evictor: EngineEvictor,
        *,
        capacity: int,
        engine: str,
        infer: bool = True,
        block_tokens: int = 16,
        whole_requests: bool = True,
        supersedes_branches: bool = False,
    ) -> None:
        """``block_tokens``: tokens per block hash of the engine (vLLM's hash block size,
        its ``--block-size``), which category inference counts new tokens in.
        ``whole_requests``: whether the engine reports each request whole (through
        ``RequestReport``s, or hits and stores at one time); ``supersedes_branches``:
        whether its eviction runs the document's ``supersede`` rule; both said in the
        heartbeat."""
        warn_of_unread_variables()  # the plugin read ``settings`` from this environment
        self.order = EngineOrder(evictor)
        self.agent = Agent(
            settings,
            capacity=capacity,
            engine=engine,
            policy=self.order,
            whole_requests=whole_requests,
            supersedes_branches=supersedes_branches,
        )
        self.before_call = self.agent.apply_pending
        self.evicted = self.agent.record_evicted
        self.engine_time = self.agent.engine_time
        """The agent's meter: the integration times the engine's calls into kvwise with it
        (around the whole of kvwise's work in each), so the agent's ``record_*`` calls
        inside them are untimed."""
        self.files_returns = settings.reuse_classes
        """Whether stored blocks may be returns filed under another code (``stored_codes``)."""
        self.block_tokens = block_tokens
        self._open: dict[int, RequestReport] = {}
        """Reports held on requests and not yet recorded, by ``id``: a handful at most
        (requests mid-prefill), so a hit is matched against them only when recorded."""
        self._names: dict[str, tuple[str, int]] = {}
        self._inferrer: CategoryInferrer | None = None
        if infer:
            self._inferrer = CategoryInferrer(InferSettings(block_tokens=block_tokens))

    @property
    def infers(self) -> bool:
        """Whether unnamed requests get an inferred category (which needs their hashes)."""
        return self._inferrer is not None

    # --- queue hooks (engine thread) -----------------------------------------------------
    # ``before_call`` and ``evicted`` are the agent's own bound methods (set in __init__),
    # untimed (the queue times the call they are made in):
    # the queue calls them once or twice per allocation, so no forwarding call between.
    before_call: Callable[[], object]
    evicted: Callable[[list[int], float], None]

    # --- reports from the engine's cache paths ------------------------------------------
    def category(self, explicit: object, hashes: Sequence[int], n_tokens: int) -> tuple[str, int]:
        """``(name, evictor code)`` of a request: its explicit category, else the inferred
        one, else the default. Names beyond the agent's table share ``other``."""
        if isinstance(explicit, str) and explicit:
            name = explicit
        elif self._inferrer is not None:
            name = self._inferrer.infer(hashes, n_tokens)
        else:
            name = DEFAULT_CATEGORY
        got = self._names.get(name)
        if got is None:
            table = self.agent.categories
            folded = table.name(table.code(name))  # registers it with the evictor too
            got = (folded, self.order.codes[folded])
            # Bounded in count and in size: a client's long names (folded to ``other``)
            # are looked up again rather than kept.
            if len(self._names) < 4 * table.max_size and len(name) <= MAX_CATEGORY_NAME_CHARS:
                self._names[name] = got
        return got

    def hit_category(self, name: str, code: int) -> tuple[str, int]:
        """``(name, evictor code)`` under which a request of category ``name`` (``code``)
        reports and files the blocks it found cached: its reuse class with reuse classes
        on (``AgentSettings.reuse_classes``), else the category itself."""
        if not self.agent.settings.reuse_classes:
            return name, code
        return self.category(reused_name(name), (), 0)

    def stored_codes(self, hashes: list[int], name: str, code: int) -> list[int] | None:
        """With reuse classes, the evictor code each stored block is to be filed under, known
        before its INSERT is recorded: a block evicted lately is a return (``name``'s reuse
        class); else ``None`` (all are ``code``). The recording decides the same way."""
        returns = self.agent.returns_ahead(hashes)
        if returns is None:
            return None
        again = self.hit_category(name, code)[1]
        return [again if back else code for back in returns]

    def request_category(
        self, request: Any, params_field: str, prompt: PromptOf
    ) -> tuple[str, int]:
        """``category`` of an engine's request, worked out once and kept on the request:
        explicit is ``sampling_params.<params_field>["kv_category"]``."""
        got: tuple[str, int] | None = getattr(request, REQUEST_CATEGORY_ATTR, None)
        if got is not None:
            return got
        params = getattr(request, "sampling_params", None)
        extras = getattr(params, params_field, None) or {}
        explicit = extras.get(CATEGORY_KEY) if isinstance(extras, dict) else None
        hashes, n_tokens = prompt(request, not explicit and self.infers)
        got = self.category(explicit, hashes, n_tokens)
        try:  # not contextlib.suppress: a try costs nothing unless it catches
            setattr(request, REQUEST_CATEGORY_ATTR, got)
        except AttributeError:
            return got  # no __dict__: recomputed each time
        return got

    def cached(
        self, hashes: list[int], offsets: Sequence[int], now: float, name: str
    ) -> list[int] | None:
        """A request's blocks were computed and stored (INSERT events, accesses). With
        reuse classes: each block's evictor code (blocks evicted lately and stored again
        are returns, of ``name``'s reuse class), for the engine to file them under; else
        ``None`` (all are ``name``'s)."""
        return self.agent.record_free(hashes, offsets, now, name) if hashes else None

    def hit(self, hashes: list[int], offsets: list[int], now: float, name: str) -> None:
        """A request reuses cached blocks (HIT events, hits and accesses)."""
        if hashes:
            self.agent.record_touch(hashes, now, name, offsets=offsets)
            self.agent.record_free(hashes, offsets, now, name)

    # --- reports held per request ------------------------------------------------------
    def report_of(
        self, request: Any, name: str, prompt_tokens: int, now: float, code: int = 0
    ) -> RequestReport:
        """The ``RequestReport`` kept on ``request``, begun at ``now`` if it has none (an
        object without attributes gets a fresh one each time: its blocks go out at once).
        ``code`` is ``name``'s evictor code (``category``)."""
        report: RequestReport | None = getattr(request, REQUEST_REPORT_ATTR, None)
        if report is None:
            prompt_blocks = prompt_tokens // max(self.block_tokens, 1)
            hit_code = self.hit_category(name, code)[1]
            report = RequestReport(now, name, prompt_blocks, code, hit_code)
            try:
                setattr(request, REQUEST_REPORT_ATTR, report)
            except AttributeError:
                report.recorded = True  # nowhere to hold it: nothing is held
            else:
                self._open[id(report)] = report
        return report

    def hold_hits(self, report: RequestReport, hashes: list[int], offsets: list[int]) -> None:
        """The request reuses cached blocks: held until its prompt is whole."""
        if report.recorded:
            self.hit(hashes, offsets, report.at, report.name)
            return
        report.hit_hashes += hashes
        report.hit_offsets += offsets

    def hold_stored(
        self, report: RequestReport, hashes: list[int], offsets: Sequence[int], now: float
    ) -> None:
        """The request stored blocks: prompt blocks are held, later ones recorded now."""
        held = 0 if report.recorded else len(hashes)
        while held and offsets[held - 1] >= report.prompt_blocks:
            held -= 1
        report.stored_hashes += hashes[:held]
        report.stored_offsets += offsets[:held]
        if held < len(hashes):
            self.cached(hashes[held:], offsets[held:], now, report.name)

    def record(self, report: RequestReport) -> None:
        """Record what ``report`` holds, at its time: HITs, then INSERTs tail first. A
        request that hit blocks another still holds waits for that one (chunked prefill:
        its HITs must not come before their INSERTs); requests waiting for this one
        follow it."""
        if report.recorded or report.waiting:
            return
        holder = self._holder_of(report)
        if holder is not None:
            report.waiting, report.holder = True, holder
            holder.waiters.append(report)
            return
        self._record_unwaited(report)

    def record_done(self, report: RequestReport) -> None:
        """The request is done (finished, aborted or preempted): record what it holds now.
        The blocks it stored may be evicted from now on, and an eviction must never come
        before the insertion it ends: the requests it waits for (or would) are recorded
        first, as far as they got."""
        while not report.recorded:
            first, seen = report, {id(report)}
            while True:
                ahead = first.holder if first.waiting else self._holder_of(first)
                if ahead is None or id(ahead) in seen:
                    break
                first = ahead
                seen.add(id(first))
            self._record_unwaited(first)

    def record_holders(self, hash_: int) -> None:
        """Record now, as ``record_done`` would, every request still holding an INSERT or a
        HIT of ``hash_``: its content is about to be reported evicted while requests are
        still on it (a block written over in place), and an eviction must never come
        before the events it ends. Rare, so the open reports are searched."""
        holders = [r for r in self._open.values() if hash_ in (*r.stored_hashes, *r.hit_hashes)]
        for report in holders:
            self.record_done(report)

    def _record_unwaited(self, report: RequestReport) -> None:
        """Record ``report`` now, then the requests waiting for it."""
        report.recorded, report.waiting = True, False
        self._open.pop(id(report), None)
        self._record_now(report)
        waiters, report.waiters = report.waiters, []
        for waiter in waiters:
            waiter.waiting = False
            self.record(waiter)

    def _holder_of(self, report: RequestReport) -> RequestReport | None:
        """Another request, not yet recorded nor itself waiting (no cycle can form), that
        holds a block ``report`` hit. The common case costs nothing: no other report is
        open when a prompt is stored in one step."""
        if len(self._open) < 2 or not report.hit_hashes:
            return None
        hits: set[int] | None = None
        for other in self._open.values():
            if other is report or other.waiting or not other.stored_hashes:
                continue
            hits = hits or set(report.hit_hashes)
            if not hits.isdisjoint(other.stored_hashes):
                return other
        return None

    def _record_now(self, report: RequestReport) -> None:
        """Send what ``report`` held to the agent."""
        hashes, offsets = report.hit_hashes, report.hit_offsets
        if self.files_returns:  # a block's class depends on the calls before it: as they come
            self.hit(hashes, offsets, report.at, report.name)
            hashes, offsets = [], []
        elif hashes:
            self.agent.record_touch(hashes, report.at, report.name, offsets=offsets)
        # One FREE call for the hits and the stored blocks (the same events as two).
        hashes = hashes + report.stored_hashes[::-1]
        self.cached(hashes, offsets + report.stored_offsets[::-1], report.at, report.name)
        report.hit_hashes, report.hit_offsets = [], []
        report.stored_hashes, report.stored_offsets = [], []

    def start(self) -> EngineAgent:
        self.agent.start()
        return self

    def close(self) -> None:
        self.agent.close()

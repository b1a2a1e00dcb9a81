"""The wire contract between agents and the controller: key names, event batches, policy
documents and heartbeats, with their encoders and validating decoders.

Owns every Redis key and channel name (``Keys``), the columnar ``EventBatch`` and its
stream-entry encoding, the JSON form of a ``PolicyDocument`` and the ``AgentStatus``
heartbeat. Both sides import this one module; a breaking change bumps
``WIRE_SCHEMA_VERSION``. It must never do I/O, import anything heavier than numpy and
pydantic, or build one Python object per event.

An event batch is one stream entry whose fields are:

=====  ===============================================================
``v``  schema version (decimal)
``w``  worker id
``e``  epoch: random id of this agent start (a restart is not a gap)
``s``  sequence number of the batch within the epoch, from 1
``c``  JSON list of the category names the ``category`` columns index
``n``  number of events
``d``  the seven columns, little-endian, concatenated in ``COLUMNS`` order
=====  ===============================================================
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from enum import IntEnum
from typing import Any, ClassVar, Final, Self, overload

import numpy as np
from numpy.typing import NDArray
from pydantic import ConfigDict, ValidationError

from agent.engine_time import EngineTimeSnapshot
from agent.policy_document import (
    DEFAULT_FAMILY,
    DEFAULT_SUPERSEDE,
    PolicyDocument,
    json_shape_fault,
)
from agent.policy_document import SCHEMA_VERSION as POLICY_SCHEMA_VERSION

WIRE_SCHEMA_VERSION: Final = 2
"""2: keys carry Redis Cluster hash tags (see ``Keys``). 1: untagged keys."""


class WireError(ValueError):
    """A message that does not follow this contract; ``reason`` names the bad field."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _Key:
    """A ``Keys`` attribute that takes no argument: the prefix followed by ``suffix``,
    read as a ``str`` on an instance."""

    def __init__(self, suffix: str) -> None:
        self.suffix = suffix

    @overload
    def __get__(self, keys: None, owner: type[Keys]) -> _Key: ...
    @overload
    def __get__(self, keys: Keys, owner: type[Keys]) -> str: ...
    def __get__(self, keys: Keys | None, owner: type[Keys]) -> _Key | str:
        return self if keys is None else keys.prefix + self.suffix


@dataclass(frozen=True)
class Keys:
    """Every Redis key and channel kvwise uses, under one prefix.

    Keys carry Redis Cluster hash tags (the part in braces picks the shard): each worker's
    keys share the tag ``{worker}``, so its stream, heartbeat and the controller's state of
    it live on one shard while workers spread across shards; every policy key shares the
    tag ``{policy}``, so a publication is one transaction on one shard. The channel is not a
    key (a cluster broadcasts classic pub/sub to every node). Schema 1 had no tags.
    """

    prefix: str = "kvwise:"

    def __post_init__(self) -> None:
        if "{" in self.prefix or "}" in self.prefix:
            raise WireError(f"key prefix {self.prefix!r} must not contain braces (hash tags)")

    # --- per worker: tag {worker} ----------------------------------------------------------
    def events_stream(self, worker: str) -> str:
        """Stream of one worker's event batches."""
        return f"{self.prefix}events:{{{worker}}}"

    events_match = _Key("events:*")
    """SCAN pattern matching every worker's event stream (also schema 1's, untagged, so
    that the controller can tell an old agent what is wrong)."""

    def worker_of(self, stream: str | bytes) -> str:
        """The worker id of an ``events_stream`` key (inverse of ``events_stream``)."""
        key = _text(stream, "stream key")  # a WireError for bytes that are not UTF-8
        head = f"{self.prefix}events:"
        if not (key.startswith(head + "{") and key.endswith("}")):
            raise WireError(f"stream key {key!r} is not {head}{{worker}}")
        return key[len(head) + 1 : -1]

    def agent(self, worker: str) -> str:
        """One agent's heartbeat (``AgentStatus`` JSON, expires after its TTL)."""
        return f"{self.prefix}agent:{{{worker}}}"

    agents_match = _Key("agent:*")
    """SCAN pattern matching every agent heartbeat."""

    def ingest_state(self, worker: str) -> str:
        """The controller's record of one worker: sequence floors per epoch, counts."""
        return f"{self.prefix}ingest:{{{worker}}}"

    def instances(self, worker: str) -> str:
        """Hash of the agent processes beating under one worker id: field its epoch, value
        its ``AgentInstance``; expires with the heartbeat."""
        return f"{self.prefix}instances:{{{worker}}}"

    # --- policy: tag {policy} --------------------------------------------------------------
    policy_current = _Key("{policy}:current")
    """The current policy version, as a decimal string: the only mutable pointer."""

    def policy_doc(self, version: int) -> str:
        """The immutable JSON document of one policy version."""
        return f"{self.prefix}{{policy}}:v:{version}"

    policy_versions = _Key("{policy}:versions")
    """Sorted set of published versions (score = version)."""
    overrides = _Key("{policy}:overrides")
    """Hash of operator overrides of per-category parameters."""
    policy_base = _Key("{policy}:base")
    """The parameters of the last fit (or rollback), before overrides."""
    evictor_pin = _Key("{policy}:evictor")
    """The evictor family an operator pinned (absent: the controller selects it)."""
    policy_hold = _Key("{policy}:hold")
    """Present while automatic refits are held back after a rollback."""
    policy_channel = _Key("policy:notify")
    """Pub/sub channel; each message is a new version number (a hint, not a promise)."""
    schema1_policy_current = _Key("policy:current")
    """Where a schema-1 controller kept ``current``: only to say what is wrong."""

    # --- the controller's own --------------------------------------------------------------
    dead_letter = _Key("deadletter")
    """Stream of refused entries: reason, source ids and a bounded payload prefix."""
    leader = _Key("leader")
    """Lock held by the controller replica that refits and publishes."""
    checkpoint = _Key("checkpoint")
    """The leader's last checkpoint of its statistics window."""
    recording = _Key("recording")
    """Present (with a short TTL its owner renews) while ``kvwise trace record`` reads the
    event streams: ingest then trims acknowledged entries only once they are the
    controller's ``stream_trim_grace_s`` old, so the recording reads them too."""

    def probe(self, controller: str) -> str:
        """A small expiring key each controller writes to learn whether Redis takes writes;
        on the policy keys' shard, where the API's reads and writes go."""
        return f"{self.prefix}{{policy}}:probe:{controller}"


class EventKind(IntEnum):
    """What happened to a block."""

    HIT = 0
    INSERT = 1
    EVICT = 2


COLUMNS: Final[tuple[tuple[str, np.dtype[Any]], ...]] = (
    ("ts", np.dtype("<f8")),
    ("block", np.dtype("<i8")),
    ("category", np.dtype("<i4")),
    ("offset", np.dtype("<i4")),
    ("kind", np.dtype("u1")),
    ("prev_ts", np.dtype("<f8")),
    ("prev_category", np.dtype("<i4")),
)
"""Wire order and dtype of the event columns."""

ROW_BYTES: Final = sum(dt.itemsize for _, dt in COLUMNS)
"""Bytes per event in field ``d`` (37)."""

_FIELDS: Final = ("v", "w", "e", "s", "c", "n", "d")
MAX_WIRE_INT: Final = 2**63 - 1
"""The largest integer a message carries (a batch's numbers, a heartbeat's counts and
versions): a signed 64-bit one, as the controller's gauges and Redis take; a larger one is
refused."""
_DECIMAL: Final = re.compile(rf"-?[0-9]{{1,{len(str(MAX_WIRE_INT))}}}")


RAW_COLUMNS: Final = COLUMNS[:5]
"""The columns an engine thread records; the last two are resolved later (agent.history)."""


@dataclass(frozen=True, eq=False)
class RawEvents:
    """Block events, columnar: element ``i`` of every column is one event. The one
    event-columns type: ``Events`` and ``EventBatch`` extend it, and ``rows`` and the length
    check are written here once for all three. As recorded (``RAW_COLUMNS``): ``kind`` may
    still be a raw FREE that ``agent.history`` resolves."""

    columns: ClassVar[tuple[str, ...]] = tuple(name for name, _ in RAW_COLUMNS)

    ts: NDArray[np.float64]
    block: NDArray[np.int64]
    category: NDArray[np.int32]
    offset: NDArray[np.int32]
    kind: NDArray[np.uint8]

    def __post_init__(self) -> None:
        n = len(self.ts)
        for name in self.columns:
            if len(getattr(self, name)) != n:
                raise ValueError(f"column {name} has {len(getattr(self, name))} rows, not {n}")

    def __len__(self) -> int:
        return len(self.ts)

    def rows(self, lo: int, hi: int) -> Self:
        """Rows ``lo:hi`` of every column (views, no copy); everything else is kept."""
        return replace(self, **{name: getattr(self, name)[lo:hi] for name in self.columns})

    def where(self, keep: NDArray[np.bool_]) -> Self:
        """The rows where ``keep`` is true (new arrays); everything else is kept."""
        return replace(self, **{name: getattr(self, name)[keep] for name in self.columns})


@dataclass(frozen=True, eq=False)
class Events(RawEvents):
    """Resolved events: the wire's seven ``COLUMNS``. ``prev_category`` is ``-1`` and
    ``prev_ts`` NaN when the agent does not know the block's previous access."""

    columns: ClassVar[tuple[str, ...]] = tuple(name for name, _ in COLUMNS)

    prev_ts: NDArray[np.float64]
    prev_category: NDArray[np.int32]


@dataclass(frozen=True, eq=False, kw_only=True)
class EventBatch(Events):
    """One stream entry: a worker's resolved events, whose ``category`` and
    ``prev_category`` index ``categories``."""

    worker: str
    seq: int
    epoch: str
    categories: tuple[str, ...]

    @classmethod
    def of(
        cls, events: Events, *, worker: str, seq: int, epoch: str, categories: tuple[str, ...]
    ) -> EventBatch:
        """``events`` as batch ``seq`` of ``worker``'s ``epoch``."""
        cols = {name: getattr(events, name) for name in Events.columns}
        return cls(worker=worker, seq=seq, epoch=epoch, categories=categories, **cols)


def encode_batch(batch: EventBatch) -> dict[str, bytes]:
    """The stream-entry fields of ``batch`` (``XADD key * **fields``)."""
    data = b"".join(
        np.ascontiguousarray(getattr(batch, name), dtype=dt).tobytes() for name, dt in COLUMNS
    )
    return {
        "v": str(WIRE_SCHEMA_VERSION).encode(),
        "w": batch.worker.encode(),
        "e": batch.epoch.encode(),
        "s": str(batch.seq).encode(),
        "c": json.dumps(list(batch.categories)).encode(),
        "n": str(len(batch)).encode(),
        "d": data,
    }


MAX_CATEGORY_NAME_CHARS: Final = 128
"""Longest category name an agent sends (longer ones share ``other`` there), the controller
accepts in a batch and a policy document may name (``decode_policy``)."""


@dataclass(frozen=True)
class BatchLimits:
    """What a decoder accepts in one stream entry: over a limit is ``WireLimitError``.

    Its defaults are the settings' defaults on both ends: the controller's
    ``ingest_max_events`` and ``max_categories_per_worker``, an agent's
    ``max_tracked_categories``
    (an agent never names more categories than the controller takes from it)."""

    max_events: int = 65_536
    max_categories: int = 1024
    max_name_chars: int = MAX_CATEGORY_NAME_CHARS

    @property
    def max_categories_bytes(self) -> int:
        """Longest ``c`` field within the limits (every character escaped, as JSON may)."""
        return 2 + self.max_categories * (12 * self.max_name_chars + 4)

    @property
    def max_entry_bytes(self) -> int:
        """Largest entry (field names and values) that can be within the limits."""
        return self.max_events * ROW_BYTES + self.max_categories_bytes + 4096


class WireLimitError(WireError):
    """A well-formed message over a ``BatchLimits`` bound."""


MAX_EPOCH_CHARS: Final = 64
"""Longest epoch (``e``) a batch may carry, in visible ASCII characters: an agent's is 16
hex characters. The controller keeps the last few epochs of each worker in its ledger,
sized by this bound (``controlplane.service.ledger``)."""
_EPOCH: Final = re.compile(rf"[\x21-\x7e]{{1,{MAX_EPOCH_CHARS}}}")


def decode_batch(
    fields: Mapping[bytes, bytes] | Mapping[str, bytes] | Mapping[str, str],
    limits: BatchLimits | None = None,
) -> EventBatch:
    """An ``EventBatch`` from stream-entry fields (bytes or str keys and values).

    Raises ``WireError`` naming the field for anything that breaks the contract, whatever
    the bytes (bad UTF-8, nesting too deep, ...), and ``WireLimitError`` for an entry over
    ``limits`` (checked before anything large is parsed). Nothing else escapes.
    """
    limits = limits or BatchLimits()
    raw = {_text(k, "field name"): v for k, v in fields.items()}
    # The schema first: another schema's entry may lack a field of this one.
    if "v" in raw and (v := _int_field(raw, "v")) != WIRE_SCHEMA_VERSION:
        raise WireError(_other_schema(v))
    missing = [f for f in _FIELDS if f not in raw]
    if missing:
        raise WireError(f"missing field {missing[0]!r}")
    seq = _int_field(raw, "s")
    if seq < 1:
        raise WireError(f"s: sequence number {seq} < 1")
    n = _int_field(raw, "n")
    if n < 0:
        raise WireError(f"n: negative count {n}")
    if n > limits.max_events:
        raise WireLimitError(f"n: {n} events in one entry > limit {limits.max_events}")
    categories = _categories(raw["c"], limits)
    data = _data(raw["d"])
    if len(data) != n * ROW_BYTES:
        raise WireError(f"d: {len(data)} bytes, expected n * {ROW_BYTES} = {n * ROW_BYTES}")
    cols: dict[str, NDArray[Any]] = {}
    pos = 0
    for name, dt in COLUMNS:
        # astype copies: aligned, native-endian, writable arrays for the consumer.
        cols[name] = np.frombuffer(data, dtype=dt, count=n, offset=pos).astype(dt.newbyteorder("="))
        pos += n * dt.itemsize
    _check_columns(cols, len(categories))
    return EventBatch(
        worker=_text(raw["w"], "w"),
        seq=seq,
        epoch=_epoch(raw["e"]),
        categories=categories,
        **cols,
    )


def _other_schema(version: object) -> str:
    return (
        f"v: the sender speaks wire schema {version!r}, this side {WIRE_SCHEMA_VERSION}: "
        "run the same kvwise release on agents and controller"
    )


def _text(value: bytes | str, name: str) -> str:
    if isinstance(value, str):
        return value
    try:
        return value.decode()
    except UnicodeDecodeError:
        raise WireError(f"{name}: not UTF-8 ({value[:40]!r})") from None


def _epoch(value: bytes | str) -> str:
    text = _text(value, "e")
    if len(text) > MAX_EPOCH_CHARS:
        raise WireLimitError(f"e: an epoch of {len(text)} characters > limit {MAX_EPOCH_CHARS}")
    if _EPOCH.fullmatch(text) is None:
        raise WireError(f"e: {text!r} is not 1 to {MAX_EPOCH_CHARS} visible ASCII characters")
    return text


def _data(value: bytes | str) -> bytes:
    if isinstance(value, bytes):
        return value
    try:
        return value.encode("latin-1")  # a str holding bytes one to one
    except UnicodeEncodeError:
        raise WireError("d: a str field with characters beyond one byte") from None


def _int_field(raw: Mapping[str, bytes | str], name: str) -> int:
    text = _text(raw[name], name)
    # int() also takes "1_0", " 1" and non-ASCII digits; the wire allows plain decimals.
    if _DECIMAL.fullmatch(text) is None:
        raise WireError(f"{name}: {text[:40]!r} is not an integer")
    value = int(text)
    if abs(value) > MAX_WIRE_INT:
        raise WireError(f"{name}: {text} is past the limit {MAX_WIRE_INT}")
    return value


def _categories(value: bytes | str, limits: BatchLimits) -> tuple[str, ...]:
    if len(value) > limits.max_categories_bytes:
        raise WireLimitError(
            f"c: {len(value)} bytes > limit {limits.max_categories_bytes} "
            f"({limits.max_categories} names of {limits.max_name_chars} characters)"
        )
    try:
        names = json.loads(value)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise WireError(f"c: not JSON ({type(exc).__name__}: {str(exc)[:80]})") from None
    if not isinstance(names, list) or not all(isinstance(c, str) for c in names):
        raise WireError("c: not a JSON list of strings")
    if len(names) > limits.max_categories:
        raise WireLimitError(f"c: {len(names)} category names > limit {limits.max_categories}")
    longest = max(map(len, names), default=0)
    if longest > limits.max_name_chars:
        raise WireLimitError(
            f"c: a category name of {longest} characters > limit {limits.max_name_chars}"
        )
    return tuple(names)


def _check_columns(cols: Mapping[str, NDArray[Any]], k: int) -> None:
    if len(cols["ts"]) == 0:
        return
    cat, prev_cat = cols["category"], cols["prev_category"]
    if int(cat.min()) < 0 or int(cat.max()) >= k:
        raise WireError(f"category: index out of range [0, {k})")
    if int(prev_cat.min()) < -1 or int(prev_cat.max()) >= k:
        raise WireError(f"prev_category: index out of range [-1, {k})")
    if not bool(np.isfinite(cols["ts"]).all()):
        raise WireError("ts: non-finite timestamp")
    if bool(np.isinf(cols["prev_ts"]).any()):
        raise WireError("prev_ts: infinite timestamp (NaN means unknown)")
    if int(cols["kind"].max()) > max(EventKind):
        raise WireError(f"kind: unknown event kind {int(cols['kind'].max())}")


def encode_policy(doc: PolicyDocument) -> bytes:
    """The JSON document stored under ``Keys.policy_doc(doc.version)``. The evictor family
    and the supersede rule are written only when not at their defaults (``wa``, and
    ``DEFAULT_SUPERSEDE``): an agent that predates a field (``extra="forbid"``) reads
    every document at its default as before and rejects, keeping its last good one, only
    a document that asks what it could not run."""
    left_out = set()
    if doc.evictor == DEFAULT_FAMILY:
        left_out.add("evictor")
    if doc.supersede == DEFAULT_SUPERSEDE:
        left_out.add("supersede")
    return doc.model_dump_json(exclude=left_out).encode()


MAX_LOCATION_PART_CHARS: Final = 40
"""Characters of each part of an error's location shown (a category name may be long)."""


def _location(loc: tuple[int | str, ...]) -> str:
    """Where in a document pydantic found an error (``categories.<name>.rate``), each part
    cut to ``MAX_LOCATION_PART_CHARS``; ``document`` for the whole."""
    parts = (str(p) for p in loc)
    shown = (
        p if len(p) <= MAX_LOCATION_PART_CHARS else f"{p[:MAX_LOCATION_PART_CHARS]}..."
        for p in parts
    )
    return ".".join(shown) or "document"


def _other_policy_schema(version: object) -> str:
    """Why a document of another schema is refused, and what to do about it."""
    shown = repr(version) if isinstance(version, int | float | str) else type(version).__name__
    return (
        f"policy: schema_version: the document is of schema {shown[:40]}, this side reads "
        f"{POLICY_SCHEMA_VERSION}: run the same kvwise release on agents and controller"
    )


def decode_policy(
    raw: bytes | str, *, max_bytes: int | None = None, max_categories: int | None = None
) -> PolicyDocument:
    """A validated ``PolicyDocument``; ``WireError`` with pydantic's reason otherwise, or
    for a document over ``max_bytes`` (checked first), of a shape no document has or over
    ``max_categories`` (``json_shape_fault``, judged before the one parse), or naming a
    category longer than an event batch may (``MAX_CATEGORY_NAME_CHARS``: no agent sends
    one, so no fit holds one; a document built in a process, a replay's, is not bound)."""
    if max_bytes is not None and len(raw) > max_bytes:
        raise WireLimitError(f"policy: document of {len(raw)} bytes > limit {max_bytes}")
    fault = json_shape_fault(raw, max_categories)
    if fault is not None:
        raise WireLimitError(f"policy: {fault}")
    try:
        doc = PolicyDocument.model_validate_json(raw)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_context=False)
        if errors[0]["loc"] == ("schema_version",):  # a release mismatch, not a bad fit
            raise WireError(_other_policy_schema(errors[0].get("input"))) from None
        reasons = "; ".join(f"{_location(e['loc'])}: {e['msg']}" for e in errors[:5])
        raise WireError(f"policy: {reasons}") from None
    for name in doc.categories:
        if len(name) > MAX_CATEGORY_NAME_CHARS:
            raise WireLimitError(
                f"policy: {_location(('categories', name))}: a category name of {len(name)} "
                f"characters > limit {MAX_CATEGORY_NAME_CHARS}"
            )
    return doc


_OPTIONAL_STATUS_FIELDS: Final = frozenset(
    {
        "applied_at",
        "staged_version",
        "whole_requests",
        "evictor",
        "reuse_classes",
        "reuse_ghost_blocks",
        "supersedes_branches",
        "engine_calls",
        "engine_sampled_calls",
        "engine_sampled_blocks",
        "engine_sampled_ns",
        "publisher_unexpected_errors",
        "subscriber_unexpected_errors",
        "heartbeat_unexpected_errors",
    }
)
"""Fields added after schema 1 shipped: an older agent's heartbeat omits them."""
_STATUS_INT_MINIMUM: Final = {"staged_version": -1}
"""The least value of an integer field of a heartbeat, 0 unless named here: a capacity
sizes the shadow's caches, the rest are counts and versions (-1: not reported)."""


MAX_HEARTBEAT_BYTES: Final = 16_384
"""The largest heartbeat a controller reads: an agent's is well under 1 KiB (its longest
field, ``last_rejection``, is at most 400 characters); a larger value is refused unparsed."""


@dataclass(frozen=True)
class AgentStatus:
    """An agent's heartbeat, stored as JSON under ``Keys.agent(id)`` with a TTL."""

    __pydantic_config__: ClassVar[ConfigDict] = ConfigDict(use_attribute_docstrings=True)
    """Each field's docstring is its description in the controller's OpenAPI schema."""

    id: str
    """The worker's id (``KVWISE_WORKER_ID``, else ``host-pid``)."""
    engine: str
    """The engine the agent serves: ``vllm``, ``sglang``, ``sim``, ..."""
    capacity: int
    """Blocks the engine's cache holds."""
    applied_version: int = 0
    """Policy version in force (0: the built-in default)."""
    events_sent: int = 0
    """Events sent to the agent's stream since it started."""
    events_dropped: int = 0
    """Events lost since it started: dropped on a full buffer or in a failed send."""
    hits: int = 0
    """Blocks counted as prefix hits since it started."""
    accesses: int = 0
    """Blocks freed by requests since it started (each block of a request is one)."""
    hit_ratio: float = 0.0
    """``hits / accesses`` (0 before the first access)."""
    rejected: int = 0
    """Policy documents refused (each counted once, however often it was read)."""
    last_rejection: str = ""
    """Why the last one was refused, led by ``v<version>:`` when its version is known (at
    most 400 characters); empty while none has been."""
    started_at: float = 0.0
    """Unix time the agent was created."""
    updated_at: float = 0.0
    """Unix time this heartbeat was written."""
    applied_at: float = 0.0
    """When the version in force was swapped in (0: the built-in default, never swapped)."""
    staged_version: int = -1
    """Version the agent received and validated, in force after the engine's next call
    into the agent (an idle engine makes none); equals ``applied_version`` when nothing
    waits. -1 in a heartbeat that predates the field (read as ``applied_version``)."""
    whole_requests: bool = False
    """Whether the agent reports each request whole (its hits, then its stored blocks, at
    one time), so that its requests can be rebuilt from its events; False in a heartbeat
    that predates the field."""
    evictor: str = ""
    """The evictor family in force (``wa``, ``lru``, ...); empty in a heartbeat that
    predates the field."""
    reuse_classes: bool = False
    """Whether the agent files released blocks by reuse class (``KVWISE_REUSE_CLASSES``);
    False in a heartbeat that predates the field."""
    reuse_ghost_blocks: int = 0
    """With reuse classes, how many recently evicted blocks count as returns (its ghost)."""
    supersedes_branches: bool = False
    """Whether the engine's eviction runs the document's ``supersede`` rule under ``wa``
    (the vLLM free queue and SGLang's radix order do; the generic agent API does not);
    False in a heartbeat that predates the field."""
    engine_calls: int = 0
    """kvwise's calls on the engine thread since the agent started (``agent.engine_time``);
    0 in a heartbeat that predates the field, as the three below."""
    engine_sampled_calls: int = 0
    """Those of them that were timed (about one in 64)."""
    engine_sampled_blocks: int = 0
    """Blocks the timed calls handled."""
    engine_sampled_ns: int = 0
    """Engine-thread time the timed calls took, in nanoseconds."""
    publisher_unexpected_errors: int = 0
    """Rounds (or waits between rounds) of the agent's event publisher failed by an error
    not Redis's (a bug, most likely: its log has the traceback) since the agent started; 0
    in a heartbeat that predates the field, as the two below."""
    subscriber_unexpected_errors: int = 0
    """The same of its policy subscriber."""
    heartbeat_unexpected_errors: int = 0
    """The same of its heartbeat."""

    @property
    def loop_unexpected_errors(self) -> dict[str, int]:
        """The ``*_unexpected_errors`` counts, by loop: ``publisher``, ``subscriber``,
        ``heartbeat``."""
        return {
            "publisher": self.publisher_unexpected_errors,
            "subscriber": self.subscriber_unexpected_errors,
            "heartbeat": self.heartbeat_unexpected_errors,
        }

    @property
    def engine_time(self) -> EngineTimeSnapshot:
        """The ``engine_*`` counts: kvwise's engine-thread time per call, per block, in all."""
        return EngineTimeSnapshot(
            self.engine_calls,
            self.engine_sampled_calls,
            self.engine_sampled_blocks,
            self.engine_sampled_ns,
        )

    def __post_init__(self) -> None:
        if self.staged_version < 0:  # not reported: nothing known to wait
            object.__setattr__(self, "staged_version", self.applied_version)

    def to_json(self) -> str:
        return json.dumps({"v": WIRE_SCHEMA_VERSION, **asdict(self)})

    @classmethod
    def from_json(cls, raw: bytes | str) -> AgentStatus:
        """Parse a heartbeat; unknown keys are ignored, missing or mistyped ones, an integer
        past ``MAX_WIRE_INT`` and a negative one (bar ``staged_version``'s -1) raise
        ``WireError``."""
        try:
            obj = json.loads(raw)
        except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
            raise WireError(
                f"heartbeat: not JSON ({type(exc).__name__}: {str(exc)[:80]})"
            ) from None
        if not isinstance(obj, dict):
            raise WireError("heartbeat: not a JSON object")
        if obj.get("v", WIRE_SCHEMA_VERSION) != WIRE_SCHEMA_VERSION:
            raise WireError(_other_schema(obj.get("v")))
        values: dict[str, Any] = {}
        for f in fields(cls):
            if f.name not in obj:
                if f.name in _OPTIONAL_STATUS_FIELDS:
                    continue
                raise WireError(f"heartbeat: missing field {f.name!r}")
            value = values[f.name] = _typed(f.name, str(f.type), obj[f.name])
            if isinstance(value, int) and value < _STATUS_INT_MINIMUM.get(f.name, 0):
                raise WireError(f"heartbeat: {f.name} is negative: {value}")
        return cls(**values)


def _typed(name: str, type_: str, value: object) -> object:
    if isinstance(value, int) and abs(value) > MAX_WIRE_INT:  # not a gauge's, nor a float's
        raise WireError(f"heartbeat: {name} is an integer past the limit {MAX_WIRE_INT}")
    if type_ == "str" and isinstance(value, str):
        return value
    if type_ == "bool" and isinstance(value, bool):
        return value
    if type_ == "int" and isinstance(value, int) and not isinstance(value, bool):
        return value
    if (
        type_ == "float"
        and isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
    ):
        return float(value)
    raise WireError(f"heartbeat: {name} is not a {type_}: {value!r}")


MAX_INSTANCE_BYTES: Final = 64
"""Bytes of an ``AgentInstance`` value (three numbers: about 40) accepted at most."""


@dataclass(frozen=True)
class AgentInstance:
    """One agent process beating under a worker id, as its heartbeat records it in
    ``Keys.instances(id)`` (field: its epoch): when it started, when it last beat, and its
    heartbeat period, by its own clock. A compact value, ``"<started_at> <updated_at>
    <interval_s>"``, written beside every beat."""

    started_at: float
    updated_at: float
    interval_s: float

    def to_field(self) -> str:
        return f"{self.started_at:.3f} {self.updated_at:.3f} {self.interval_s:g}"

    @classmethod
    def from_field(cls, raw: bytes) -> AgentInstance:
        """Parse a value of ``to_field``'s form; anything else (too long, not three finite
        numbers, a start after the beat, a period not positive) is a ``WireError``."""
        if len(raw) > MAX_INSTANCE_BYTES:
            raise WireError(f"agent instance: more than {MAX_INSTANCE_BYTES} bytes")
        try:
            started, updated, interval = (float(x) for x in raw.split())
        except ValueError:  # not three numbers (UnicodeDecodeError is a ValueError)
            raise WireError(f"agent instance: {raw!r} is not three numbers") from None
        if not all(math.isfinite(x) for x in (started, updated, interval)):
            raise WireError(f"agent instance: {raw!r} is not three finite numbers")
        if started > updated or interval <= 0:
            raise WireError(f"agent instance: {raw!r} starts after it beat or has no period")
        return cls(started, updated, interval)

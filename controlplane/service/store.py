"""The policy store in Redis: immutable versions, the ``current`` pointer, overrides, rollback.

Owns every write of policy state. Each change is one optimistic transaction: WATCH the
version index, the base and the overrides; read them; compose the document from what was
read; MULTI; write the change itself (the new base, override or hold), the document, its
index entry and the ``current`` pointer; EXEC; then the notice on the channel (a hint:
agents poll ``current``). If another writer got there first, all of it is read and composed
again, so a document always equals the base plus the overrides stored with it, whatever
races (all policy keys share one Redis Cluster hash tag, so this holds on a cluster too). A
leader's fit and family selection carry a fence, asked after the reads and right before
MULTI: a replica that no longer leads publishes nothing (``LeaseLost``; the lease key may be
on another shard, so the fence is a read, not part of the transaction). Versions are
strictly increasing and never rewritten; a rollback publishes a *new* version with an old
version's parameters. History is bounded (oldest trimmed, never the current one). Each
publication is logged once with its note. Everything lives in Redis: a controller restart
loses nothing; and a Redis restarted empty gets back what a controller last knew of it
(``state`` as read, or as told to its ``memory`` by this store object; ``restore``: a version
numbered after every one known, with its base, overrides, pin and hold).

A published document is ``base`` (the last fitted parameters) with the operator's
overrides applied on top. Everything read back is held to the bounds of what this store
writes, in bytes before it is read and in categories before it is parsed. A document
refused (damaged, over them, or written by another hand) reads as not stored; a base or an
override set refused is read as the document in force holds it (its fitted categories and
family; its overridden ones at their values), so one damaged key never stops a publication
nor drops a pin, and the next publication writes it back; a ``current`` pointer refused
reads as the newest readable kept version (``rewrite_pointer`` writes it back at once).
Each refusal is logged once and counted (``on_refused``). A failed Redis call is recorded
in the ``RedisHealth``. It must never fit anything or talk HTTP.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal, NamedTuple, Protocol, TypeVar, cast

import redis
from pydantic import ValidationError
from redis.client import Pipeline

from agent.policy_document import (
    DEFAULT_FAMILY,
    EVICTOR_FAMILIES,
    MODEL_PARAMS,
    CategoryParams,
    EvictorFamily,
    PolicyDocument,
)
from agent.runtime.connection import RedisClient
from agent.wire import MAX_CATEGORY_NAME_CHARS, Keys, WireError, decode_policy, encode_policy
from controlplane.service.health import RedisHealth, guarded
from controlplane.service.metrics import StoredPart

log = logging.getLogger(__name__)

OVERRIDE_FIELDS = MODEL_PARAMS
MAX_OVERRIDES: Final = 256
"""Default bound of the overrides kept at once (a bound on every document's size)."""
MAX_FITTED_CATEGORIES: Final = 2048
"""Default bound of the categories a fit brings (the controller's ``max_categories``: its
statistics window holds no more)."""
CATEGORY_BYTES: Final = 2048
"""Bytes one category takes at most in what the store writes (a name of 128 characters of
four UTF-8 bytes, 12 as a JSON escape in the base, and its parameters), with room."""
FRAME_BYTES: Final = 16 * 1024
"""Bytes beside the categories at most (a document's note of 500 characters, its default,
version and family; a hash's own overhead)."""


class StoreError(RuntimeError):
    """A store operation that cannot be done as asked (e.g. unknown version)."""


class TooManyOverrides(StoreError):
    """A new pin past ``max_overrides`` (checked inside the publication's transaction, so
    concurrent pins cannot pass the limit together)."""


class LeaseLost(StoreError):
    """A publication refused by its fence: this replica no longer leads."""


class PolicyLost(RuntimeError):
    """A change refused while Redis has lost the policy state this replica remembers: the
    leader restores it first (``PolicyMemory``), and a change now would publish over it,
    numbered from nothing and without the overrides, pin and hold it holds."""


class RefitsHeld(RuntimeError):
    """A fit refused inside its transaction: refits are held (a rollback with ``hold``)."""


MAX_FAMILY_BYTES: Final = 64
"""Bytes of a pinned family's name read back at most (the longest known is far shorter)."""
MAX_POINTER_BYTES: Final = 32
"""Bytes of the ``current`` pointer read back at most (as the agents read it)."""

REFITS_HELD = "held: after a rollback; POST /v1/policy/refit"
"""Why an automatic refit publishes nothing while refits are held."""


_Part = TypeVar("_Part")
"""A part of the stored state read back: the base or the overrides."""


class _Parts(NamedTuple):
    """The base, the overrides and the pinned family as read back, and whether one was
    refused (read as the document in force holds it: a change writes them all back)."""

    base: Base
    overrides: dict[str, dict[str, float]]
    pin: EvictorFamily | None
    rebuilt: bool


Fence = Callable[[], bool]
"""Asked right before a publication's transaction: False refuses it (``LeaseLost``)."""


@dataclass(frozen=True)
class VersionInfo:
    version: int
    created_at: float
    note: str
    categories: int


@dataclass(frozen=True)
class Change:
    """What an operator's change did: the document in force after it, and whether it was
    published (False: the change was in force already; nothing written)."""

    document: PolicyDocument
    published: bool


@dataclass(frozen=True)
class Base:
    """The parameters the last fit produced, before overrides, and the evictor family the
    controller selected (an operator's pin, kept apart, wins over it)."""

    categories: dict[str, CategoryParams]
    default: CategoryParams | None
    evictor: EvictorFamily = DEFAULT_FAMILY

    def to_json(self) -> str:
        return json.dumps(
            {
                "categories": {k: v.model_dump() for k, v in self.categories.items()},
                "default": None if self.default is None else self.default.model_dump(),
                "evictor": self.evictor,
            }
        )

    @classmethod
    def from_json(cls, raw: bytes | str | None, *, max_categories: int | None = None) -> Base:
        """The base ``to_json`` wrote (empty if None); ``WireError`` naming the fault if it
        is damaged or holds more than ``max_categories`` categories (counted before any is
        parsed) or a name longer than ``MAX_CATEGORY_NAME_CHARS``."""
        if raw is None:
            return cls({}, None)
        try:
            data = json.loads(raw)
            stored: dict[str, Any] = data["categories"]
            if max_categories is not None and len(stored) > max_categories:
                raise WireError(f"base: {len(stored)} categories > limit {max_categories}")
            if any(len(name) > MAX_CATEGORY_NAME_CHARS for name in stored):
                raise WireError(f"base: a category name > limit {MAX_CATEGORY_NAME_CHARS}")
            cats = {k: CategoryParams.model_validate(v) for k, v in stored.items()}
            default = data.get("default")
            family = family_named(data.get("evictor", DEFAULT_FAMILY))
            fallback = None if default is None else CategoryParams.model_validate(default)
        except (ValueError, LookupError, TypeError, AttributeError, StoreError) as exc:
            if isinstance(exc, WireError):
                raise
            raise WireError(f"base: {_fault(exc)}") from None
        return cls(cats, fallback, family)


@dataclass(frozen=True)
class EvictorState:
    """The evictor family: in force (the current document's), pinned by an operator
    (None: not pinned), selected by the controller (what applies when not pinned)."""

    in_force: EvictorFamily | None
    pinned: EvictorFamily | None
    selected: EvictorFamily
    families: tuple[str, ...] = EVICTOR_FAMILIES


def family_named(name: str) -> EvictorFamily:
    """``name`` as a family; ``StoreError`` naming the known ones otherwise."""
    for family in EVICTOR_FAMILIES:
        if family == name:
            return family
    raise StoreError(f"unknown evictor family {name!r}; known: {', '.join(EVICTOR_FAMILIES)}")


@dataclass
class _Draft:
    """One change, as read inside the transaction: the state it starts from and what it
    writes; ``categories``/``default`` are the document to publish (None: compose)."""

    base: Base
    overrides: dict[str, dict[str, float]]
    note: str
    writes: list[Callable[[Pipeline], object]] = field(default_factory=list)
    copy_of: PolicyDocument | None = None
    pin: EvictorFamily | None = None
    """The operator's pinned evictor family, if any."""
    held: bool = False
    """Whether automatic refits are held back once it is published."""
    lowest_version: int = 1
    """The version published is at least this (a restored state goes on numbering)."""


@dataclass(frozen=True)
class StoreState:
    """Everything an operator or a fit put in the store, as one replica last read it: what
    ``restore`` writes back into a Redis that has lost it."""

    version: int
    """The version in force when read."""
    base: Base
    overrides: dict[str, dict[str, float]]
    pin: EvictorFamily | None
    held: bool

    def describe(self) -> str:
        """What it holds, for the note of the version that restores it."""
        parts = [f"v{self.version}'s fit", f"{len(self.overrides)} overrides"]
        if self.pin is not None:
            parts.append(f"evictor pinned to {self.pin}")
        if self.held:
            parts.append("refits held")
        return ", ".join(parts)


Prepare = Callable[[Pipeline], _Draft]


class Remembers(Protocol):
    """A replica's memory of the store (``PolicyMemory``), told each publication and asked
    before each: the state to restore once Redis has lost it, and the highest version
    number seen published (a number once published never names another document)."""

    @property
    def state(self) -> StoreState | None: ...

    @property
    def highest_version(self) -> int: ...

    def remember(self, state: StoreState) -> None: ...


class PolicyStore:
    def __init__(
        self,
        client: RedisClient,
        keys: Keys,
        history_size: int = 100,
        *,
        max_overrides: int = MAX_OVERRIDES,
        max_categories: int = MAX_FITTED_CATEGORIES,
        health: RedisHealth | None = None,
        memory: Remembers | None = None,
        on_refused: Callable[[StoredPart], None] | None = None,
    ) -> None:
        self.r = client
        self.keys = keys
        self.history_size = history_size
        self.max_overrides = max_overrides
        self.max_document_categories = max_categories + max_overrides
        """The most categories a document this store publishes holds (a fit's and every
        pinned one): a stored document (or base) of more is refused when read back."""
        self.max_document_bytes = self.max_document_categories * CATEGORY_BYTES + FRAME_BYTES
        """The most bytes of a document (or base) read back: a larger one is not read."""
        self.max_overrides_bytes = max_overrides * CATEGORY_BYTES + FRAME_BYTES
        self._refused: dict[int, str] = {}
        """Why each stored version read back was refused (logged once each)."""
        self._parts_refused: dict[str, str] = {}
        """Why the base or the overrides are refused now (logged once until read again)."""
        self._memory_usage_refused = False
        self.on_refused = on_refused
        """Told the part of each refusal logged (``kvwise_policy_state_refused``)."""
        self.health = health or RedisHealth("redis")
        self.memory = memory
        """Told each publication right after it (in the order published), so that what a
        replica itself changed is known before any read."""

    # --- reads ---------------------------------------------------------------------------
    @guarded
    def current_version(self) -> int | None:
        """The version in force (None: none); see ``_pointer``."""
        return self._pointer(self.r)

    @guarded
    def current(self) -> PolicyDocument | None:
        v = self.current_version()
        return None if v is None else self.get(v)

    @guarded
    def get(self, version: int) -> PolicyDocument | None:
        """The document of ``version``; None if it is not stored, or is refused."""
        return self._document(self.r, version)

    def refusal(self, version: int) -> str | None:
        """Why the stored document of ``version`` was refused when last read (None: it was
        not, or not read since this store last refused a hundred others)."""
        return self._refused.get(version)

    def _document(self, reader: RedisClient | Pipeline, version: int) -> PolicyDocument | None:
        """The document of ``version`` read through ``reader`` and decoded within this
        store's bounds; None if absent or refused: written by another hand, damaged, or
        over the bounds (not read whole: at most ``max_document_bytes`` + 1 bytes come
        back). A refused version reads as not stored (logged once with why, counted), so
        the next change publishes a readable version over it, as agents refuse it and keep
        their last."""
        key, limit = self.keys.policy_doc(version), self.max_document_bytes
        try:
            raw = _bounded_string(reader, key, limit, "policy: document")
        except WireError as exc:
            self._refuse(version, exc.reason)
            return None
        return self._decoded(version, raw)

    def _decoded(self, version: int, raw: bytes | str | None) -> PolicyDocument | None:
        """``raw``, read within ``max_document_bytes`` from the key of ``version`` (None:
        absent), decoded within this store's bounds; None if refused (``_document``)."""
        if raw is None:
            return None
        try:
            return decode_policy(raw, max_categories=self.max_document_categories)
        except WireError as exc:
            self._refuse(version, exc.reason)
            return None

    def _refuse(self, version: int, reason: str) -> None:
        """Record why the stored document of ``version`` is refused: logged and counted
        the first time."""
        if version not in self._refused:
            if len(self._refused) >= self.history_size:
                self._refused.clear()  # versions refused long ago: said once more at most
            self._refused[version] = reason
            log.warning("stored policy v%d refused, read as not stored: %s", version, reason)
            self._count_refusal("document")

    def _count_refusal(self, part: StoredPart) -> None:
        if self.on_refused is not None:
            self.on_refused(part)

    @guarded
    def versions(self) -> list[VersionInfo]:
        """Kept versions, newest first (but those refused: see ``get``)."""
        listed = [
            int(v) for v in cast(list[bytes], self.r.zrevrange(self.keys.policy_versions, 0, -1))
        ]
        limit = self.max_document_bytes
        with self.r.pipeline(transaction=False) as pipe:
            for v in listed:
                pipe.getrange(self.keys.policy_doc(v), 0, limit)
            raws = pipe.execute(raise_on_error=False)
        docs = (
            # One refused before reading (too large, another type) is read again to say why.
            self._document(self.r, v)
            if isinstance(raw, Exception) or len(raw) > limit
            else self._decoded(v, raw or None)
            for v, raw in zip(listed, raws, strict=True)
        )
        return [
            VersionInfo(doc.version, doc.created_at, doc.note, len(doc.categories))
            for doc in docs
            if doc is not None
        ]

    @guarded
    def overrides(self) -> dict[str, dict[str, float]]:
        """The operator's overrides (see ``_parts``: as the document in force holds them
        if the stored ones are refused)."""
        return self._parts(self.r).overrides

    @guarded
    def base(self) -> Base:
        """The last fit (see ``_parts``: as the document in force holds it if the stored
        one is refused)."""
        return self._parts(self.r).base

    def _parts(self, reader: RedisClient | Pipeline) -> _Parts:
        """The base, the overrides and the pin stored, each read within its bounds. One
        refused (damaged, over them, of another type) is read as the document in force
        holds it (its fitted categories, default and family; its overridden categories at
        their values: the pins agents apply now; its family, pinned if the selection is
        another), or empty if that is unreadable too; logged once with which, and counted.
        A change writes them back (``_read``)."""
        base, base_news = self._part("base", lambda: self._stored_base(reader))
        overrides, overrides_news = self._part("overrides", lambda: self._stored_overrides(reader))
        pin, pin_news = self._part("pin", lambda: self._stored_pin(reader))
        if base is not None and overrides is not None and pin is not None:
            return _Parts(base, overrides, pin or None, rebuilt=False)
        in_force = self._current_in(reader)
        if in_force is None:
            read_as = "no readable document in force: read as empty (pins lost: set them again)"
        else:
            read_as = f"read as v{in_force.version} in force holds it until a change writes it"
        parts: tuple[tuple[StoredPart, str | None], ...] = (
            ("base", base_news),
            ("overrides", overrides_news),
            ("pin", pin_news),
        )
        for part, news in parts:
            if news is not None:
                log.warning("stored policy %s refused: %s; %s", part, news, read_as)
                self._count_refusal(part)
        base = base if base is not None else _base_of(in_force)
        if pin is None:  # pinned only if the selection would not run the family in force
            running = in_force.evictor if in_force is not None else base.evictor
            pin = running if running != base.evictor else ""
        return _Parts(
            base,
            overrides if overrides is not None else _overrides_of(in_force),
            pin or None,
            rebuilt=True,
        )

    def _part(self, part: str, read: Callable[[], _Part]) -> tuple[_Part | None, str | None]:
        """What ``read`` reads of ``part``, or None if it refuses it; and the reason if that
        refusal is news (not the one last found: each is said once)."""
        try:
            value = read()
        except WireError as exc:
            news = None if self._parts_refused.get(part) == exc.reason else exc.reason
            self._parts_refused[part] = exc.reason
            return None, news
        self._parts_refused.pop(part, None)
        return value, None

    def _stored_base(self, reader: RedisClient | Pipeline) -> Base:
        """The base as stored; ``WireError`` if over this store's bounds or damaged."""
        raw = _bounded_string(reader, self.keys.policy_base, self.max_document_bytes, "base")
        return Base.from_json(raw, max_categories=self.max_document_categories)

    def _stored_overrides(self, reader: RedisClient | Pipeline) -> dict[str, dict[str, float]]:
        """The overrides as stored; ``WireError`` if there are more than ``max_overrides``,
        if the hash takes more than ``max_overrides_bytes`` in Redis (both asked before it
        is read), or if one is damaged."""
        key, limit = self.keys.overrides, self.max_overrides_bytes
        try:
            count = reader.hlen(key)
            if count > self.max_overrides:
                raise WireError(f"overrides: {count} categories > limit {self.max_overrides}")
            size = self._memory_usage(reader, key) if count else 0
            if size is not None and size > limit:
                raise WireError(f"overrides: {size} bytes > limit {limit} (not read)")
            return _overrides(reader.hgetall(key))
        except redis.ResponseError as exc:
            raise _wrong_type(exc, reader, key, "overrides") from None

    def _stored_pin(self, reader: RedisClient | Pipeline) -> EvictorFamily | Literal[""]:
        """The family pinned as stored ("": none); ``WireError`` if it is no family."""
        raw = _bounded_string(reader, self.keys.evictor_pin, MAX_FAMILY_BYTES, "pin")
        try:
            return "" if raw is None else family_named(_s(raw))
        except StoreError as exc:
            raise WireError(f"pin: {exc}") from None

    def _memory_usage(self, reader: RedisClient | Pipeline, key: str) -> int | None:
        """The bytes ``key`` takes in Redis (every field counted); None where the server
        refuses ``MEMORY USAGE`` (some managed ones do): the count bound alone holds then
        (said once)."""
        if self._memory_usage_refused:
            return None
        try:
            return reader.memory_usage(key, samples=0)
        except redis.ResponseError as exc:
            if str(exc).startswith("WRONGTYPE"):
                raise
            self._memory_usage_refused = True
            log.info("overrides bounded by count only: Redis refuses MEMORY USAGE (%s)", exc)
            return None

    @guarded
    def has_version(self, version: int) -> bool:
        """Whether the document of ``version`` is stored."""
        return bool(self.r.exists(self.keys.policy_doc(version)))

    @guarded
    def held(self) -> bool:
        """Whether automatic refits are held back (after a rollback with ``hold``)."""
        return bool(self.r.exists(self.keys.policy_hold))

    @guarded
    def state(self) -> StoreState | None:
        """The store's state as it is now (None: no version in force); read key by key, as
        a snapshot to restore from (a change between the reads is read again at the next
        version)."""
        current = self._pointer(self.r)
        if current is None:
            return None
        base, overrides, pin, _ = self._parts(self.r)
        return StoreState(current, base, overrides, pin, bool(self.r.exists(self.keys.policy_hold)))

    @guarded
    def preview_fit(
        self, categories: Mapping[str, CategoryParams], default: CategoryParams | None
    ) -> PolicyDocument:
        """The document ``publish_fit`` would publish now, as version 0 (nothing written)."""
        cats, fallback = _composed(Base(dict(categories), default), self.overrides())
        if fallback is None:
            return PolicyDocument(version=0, categories=cats, note="candidate fit")
        return PolicyDocument(version=0, categories=cats, default=fallback, note="candidate fit")

    # --- writes --------------------------------------------------------------------------
    @guarded
    def publish_fit(
        self,
        categories: Mapping[str, CategoryParams],
        default: CategoryParams | None,
        note: str,
        *,
        fence: Fence | None = None,
        unless_held: bool = False,
        after: int = 0,
    ) -> PolicyDocument:
        """Record a new fit as the base (the selected family kept) and publish base +
        overrides, numbered after ``after``; ``LeaseLost`` (nothing written) if ``fence``
        says this replica no longer leads, ``RefitsHeld`` if ``unless_held`` and refits
        are held (judged in the transaction: a rollback that holds them wins a race)."""

        def prepare(pipe: Pipeline) -> _Draft:
            draft = self._read(pipe, note)
            if unless_held and draft.held:
                raise RefitsHeld(REFITS_HELD)
            draft.lowest_version = after + 1
            self._set_base(draft, Base(dict(categories), default, draft.base.evictor))
            return draft

        return self._publish(prepare, fence)

    @guarded
    def set_override(self, category: str, values: Mapping[str, float]) -> Change:
        """Pin ``values`` (merged into the category's override) and publish; if the merged
        override is the one in force already, publish nothing (judged in the transaction):
        the document in force comes back."""
        unknown = set(values) - set(OVERRIDE_FIELDS)
        if unknown or not values:
            raise StoreError(f"override takes any of {', '.join(OVERRIDE_FIELDS)}")
        if not 0 < len(category) <= MAX_CATEGORY_NAME_CHARS:
            raise StoreError(f"a category name has 1 to {MAX_CATEGORY_NAME_CHARS} characters")

        def prepare(pipe: Pipeline) -> _Draft:
            draft = self._read(pipe, "")
            full = len(draft.overrides) >= self.max_overrides
            if category not in draft.overrides and full:
                raise TooManyOverrides(
                    f"{len(draft.overrides)} categories are pinned already (max_overrides "
                    f"{self.max_overrides}): release one first"
                )
            merged = {**draft.overrides.get(category, {}), **values}
            in_force = self._current_in(pipe)
            if draft.overrides.get(category) == merged and in_force is not None:
                raise _SameOverride(in_force)
            # Validate before storing: a bad override must never reach agents.
            _apply_one(_params_for_override(draft, in_force, category), merged)
            draft.overrides[category] = merged
            draft.note = f"override {category}: {json.dumps(merged, sort_keys=True)}"
            text = json.dumps(merged)
            draft.writes.append(lambda p: p.hset(self.keys.overrides, category, text))
            return draft

        try:
            return Change(self._publish(prepare), published=True)
        except _SameOverride as same:
            return Change(same.document, published=False)

    @guarded
    def delete_override(self, category: str) -> PolicyDocument:
        def prepare(pipe: Pipeline) -> _Draft:
            draft = self._read(pipe, f"override {category} removed")
            if draft.overrides.pop(category, None) is None:
                raise StoreError(f"no override for category {category!r}")
            draft.writes.append(lambda p: p.hdel(self.keys.overrides, category))
            return draft

        return self._publish(prepare)

    @guarded
    def rollback(self, version: int, *, hold: bool = False) -> PolicyDocument:
        """Publish a new version carrying ``version``'s parameters and family.

        The overrides become those ``version`` carried (each category it shows as
        ``override``, at its values then), so the list and the document agree; under
        them the base keeps the fit in force now (what removing one falls back to). Its
        family becomes the controller's selection, unless it is the operator's pin in
        force now (a pin is not a selection: releasing it lets the selection apply
        again). With ``hold``, automatic refits stop publishing until a manual refit."""
        old = self.get(version)
        if old is None and version in self._refused:
            raise StoreError(f"version {version} is refused: {self._refused[version]}")
        if old is None:
            raise StoreError(f"version {version} is not kept (see GET /v1/policy/versions)")
        restored = _overrides_of(old)

        def prepare(pipe: Pipeline) -> _Draft:
            draft = self._read(pipe, f"rollback to version {version}" + (", held" if hold else ""))
            ran_by_the_pin = draft.pin is not None and old.evictor == draft.pin
            selection = draft.base.evictor if ran_by_the_pin else old.evictor
            fitted = {n: p for n, p in old.categories.items() if n not in restored}
            fitted |= {n: p for n, p in draft.base.categories.items() if n in restored}
            self._set_base(draft, Base(fitted, old.default, selection))
            draft.overrides, draft.copy_of = restored, old
            draft.writes.append(_overrides_written(self.keys.overrides, restored))
            if hold:
                draft.held = True
                draft.writes.append(lambda p: p.set(self.keys.policy_hold, str(version)))
            return draft

        return self._publish(prepare)

    @guarded
    def evictor(self) -> EvictorState:
        current, parts = self.current(), self._parts(self.r)
        return EvictorState(
            current.evictor if current is not None else None, parts.pin, parts.base.evictor
        )

    @guarded
    def select_evictor(
        self, family: str, note: str, *, fence: Fence | None = None
    ) -> PolicyDocument:
        """Record ``family`` as the controller's choice and publish (an operator's pin
        still wins in the document); ``LeaseLost`` as ``publish_fit`` says."""
        chosen = family_named(family)

        def prepare(pipe: Pipeline) -> _Draft:
            draft = self._read(pipe, note)
            self._set_base(draft, replace(draft.base, evictor=chosen))
            return draft

        return self._publish(prepare, fence)

    @guarded
    def pin_evictor(self, family: str | None) -> Change:
        """Pin the evictor family (None: release the pin, the selection applies again).
        Pinning the family already pinned, or releasing no pin, publishes nothing: the
        document in force comes back."""
        chosen = None if family is None else family_named(family)
        current = self.current()
        if current is not None and self._parts(self.r).pin == chosen:
            return Change(current, published=False)

        def prepare(pipe: Pipeline) -> _Draft:
            draft = self._read(pipe, f"evictor family pinned to {chosen}")
            if chosen is None:
                draft.note = "evictor family pin released"
                draft.writes.append(lambda p: p.delete(self.keys.evictor_pin))
            else:
                draft.writes.append(lambda p: p.set(self.keys.evictor_pin, chosen))
            draft.pin = chosen
            return draft

        return Change(self._publish(prepare), published=True)

    @guarded
    def restore(self, state: StoreState, *, after: int = 0) -> PolicyDocument | None:
        """Write ``state`` back into a Redis that lost it (restarted empty) and publish it
        as a version numbered after both ``state.version`` and ``after`` (the highest
        version known to have been published: a number agents may hold already must never
        name another document); None (no write) if a version is in force by then."""

        def prepare(pipe: Pipeline) -> _Draft:
            note = f"restored after Redis lost its state: {state.describe()}"
            draft = self._read(pipe, note, restoring=True)
            if self._pointer(pipe) is not None:
                raise _AlreadyInForce
            self._set_base(draft, state.base)
            draft.overrides = dict(state.overrides)
            if state.overrides:
                stored: dict[Any, str] = {c: json.dumps(v) for c, v in state.overrides.items()}
                draft.writes.append(lambda p: p.hset(self.keys.overrides, mapping=stored))
            draft.pin = state.pin
            if state.pin is not None:
                draft.writes.append(lambda p: p.set(self.keys.evictor_pin, str(state.pin)))
            if state.held:
                draft.held = True
                draft.writes.append(lambda p: p.set(self.keys.policy_hold, str(state.version)))
            draft.lowest_version = max(state.version, after) + 1
            return draft

        try:
            return self._publish(prepare)
        except _AlreadyInForce:
            return None

    @property
    def pointer_refused(self) -> bool:
        """Whether the ``current`` pointer was refused when last read (``_pointer``)."""
        return "current" in self._parts_refused

    @guarded
    def rewrite_pointer(self) -> PolicyDocument | None:
        """Publish the state in force again while the ``current`` pointer is refused: the
        agents cannot follow it, and a refit whose parameters did not move publishes
        nothing; None (nothing written) once it reads."""

        def prepare(pipe: Pipeline) -> _Draft:
            try:
                _stored_pointer(pipe, self.keys.policy_current)
            except WireError as exc:
                return self._read(pipe, f"current pointer written back ({exc.reason})")
            raise _AlreadyInForce

        try:
            return self._publish(prepare)
        except _AlreadyInForce:
            return None

    @guarded
    def release_hold(self) -> None:
        self.r.delete(self.keys.policy_hold)

    # --- the transaction -------------------------------------------------------------------
    def _read(self, pipe: Pipeline, note: str, *, restoring: bool = False) -> _Draft:
        """What a change starts from, read through ``pipe`` after its WATCH; ``PolicyLost``
        while Redis has lost the state this replica remembers (but for its restore)."""
        lost = self.memory is not None and self.memory.state is not None
        if lost and not restoring and self._pointer(pipe) is None:
            raise PolicyLost(
                "Redis has lost the policy state (restarted empty?): the leader restores "
                "it within restore_wait_s; try again then"
            )
        base, overrides, pin, rebuilt = self._parts(pipe)
        draft = _Draft(base, overrides, note, pin=pin)
        if rebuilt:  # read as the document in force holds them: written back
            self._set_base(draft, base)
            draft.writes.append(_overrides_written(self.keys.overrides, overrides))
            draft.writes.append(self._pin_written(pin))
        draft.held = bool(pipe.exists(self.keys.policy_hold))
        return draft

    def _pin_written(self, pin: EvictorFamily | None) -> Callable[[Pipeline], object]:
        """The write that makes the stored pin ``pin`` (None: no pin)."""
        key = self.keys.evictor_pin
        return lambda p: p.delete(key) if pin is None else p.set(key, pin)

    def _set_base(self, draft: _Draft, base: Base) -> None:
        """``draft`` publishes ``base`` and stores it as the base."""
        draft.base = base
        draft.writes.append(lambda p: p.set(self.keys.policy_base, base.to_json()))

    def _current_in(self, reader: RedisClient | Pipeline) -> PolicyDocument | None:
        version = self._pointer(reader)
        return None if version is None else self._document(reader, version)

    def _pointer(self, reader: RedisClient | Pipeline) -> int | None:
        """The version the ``current`` pointer names (None: no pointer). One refused (no
        version number, over ``MAX_POINTER_BYTES``, of another type) reads as the newest
        readable kept version, or as none in force if no kept one reads (then a Redis that
        lost the policy: restored, or the defaults published); logged once, counted, and
        written back by the next publication, which every one writes."""
        key = self.keys.policy_current
        version, news = self._part("current", lambda: _stored_pointer(reader, key))
        if version is not None:
            return version or None
        newest = self._newest_readable(reader)
        if news is not None:
            read_as = (
                f"read as v{newest.version}, the newest readable kept version"
                if newest is not None
                else "no readable kept version: read as none in force"
            )
            log.warning("stored policy current refused: %s; %s until a publication", news, read_as)
            self._count_refusal("current")
        return None if newest is None else newest.version

    def _newest_readable(self, reader: RedisClient | Pipeline) -> PolicyDocument | None:
        """The newest kept version whose document reads (None: none does)."""
        listed = cast(list[bytes], reader.zrevrange(self.keys.policy_versions, 0, -1))
        readable = (self._document(reader, int(v)) for v in listed)
        return next((doc for doc in readable if doc is not None), None)

    def _publish(self, prepare: Prepare, fence: Fence | None = None) -> PolicyDocument:
        k = self.keys
        watched = (
            k.policy_versions,
            k.policy_current,
            k.policy_base,
            k.overrides,
            k.evictor_pin,
            k.policy_hold,
        )
        with self.r.pipeline(transaction=True) as pipe:
            while True:
                try:
                    pipe.watch(*watched)
                    draft = prepare(pipe)
                    doc, drop = self._compose(pipe, draft)
                    if fence is not None and not fence():
                        raise LeaseLost("not published: this replica no longer leads")
                    pipe.multi()
                    for write in draft.writes:
                        write(pipe)
                    pipe.set(k.policy_doc(doc.version), encode_policy(doc))
                    pipe.zadd(k.policy_versions, {str(doc.version): doc.version})
                    pipe.set(k.policy_current, str(doc.version))
                    for v in drop:
                        pipe.zrem(k.policy_versions, str(v))
                        pipe.delete(k.policy_doc(v))
                    pipe.execute()
                except redis.WatchError:
                    continue
                log.info("published policy v%d: %s", doc.version, doc.note)
                if self.memory is not None:
                    self.memory.remember(_state_of(doc, draft))
                self._notify(doc.version)
                return doc

    def _notify(self, version: int) -> None:
        """The notice on the channel, after the transaction (a cluster pipeline cannot
        PUBLISH): a hint only, agents poll ``current`` anyway."""
        try:
            self.r.publish(self.keys.policy_channel, str(version))
        except redis.RedisError as exc:
            log.debug("notice of v%d not sent (%s): agents will poll it", version, exc)

    def _compose(self, pipe: Pipeline, draft: _Draft) -> tuple[PolicyDocument, list[int]]:
        """The document ``draft`` publishes and the old versions it pushes out."""
        top = cast(list[bytes], pipe.zrevrange(self.keys.policy_versions, 0, 0))
        seen = self.memory.highest_version + 1 if self.memory is not None else 1
        version = max(int(top[0]) + 1 if top else 1, draft.lowest_version, seen)
        default: CategoryParams | None
        if draft.copy_of is not None:
            cats, default = dict(draft.copy_of.categories), draft.copy_of.default
        else:
            cats, default = _composed(draft.base, draft.overrides)
        fields: dict[str, Any] = {"version": version, "categories": cats}
        fields["evictor"] = draft.pin or draft.base.evictor
        fields.update(note=draft.note[:500], created_at=time.time())
        if default is not None:
            fields["default"] = default
        kept = cast(list[bytes], pipe.zrange(self.keys.policy_versions, 0, -1))
        drop = [int(v) for v in kept][: max(0, len(kept) + 1 - self.history_size)]
        return PolicyDocument(**fields), drop


def _state_of(doc: PolicyDocument, draft: _Draft) -> StoreState:
    """The store's state once ``draft`` is published as ``doc``."""
    return StoreState(doc.version, draft.base, dict(draft.overrides), draft.pin, draft.held)


class _AlreadyInForce(Exception):
    """A restore found a version in force, or a pointer to write back reads: nothing to
    write."""


class _SameOverride(Exception):
    """An override already in force as asked: nothing to publish; ``document`` is in force."""

    def __init__(self, document: PolicyDocument) -> None:
        super().__init__()
        self.document = document


def _overrides(raw: Mapping[bytes | str, bytes | str]) -> dict[str, dict[str, float]]:
    """The overrides hash as read; ``WireError`` naming the first one damaged: not JSON,
    not a mapping of override fields to numbers, or a name past the length bound."""
    overrides: dict[str, dict[str, float]] = {}
    for key, value in raw.items():
        name = _s(key)
        try:
            values = json.loads(value)
        except ValueError:
            values = None
        fine = isinstance(values, dict) and 0 < len(name) <= MAX_CATEGORY_NAME_CHARS
        if not fine or not values or set(values) - set(OVERRIDE_FIELDS):
            raise WireError(f"overrides: {name[:40]!r}: not an override of {OVERRIDE_FIELDS}")
        try:  # in range (every composition applies it: one out of range would fail them all)
            _apply_one(PolicyDocument(version=0).default, values)
        except ValueError as exc:
            raise WireError(f"overrides: {name[:40]!r}: {_fault(exc)}") from None
        overrides[name] = values
    return overrides


def _fault(exc: Exception) -> str:
    """What is wrong with a part read back, in a line: pydantic's first errors by field,
    or the exception's kind and first line."""
    if isinstance(exc, ValidationError):
        errors = exc.errors(include_url=False, include_context=False, include_input=False)
        return "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in errors[:3])
    return f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"


def _overrides_written(
    key: str, overrides: Mapping[str, Mapping[str, float]]
) -> Callable[[Pipeline], None]:
    """The writes that make the hash at ``key`` hold ``overrides`` and nothing else."""

    def write(pipe: Pipeline) -> None:
        pipe.delete(key)
        for name, values in overrides.items():
            pipe.hset(key, name, json.dumps(values))

    return write


def _overrides_of(doc: PolicyDocument | None) -> dict[str, dict[str, float]]:
    """The overrides ``doc`` shows (each category it marks ``override``, at its values)."""
    if doc is None:
        return {}
    return {
        name: {field: getattr(params, field) for field in OVERRIDE_FIELDS}
        for name, params in doc.categories.items()
        if params.source == "override"
    }


def _base_of(doc: PolicyDocument | None) -> Base:
    """The base ``doc`` was published from, as far as it shows it: its fitted categories
    (not the overridden ones: their fit is not in it), default and family."""
    if doc is None:
        return Base({}, None)
    fitted = {n: p for n, p in doc.categories.items() if p.source != "override"}
    return Base(fitted, doc.default, doc.evictor)


def _bounded_string(
    reader: RedisClient | Pipeline, key: str, limit: int, what: str
) -> bytes | None:
    """The string at ``key`` (None: absent or empty), never read whole past ``limit``: one
    GETRANGE of ``limit`` + 1 bytes (the agents' subscriber reads a document this way);
    ``WireError`` if it holds more (its size asked then) or another type than a string."""
    try:
        raw = reader.getrange(key, 0, limit)
        if len(raw) > limit:
            size = reader.strlen(key)
            raise WireError(f"{what} of {size} bytes > limit {limit} (not read)")
    except redis.ResponseError as exc:
        raise _wrong_type(exc, reader, key, what) from None
    if not raw:
        return None
    return raw if isinstance(raw, bytes) else raw.encode()


def _stored_pointer(reader: RedisClient | Pipeline, key: str) -> int:
    """The version the ``current`` pointer at ``key`` names (0: none stored); ``WireError``
    if it names none: not a positive number as the agents read one, too long, or of
    another type than a string."""
    raw = _bounded_string(reader, key, MAX_POINTER_BYTES, "current")
    if raw is None:
        return 0
    try:
        version = int(raw)
    except ValueError:
        version = 0
    if version < 1:
        raise WireError(f"current is not a version number: {raw[:40]!r}")
    return version


def _wrong_type(
    exc: redis.ResponseError, reader: RedisClient | Pipeline, key: str, what: str
) -> WireError:
    """``exc`` as a ``WireError`` if it says ``key`` holds another type (named); re-raised
    otherwise."""
    if not str(exc).startswith("WRONGTYPE"):
        raise exc
    held = reader.type(key)
    return WireError(f"{what}: {key} is a {_s(held)} (not read)")


def _composed(
    base: Base, overrides: Mapping[str, Mapping[str, float]]
) -> tuple[dict[str, CategoryParams], CategoryParams | None]:
    cats = dict(base.categories)
    for name, values in overrides.items():
        start = cats.get(name) or base.default or PolicyDocument(version=0).default
        cats[name] = _apply_one(start, values)
    return cats, base.default


def _params_for_override(
    draft: _Draft, current: PolicyDocument | None, category: str
) -> CategoryParams:
    if category in draft.base.categories:
        return draft.base.categories[category]
    if current is not None:
        return current.params_for(category)
    return draft.base.default or PolicyDocument(version=0).default


def _apply_one(params: CategoryParams, values: Mapping[str, Any]) -> CategoryParams:
    data = params.model_dump()
    data.update(values)
    data["source"] = "override"
    return CategoryParams.model_validate(data)


def _s(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v

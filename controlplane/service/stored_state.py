"""Reading the policy state back from Redis, held to the bounds of what the store writes.

Owns every read of stored policy state: the documents, the ``current`` pointer, the base,
the overrides and the pinned family. Each is read within bounds, in bytes before it is read
(GETRANGE of one byte past the bound; HLEN and MEMORY USAGE before a hash) and in
categories before it is parsed. A document refused (damaged, over the bounds, or written by
another hand) reads as not stored; a base, override set or pin refused reads as the
document in force holds it (its fitted categories and family; its overridden ones at their
values), or empty if that is unreadable too; a ``current`` pointer refused reads as the
newest readable kept version. Each refusal is logged once and counted (``on_refused``).
It must never write to Redis, publish, compose a document or fit anything: what it reads
back as refused is written back by the store's next publication.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, NamedTuple, TypeVar, cast

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
from agent.wire import MAX_CATEGORY_NAME_CHARS, Keys, WireError, decode_policy
from controlplane.service.bounded_string import (
    StringTooLarge,
    WrongType,
    read_bounded_string,
    wrong_type,
)
from controlplane.service.metrics import StoredPart

log = logging.getLogger(__name__)

OVERRIDE_FIELDS = MODEL_PARAMS
CATEGORY_BYTES: Final = 2048
"""Bytes one category takes at most in what the store writes (a name of 128 characters of
four UTF-8 bytes, 12 as a JSON escape in the base, and its parameters), with room."""
FRAME_BYTES: Final = 16 * 1024
"""Bytes beside the categories at most (a document's note of 500 characters, its default,
version and family; a hash's own overhead)."""
MAX_FAMILY_BYTES: Final = 64
"""Bytes of a pinned family's name read back at most (the longest known is far shorter)."""
MAX_POINTER_BYTES: Final = 32
"""Bytes of the ``current`` pointer read back at most (as the agents read it)."""


class StoreError(RuntimeError):
    """A store operation that cannot be done as asked (e.g. unknown version)."""


_Part = TypeVar("_Part")
"""A part of the stored state read back: the base or the overrides."""


class StoredParts(NamedTuple):
    """The base, the overrides and the pinned family as read back, and whether one was
    refused (read as the document in force holds it: a change writes them all back)."""

    base: Base
    overrides: dict[str, dict[str, float]]
    pin: EvictorFamily | None
    rebuilt: bool


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


def family_named(name: str) -> EvictorFamily:
    """``name`` as a family; ``StoreError`` naming the known ones otherwise."""
    for family in EVICTOR_FAMILIES:
        if family == name:
            return family
    raise StoreError(f"unknown evictor family {name!r}; known: {', '.join(EVICTOR_FAMILIES)}")


class StoredStateReader:
    """Reads the stored state back within the bounds of a store of ``max_categories``
    fitted categories and ``max_overrides`` overrides, and remembers what it refused."""

    def __init__(
        self,
        keys: Keys,
        *,
        history_size: int,
        max_overrides: int,
        max_categories: int,
        on_refused: Callable[[StoredPart], None] | None = None,
    ) -> None:
        self.keys = keys
        self.history_size = history_size
        self.max_overrides = max_overrides
        self.max_document_categories = max_categories + max_overrides
        """The most categories a document the store publishes holds (a fit's and every
        pinned one): a stored document (or base) of more is refused when read back."""
        self.max_document_bytes = self.max_document_categories * CATEGORY_BYTES + FRAME_BYTES
        """The most bytes of a document (or base) read back: a larger one is not read."""
        self.max_overrides_bytes = max_overrides * CATEGORY_BYTES + FRAME_BYTES
        self.refused: dict[int, str] = {}
        """Why each stored version read back was refused (logged once each)."""
        self._parts_refused: dict[str, str] = {}
        """Why the base or the overrides are refused now (logged once until read again)."""
        self._memory_usage_refused = False
        self.on_refused = on_refused
        """Told the part of each refusal logged (``kvwise_policy_state_refused``)."""

    @property
    def pointer_refused(self) -> bool:
        """Whether the ``current`` pointer was refused when last read (``pointer``)."""
        return "current" in self._parts_refused

    def document(self, reader: RedisClient | Pipeline, version: int) -> PolicyDocument | None:
        """The document of ``version`` read through ``reader`` and decoded within the
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

    def kept_documents(self, client: RedisClient) -> list[PolicyDocument]:
        """The documents of the kept versions, newest first, but those refused (see
        ``document``); read in one round trip, each within ``max_document_bytes``."""
        listed = [
            int(v) for v in cast(list[bytes], client.zrevrange(self.keys.policy_versions, 0, -1))
        ]
        limit = self.max_document_bytes
        with client.pipeline(transaction=False) as pipe:
            for v in listed:
                pipe.getrange(self.keys.policy_doc(v), 0, limit)
            raws = pipe.execute(raise_on_error=False)
        docs = (
            # One refused before reading (too large, another type) is read again to say why.
            self.document(client, v)
            if isinstance(raw, Exception) or len(raw) > limit
            else self._decoded(v, raw or None)
            for v, raw in zip(listed, raws, strict=True)
        )
        return [doc for doc in docs if doc is not None]

    def _decoded(self, version: int, raw: bytes | str | None) -> PolicyDocument | None:
        """``raw``, read within ``max_document_bytes`` from the key of ``version`` (None:
        absent), decoded within the store's bounds; None if refused (``document``)."""
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
        if version not in self.refused:
            if len(self.refused) >= self.history_size:
                self.refused.clear()  # versions refused long ago: said once more at most
            self.refused[version] = reason
            log.warning("stored policy v%d refused, read as not stored: %s", version, reason)
            self._count_refusal("document")

    def _count_refusal(self, part: StoredPart) -> None:
        if self.on_refused is not None:
            self.on_refused(part)

    def parts(self, reader: RedisClient | Pipeline) -> StoredParts:
        """The base, the overrides and the pin stored, each read within its bounds. One
        refused (damaged, over them, of another type) is read as the document in force
        holds it (its fitted categories, default and family; its overridden categories at
        their values: the pins agents apply now; its family, pinned if the selection is
        another), or empty if that is unreadable too; logged once with which, and counted.
        A change writes them back (``PolicyWriter.read``, ``store_writer``)."""
        base, base_news = self._part("base", lambda: self._stored_base(reader))
        overrides, overrides_news = self._part("overrides", lambda: self._stored_overrides(reader))
        pin, pin_news = self._part("pin", lambda: self._stored_pin(reader))
        if base is not None and overrides is not None and pin is not None:
            return StoredParts(base, overrides, pin or None, rebuilt=False)
        in_force = self.current_in(reader)
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
        return StoredParts(
            base,
            overrides if overrides is not None else overrides_of(in_force),
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
        """The base as stored; ``WireError`` if over the store's bounds or damaged."""
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
            return _overrides_parsed(reader.hgetall(key))
        except redis.ResponseError as exc:
            raise _wrong_type_error(wrong_type(exc, reader, key), key, "overrides") from None

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

    def current_in(self, reader: RedisClient | Pipeline) -> PolicyDocument | None:
        version = self.pointer(reader)
        return None if version is None else self.document(reader, version)

    def pointer(self, reader: RedisClient | Pipeline) -> int | None:
        """The version the ``current`` pointer names (None: no pointer). One refused (no
        version number, over ``MAX_POINTER_BYTES``, of another type) reads as the newest
        readable kept version, or as none in force if no kept one reads (then a Redis that
        lost the policy: restored, or the defaults published); logged once, counted, and
        written back by the next publication, which every one writes."""
        key = self.keys.policy_current
        version, news = self._part("current", lambda: stored_pointer(reader, key))
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
        readable = (self.document(reader, int(v)) for v in listed)
        return next((doc for doc in readable if doc is not None), None)


def _overrides_parsed(raw: Mapping[bytes | str, bytes | str]) -> dict[str, dict[str, float]]:
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
            apply_override(PolicyDocument(version=0).default, values)
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


def overrides_of(doc: PolicyDocument | None) -> dict[str, dict[str, float]]:
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
    """The string at ``key`` (None: absent or empty), never read whole past ``limit``
    (``read_bounded_string``; the agents' subscriber reads a document this way);
    ``WireError`` if it holds more or another type than a string."""
    try:
        return read_bounded_string(reader, key, limit)
    except StringTooLarge as exc:
        raise WireError(f"{what} of {exc.size} bytes > limit {limit} (not read)") from None
    except WrongType as exc:
        raise _wrong_type_error(exc, key, what) from None


def stored_pointer(reader: RedisClient | Pipeline, key: str) -> int:
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


def _wrong_type_error(exc: WrongType, key: str, what: str) -> WireError:
    return WireError(f"{what}: {key} is a {exc.held} (not read)")


def apply_override(params: CategoryParams, values: Mapping[str, Any]) -> CategoryParams:
    data = params.model_dump()
    data.update(values)
    data["source"] = "override"
    return CategoryParams.model_validate(data)


def _s(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v

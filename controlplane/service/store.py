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
overrides applied on top. Every read of a stored document or part (the base, the
overrides, the pin, the ``current`` pointer) goes through ``StoredStateReader``
(``controlplane.service.stored_state``), held to the bounds of what this store writes: a
part refused there is read as the document in force holds it, so one damaged key never
stops a publication nor drops a pin, and the next publication writes it back; a ``current``
pointer refused is written back at once by ``rewrite_pointer``. A failed Redis call is
recorded in the ``RedisHealth``. It must never fit anything, talk HTTP, or read a stored
document or part but through its reader (it reads only the hold flag and the version index
itself, inside its transactions).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final, Protocol, cast

import redis
from redis.client import Pipeline

from agent.policy_document import (
    DEFAULT_SUPERSEDE,
    EVICTOR_FAMILIES,
    CategoryParams,
    EvictorFamily,
    PolicyDocument,
    SupersedeRule,
)
from agent.runtime.connection import RedisClient
from agent.wire import MAX_CATEGORY_NAME_CHARS, Keys, WireError, encode_policy
from controlplane.service.health import RedisHealth, guarded
from controlplane.service.metrics import StoredPart
from controlplane.service.stored_state import (
    OVERRIDE_FIELDS,
    StoredStateReader,
    apply_override,
    family_named,
    overrides_of,
    stored_pointer,
)
from controlplane.service.stored_state import Base as Base
from controlplane.service.stored_state import StoreError as StoreError

log = logging.getLogger(__name__)

HISTORY_SIZE: Final = 100
"""Default count of the policy versions kept (the controller's ``history_size``)."""
MAX_OVERRIDES: Final = 256
"""Default bound of the overrides kept at once (a bound on every document's size)."""
MAX_FITTED_CATEGORIES: Final = 2048
"""Default bound of the categories a fit brings (the controller's ``max_categories``: its
statistics window holds no more)."""


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


REFITS_HELD = "held: after a rollback; POST /v1/policy/refit"
"""Why an automatic refit publishes nothing while refits are held."""

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
class EvictorState:
    """The evictor family: in force (the current document's), pinned by an operator
    (None: not pinned), selected by the controller (what applies when not pinned)."""

    in_force: EvictorFamily | None
    pinned: EvictorFamily | None
    selected: EvictorFamily
    families: tuple[str, ...] = EVICTOR_FAMILIES


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
        history_size: int = HISTORY_SIZE,
        *,
        supersede: SupersedeRule = DEFAULT_SUPERSEDE,
        max_overrides: int = MAX_OVERRIDES,
        max_categories: int = MAX_FITTED_CATEGORIES,
        health: RedisHealth | None = None,
        memory: Remembers | None = None,
        on_refused: Callable[[StoredPart], None] | None = None,
    ) -> None:
        self.r = client
        self.keys = keys
        self.history_size = history_size
        self.supersede = supersede
        """The supersede rule every document published carries (the controller's setting)."""
        self.max_overrides = max_overrides
        self.stored = StoredStateReader(
            keys,
            history_size=history_size,
            max_overrides=max_overrides,
            max_categories=max_categories,
            on_refused=on_refused,
        )
        """Reads the stored state back within this store's bounds (and what it refused)."""
        self.health = health or RedisHealth("redis")
        self.memory = memory
        """Told each publication right after it (in the order published), so that what a
        replica itself changed is known before any read."""

    # --- reads ---------------------------------------------------------------------------
    @guarded
    def current_version(self) -> int | None:
        """The version in force (None: none); see ``StoredStateReader.pointer``."""
        return self.stored.pointer(self.r)

    @guarded
    def current(self) -> PolicyDocument | None:
        v = self.current_version()
        return None if v is None else self.get(v)

    @guarded
    def get(self, version: int) -> PolicyDocument | None:
        """The document of ``version``; None if it is not stored, or is refused."""
        return self.stored.document(self.r, version)

    def refusal(self, version: int) -> str | None:
        """Why the stored document of ``version`` was refused when last read (None: it was
        not, or not read since this store last refused a hundred others)."""
        return self.stored.refused.get(version)

    @guarded
    def versions(self) -> list[VersionInfo]:
        """Kept versions, newest first (but those refused: see ``get``)."""
        return [
            VersionInfo(doc.version, doc.created_at, doc.note, len(doc.categories))
            for doc in self.stored.kept_documents(self.r)
        ]

    @guarded
    def overrides(self) -> dict[str, dict[str, float]]:
        """The operator's overrides (see ``StoredStateReader.parts``: as the document in
        force holds them if the stored ones are refused)."""
        return self.stored.parts(self.r).overrides

    @guarded
    def base(self) -> Base:
        """The last fit (see ``StoredStateReader.parts``: as the document in force holds it
        if the stored one is refused)."""
        return self.stored.parts(self.r).base

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
        current = self.stored.pointer(self.r)
        if current is None:
            return None
        base, overrides, pin, _ = self.stored.parts(self.r)
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
                pinned = len(draft.overrides)
                raise TooManyOverrides(
                    f"{pinned:,} {'category is' if pinned == 1 else 'categories are'} pinned "
                    f"already, the most KVWISE_MAX_OVERRIDES ({self.max_overrides:,}) allows: "
                    "release one first"
                )
            merged = {**draft.overrides.get(category, {}), **values}
            in_force = self.stored.current_in(pipe)
            if draft.overrides.get(category) == merged and in_force is not None:
                raise _SameOverride(in_force)
            # Validate before storing: a bad override must never reach agents.
            apply_override(_params_for_override(draft, in_force, category), merged)
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
        if old is None and version in self.stored.refused:
            raise StoreError(f"version {version} is refused: {self.stored.refused[version]}")
        if old is None:
            raise StoreError(f"version {version} is not kept (see GET /v1/policy/versions)")
        restored = overrides_of(old)

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
        current, parts = self.current(), self.stored.parts(self.r)
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
        if current is not None and self.stored.parts(self.r).pin == chosen:
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
            if self.stored.pointer(pipe) is not None:
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

        return self._publish_unless_in_force(prepare)

    @property
    def pointer_refused(self) -> bool:
        """Whether the ``current`` pointer was refused when last read."""
        return self.stored.pointer_refused

    @guarded
    def rewrite_pointer(self) -> PolicyDocument | None:
        """Publish the state in force again while the ``current`` pointer is refused: the
        agents cannot follow it, and a refit whose parameters did not move publishes
        nothing; None (nothing written) once it reads."""

        def prepare(pipe: Pipeline) -> _Draft:
            try:
                stored_pointer(pipe, self.keys.policy_current)
            except WireError as exc:
                return self._read(pipe, f"current pointer written back ({exc.reason})")
            raise _AlreadyInForce

        return self._publish_unless_in_force(prepare)

    @guarded
    def release_hold(self) -> None:
        self.r.delete(self.keys.policy_hold)

    # --- the transaction -------------------------------------------------------------------
    def _read(self, pipe: Pipeline, note: str, *, restoring: bool = False) -> _Draft:
        """What a change starts from, read through ``pipe`` after its WATCH; ``PolicyLost``
        while Redis has lost the state this replica remembers (but for its restore)."""
        lost = self.memory is not None and self.memory.state is not None
        if lost and not restoring and self.stored.pointer(pipe) is None:
            raise PolicyLost(
                "Redis has lost the policy state (restarted empty?): the leader restores "
                "it within restore_wait_s; try again then"
            )
        base, overrides, pin, rebuilt = self.stored.parts(pipe)
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

    def _publish_unless_in_force(self, prepare: Prepare) -> PolicyDocument | None:
        """``_publish``, or None (nothing written) where ``prepare`` finds the state it was
        to write in force already (``_AlreadyInForce``)."""
        try:
            return self._publish(prepare)
        except _AlreadyInForce:
            return None

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
        fields["supersede"] = self.supersede
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


def _overrides_written(
    key: str, overrides: Mapping[str, Mapping[str, float]]
) -> Callable[[Pipeline], None]:
    """The writes that make the hash at ``key`` hold ``overrides`` and nothing else."""

    def write(pipe: Pipeline) -> None:
        pipe.delete(key)
        for name, values in overrides.items():
            pipe.hset(key, name, json.dumps(values))

    return write


def _composed(
    base: Base, overrides: Mapping[str, Mapping[str, float]]
) -> tuple[dict[str, CategoryParams], CategoryParams | None]:
    cats = dict(base.categories)
    for name, values in overrides.items():
        start = cats.get(name) or base.default or PolicyDocument(version=0).default
        cats[name] = apply_override(start, values)
    return cats, base.default


def _params_for_override(
    draft: _Draft, current: PolicyDocument | None, category: str
) -> CategoryParams:
    if category in draft.base.categories:
        return draft.base.categories[category]
    if current is not None:
        return current.params_for(category)
    return draft.base.default or PolicyDocument(version=0).default

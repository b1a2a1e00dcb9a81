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
recorded in the ``RedisHealth``.

This module owns ``PolicyStore``, its reads and what each change reads and writes; the
transaction that runs a change is ``store_writer``'s (``PolicyWriter``), and the store's
bounds, errors and the values it returns are ``store_terms``'. It must never fit anything,
talk HTTP, or read a stored document or part but through its reader (it reads only the
hold flag and the version index itself, inside its transactions).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from redis.client import Pipeline

from agent.policy_document import (
    DEFAULT_SUPERSEDE,
    CategoryParams,
    PolicyDocument,
    SupersedeRule,
)
from agent.runtime.connection import RedisClient
from agent.wire import MAX_CATEGORY_NAME_CHARS, Keys, WireError
from controlplane.service.health import RedisHealth, guarded
from controlplane.service.metrics import StoredPart
from controlplane.service.store_terms import (
    HISTORY_SIZE,
    MAX_FITTED_CATEGORIES,
    MAX_OVERRIDES,
    REFITS_HELD,
    Change,
    EvictorState,
    Fence,
    RefitsHeld,
    Remembers,
    StoreState,
    TooManyOverrides,
    VersionInfo,
)
from controlplane.service.store_writer import (
    AlreadyInForce,
    Draft,
    PolicyWriter,
    composed,
    overrides_written,
)
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
        self._writer = PolicyWriter(client, keys, self.stored, memory, history_size, supersede)
        """Runs each change as one optimistic transaction and publishes it."""

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

    def kept(self, version: int) -> PolicyDocument:
        """The document of ``version``, or a ``StoreError`` saying why not (refused, or not
        kept): the one wording of both, for reading a version and for rolling back to it."""
        doc = self.get(version)
        if doc is not None:
            return doc
        refused = self.refusal(version)
        if refused is not None:
            raise StoreError(f"stored version {version} refused: {refused}")
        raise StoreError(f"version {version} is not kept (see GET /v1/policy/versions)")

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
        cats, fallback = composed(Base(dict(categories), default), self.overrides())
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

        def prepare(pipe: Pipeline) -> Draft:
            draft = self._writer.read(pipe, note)
            if unless_held and draft.held:
                raise RefitsHeld(REFITS_HELD)
            draft.lowest_version = after + 1
            self._writer.set_base(draft, Base(dict(categories), default, draft.base.evictor))
            return draft

        return self._writer.publish(prepare, fence)

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

        def prepare(pipe: Pipeline) -> Draft:
            draft = self._writer.read(pipe, "")
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
                raise _OverrideInForce(in_force)
            # Validate before storing: a bad override must never reach agents.
            apply_override(_params_for_override(draft, in_force, category), merged)
            draft.overrides[category] = merged
            draft.note = f"override {category}: {json.dumps(merged, sort_keys=True)}"
            text = json.dumps(merged)
            draft.writes.append(lambda p: p.hset(self.keys.overrides, category, text))
            return draft

        return self._publish_override_change(prepare)

    @guarded
    def delete_override(self, category: str) -> Change:
        """Release the category's override and publish; releasing no override publishes
        nothing (as releasing no evictor pin): the document in force comes back."""

        def prepare(pipe: Pipeline) -> Draft:
            draft = self._writer.read(pipe, f"override {category} removed")
            in_force = self.stored.current_in(pipe)
            if category not in draft.overrides and in_force is not None:
                raise _OverrideInForce(in_force)
            draft.overrides.pop(category, None)
            draft.writes.append(lambda p: p.hdel(self.keys.overrides, category))
            return draft

        return self._publish_override_change(prepare)

    def _publish_override_change(self, prepare: Callable[[Pipeline], Draft]) -> Change:
        """Publish what ``prepare`` drafts, or nothing when it finds the change in force
        already (it raises ``_OverrideInForce``): then the document in force comes back."""
        try:
            return Change(self._writer.publish(prepare), published=True)
        except _OverrideInForce as same:
            return Change(same.document, published=False)

    @guarded
    def rollback(self, version: int, *, hold: bool = False) -> PolicyDocument:
        """Publish a new version carrying ``version``'s parameters and family.

        The overrides become those ``version`` carried (each category it shows as
        ``override``, at its values then), so the list and the document agree; under
        them the base keeps the fit in force now (what removing one falls back to). Its
        family becomes the controller's selection, unless it is the operator's pin in
        force now (a pin is not a selection: releasing it lets the selection apply
        again). With ``hold``, automatic refits stop publishing until a manual refit."""
        old = self.kept(version)
        restored = overrides_of(old)

        def prepare(pipe: Pipeline) -> Draft:
            draft = self._writer.read(
                pipe, f"rollback to version {version}" + (", held" if hold else "")
            )
            ran_by_the_pin = draft.pin is not None and old.evictor == draft.pin
            selection = draft.base.evictor if ran_by_the_pin else old.evictor
            fitted = {n: p for n, p in old.categories.items() if n not in restored}
            fitted |= {n: p for n, p in draft.base.categories.items() if n in restored}
            self._writer.set_base(draft, Base(fitted, old.default, selection))
            draft.overrides, draft.copy_of = restored, old
            draft.writes.append(overrides_written(self.keys.overrides, restored))
            if hold:
                draft.held = True
                draft.writes.append(lambda p: p.set(self.keys.policy_hold, str(version)))
            return draft

        return self._writer.publish(prepare)

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

        def prepare(pipe: Pipeline) -> Draft:
            draft = self._writer.read(pipe, note)
            self._writer.set_base(draft, replace(draft.base, evictor=chosen))
            return draft

        return self._writer.publish(prepare, fence)

    @guarded
    def pin_evictor(self, family: str | None) -> Change:
        """Pin the evictor family (None: release the pin, the selection applies again).
        Pinning the family already pinned, or releasing no pin, publishes nothing: the
        document in force comes back."""
        chosen = None if family is None else family_named(family)
        current = self.current()
        if current is not None and self.stored.parts(self.r).pin == chosen:
            return Change(current, published=False)

        def prepare(pipe: Pipeline) -> Draft:
            draft = self._writer.read(pipe, f"evictor family pinned to {chosen}")
            if chosen is None:
                draft.note = "evictor family pin released"
                draft.writes.append(lambda p: p.delete(self.keys.evictor_pin))
            else:
                draft.writes.append(lambda p: p.set(self.keys.evictor_pin, chosen))
            draft.pin = chosen
            return draft

        return Change(self._writer.publish(prepare), published=True)

    @guarded
    def restore(self, state: StoreState, *, after: int = 0) -> PolicyDocument | None:
        """Write ``state`` back into a Redis that lost it (restarted empty) and publish it
        as a version numbered after both ``state.version`` and ``after`` (the highest
        version known to have been published: a number agents may hold already must never
        name another document); None (no write) if a version is in force by then."""

        def prepare(pipe: Pipeline) -> Draft:
            note = f"restored after Redis lost its state: {state.describe()}"
            draft = self._writer.read(pipe, note, restoring=True)
            if self.stored.pointer(pipe) is not None:
                raise AlreadyInForce
            self._writer.set_base(draft, state.base)
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

        return self._writer.publish_unless_in_force(prepare)

    @property
    def pointer_refused(self) -> bool:
        """Whether the ``current`` pointer was refused when last read."""
        return self.stored.pointer_refused

    @guarded
    def rewrite_pointer(self) -> PolicyDocument | None:
        """Publish the state in force again while the ``current`` pointer is refused: the
        agents cannot follow it, and a refit whose parameters did not move publishes
        nothing; None (nothing written) once it reads."""

        def prepare(pipe: Pipeline) -> Draft:
            try:
                stored_pointer(pipe, self.keys.policy_current)
            except WireError as exc:
                return self._writer.read(pipe, f"current pointer written back ({exc.reason})")
            raise AlreadyInForce

        return self._writer.publish_unless_in_force(prepare)

    @guarded
    def release_hold(self) -> None:
        self.r.delete(self.keys.policy_hold)


class _OverrideInForce(Exception):
    """An override change in force already (the same pin, or no pin to release): nothing
    to publish; ``document`` is in force."""

    def __init__(self, document: PolicyDocument) -> None:
        super().__init__()
        self.document = document


def _params_for_override(
    draft: Draft, current: PolicyDocument | None, category: str
) -> CategoryParams:
    if category in draft.base.categories:
        return draft.base.categories[category]
    if current is not None:
        return current.params_for(category)
    return draft.base.default or PolicyDocument(version=0).default

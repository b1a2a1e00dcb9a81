"""The policy store's transaction: one change read, composed and written as one optimistic
transaction, then the notice sent.

Owns ``PolicyWriter``: it WATCHes the policy keys, reads what a change starts from
(``read``: a ``Draft``), lets the change say what it writes (``Prepare``), composes the
document (the base plus the overrides read, or a rollback's copy) numbered after every
version known, asks the fence, writes it all in MULTI/EXEC with the old versions past the
history trimmed, and starts again if another writer got there first (``publish``); then
it tells the replica's memory and PUBLISHes the notice. Also the pure pieces of a
document's composition (``composed``, ``overrides_written``). It must never decide what a
change is (``store``'s changes do), read a stored document or part but through the
``StoredStateReader``, fit anything or talk HTTP.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import redis
from redis.client import Pipeline

from agent.policy_document import (
    DEFAULT_SUPERSEDE,
    CategoryParams,
    EvictorFamily,
    PolicyDocument,
    SupersedeRule,
)
from agent.runtime.connection import RedisClient
from agent.wire import Keys, encode_policy
from controlplane.service.store_terms import (
    Fence,
    LeaseLost,
    PolicyLost,
    Remembers,
    StoreState,
)
from controlplane.service.stored_state import Base, StoredStateReader, apply_override

log = logging.getLogger(__name__)


@dataclass
class Draft:
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


Prepare = Callable[[Pipeline], Draft]


@dataclass(frozen=True)
class PolicyWriter:
    """Runs the store's changes as optimistic transactions (see the module's docstring),
    with the store's own client, keys, reader, memory and history bound."""

    r: RedisClient
    keys: Keys
    stored: StoredStateReader
    memory: Remembers | None
    """Told each publication right after it (``PolicyStore.memory``)."""
    history_size: int
    supersede: SupersedeRule = DEFAULT_SUPERSEDE
    """The supersede rule every document published carries (the controller's setting)."""

    def read(self, pipe: Pipeline, note: str, *, restoring: bool = False) -> Draft:
        """What a change starts from, read through ``pipe`` after its WATCH; ``PolicyLost``
        while Redis has lost the state this replica remembers (but for its restore)."""
        lost = self.memory is not None and self.memory.state is not None
        if lost and not restoring and self.stored.pointer(pipe) is None:
            raise PolicyLost(
                "Redis has lost the policy state (restarted empty?): the leader restores "
                "it within restore_wait_s; try again then"
            )
        base, overrides, pin, rebuilt = self.stored.parts(pipe)
        draft = Draft(base, overrides, note, pin=pin)
        if rebuilt:  # read as the document in force holds them: written back
            self.set_base(draft, base)
            draft.writes.append(overrides_written(self.keys.overrides, overrides))
            draft.writes.append(self._pin_written(pin))
        draft.held = bool(pipe.exists(self.keys.policy_hold))
        return draft

    def _pin_written(self, pin: EvictorFamily | None) -> Callable[[Pipeline], object]:
        """The write that makes the stored pin ``pin`` (None: no pin)."""
        key = self.keys.evictor_pin
        return lambda p: p.delete(key) if pin is None else p.set(key, pin)

    def set_base(self, draft: Draft, base: Base) -> None:
        """``draft`` publishes ``base`` and stores it as the base."""
        draft.base = base
        draft.writes.append(lambda p: p.set(self.keys.policy_base, base.to_json()))

    def publish(self, prepare: Prepare, fence: Fence | None = None) -> PolicyDocument:
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

    def publish_unless_in_force(self, prepare: Prepare) -> PolicyDocument | None:
        """``publish``, or None (nothing written) where ``prepare`` finds the state it was
        to write in force already (``AlreadyInForce``)."""
        try:
            return self.publish(prepare)
        except AlreadyInForce:
            return None

    def _notify(self, version: int) -> None:
        """The notice on the channel, after the transaction (a cluster pipeline cannot
        PUBLISH): a hint only, agents poll ``current`` anyway."""
        try:
            self.r.publish(self.keys.policy_channel, str(version))
        except redis.RedisError as exc:
            log.debug("notice of v%d not sent (%s): agents will poll it", version, exc)

    def _compose(self, pipe: Pipeline, draft: Draft) -> tuple[PolicyDocument, list[int]]:
        """The document ``draft`` publishes and the old versions it pushes out."""
        top = cast(list[bytes], pipe.zrevrange(self.keys.policy_versions, 0, 0))
        seen = self.memory.highest_version + 1 if self.memory is not None else 1
        version = max(int(top[0]) + 1 if top else 1, draft.lowest_version, seen)
        default: CategoryParams | None
        if draft.copy_of is not None:
            cats, default = dict(draft.copy_of.categories), draft.copy_of.default
        else:
            cats, default = composed(draft.base, draft.overrides)
        fields: dict[str, Any] = {"version": version, "categories": cats}
        fields["evictor"] = draft.pin or draft.base.evictor
        fields["supersede"] = self.supersede
        fields.update(note=draft.note[:500], created_at=time.time())
        if default is not None:
            fields["default"] = default
        kept = cast(list[bytes], pipe.zrange(self.keys.policy_versions, 0, -1))
        drop = [int(v) for v in kept][: max(0, len(kept) + 1 - self.history_size)]
        return PolicyDocument(**fields), drop


def _state_of(doc: PolicyDocument, draft: Draft) -> StoreState:
    """The store's state once ``draft`` is published as ``doc``."""
    return StoreState(doc.version, draft.base, dict(draft.overrides), draft.pin, draft.held)


class AlreadyInForce(Exception):
    """A restore found a version in force, or a pointer to write back reads: nothing to
    write."""


def overrides_written(
    key: str, overrides: Mapping[str, Mapping[str, float]]
) -> Callable[[Pipeline], None]:
    """The writes that make the hash at ``key`` hold ``overrides`` and nothing else."""

    def write(pipe: Pipeline) -> None:
        pipe.delete(key)
        for name, values in overrides.items():
            pipe.hset(key, name, json.dumps(values))

    return write


def composed(
    base: Base, overrides: Mapping[str, Mapping[str, float]]
) -> tuple[dict[str, CategoryParams], CategoryParams | None]:
    """The categories ``base`` fitted with ``overrides`` applied, and its default. A
    category pinned before any fit of its own starts from the default's parameters, but
    none of its samples or fit quality: no access of it was seen."""
    cats = dict(base.categories)
    for name, values in overrides.items():
        start = cats.get(name) or _unfitted(base.default or PolicyDocument(version=0).default)
        cats[name] = apply_override(start, values)
    return cats, base.default


def _unfitted(default: CategoryParams) -> CategoryParams:
    return default.model_copy(update={"samples": 0, "fit_quality": None})

"""The policy store in Redis: immutable versions, the ``current`` pointer, overrides, rollback.

Owns every write of policy state. A version is published in one optimistic transaction
(WATCH the version index, MULTI, EXEC): the document, its index entry, the ``current``
pointer and the notice on the channel land together or not at all, so versions are
strictly increasing even with several controller replicas or concurrent REST calls.
Versions are never rewritten; a rollback publishes a *new* version with an old version's
parameters, so agents only ever move forward. History is bounded (oldest trimmed, never
the current one). Everything lives in Redis: a controller restart loses nothing.

A published document is ``base`` (the last fitted parameters) with the operator's
overrides applied on top. It must never fit anything or talk HTTP.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

import redis

from agent.policy_document import CategoryParams, PolicyDocument
from agent.wire import Keys, decode_policy, encode_policy

OVERRIDE_FIELDS = ("rate", "p_reuse", "life_s")


class StoreError(RuntimeError):
    """A store operation that cannot be done as asked (e.g. unknown version)."""


@dataclass(frozen=True)
class VersionInfo:
    version: int
    created_at: float
    note: str
    categories: int


@dataclass(frozen=True)
class Base:
    """The parameters the last fit produced, before overrides."""

    categories: dict[str, CategoryParams]
    default: CategoryParams | None


class PolicyStore:
    def __init__(self, client: redis.Redis, keys: Keys, history_size: int = 100) -> None:
        self.r = client
        self.keys = keys
        self.history_size = history_size
        self._base_key = keys.prefix + "policy:base"
        self._hold_key = keys.prefix + "policy:hold"

    # --- reads ---------------------------------------------------------------------------
    def current_version(self) -> int | None:
        raw = self.r.get(self.keys.policy_current)
        return int(raw) if raw is not None else None

    def current(self) -> PolicyDocument | None:
        v = self.current_version()
        return None if v is None else self.get(v)

    def get(self, version: int) -> PolicyDocument | None:
        raw = self.r.get(self.keys.policy_doc(version))
        return None if raw is None else decode_policy(raw)

    def versions(self) -> list[VersionInfo]:
        """Kept versions, newest first."""
        listed = cast(list[bytes], self.r.zrevrange(self.keys.policy_versions, 0, -1))
        nums = [int(v) for v in listed]
        if not nums:
            return []
        raws = self.r.mget([self.keys.policy_doc(v) for v in nums])
        out = []
        for raw in raws:
            if raw is None:
                continue
            doc = decode_policy(raw)
            out.append(VersionInfo(doc.version, doc.created_at, doc.note, len(doc.categories)))
        return out

    def overrides(self) -> dict[str, dict[str, float]]:
        raw = self.r.hgetall(self.keys.overrides)
        return {_s(k): json.loads(v) for k, v in raw.items()}

    def base(self) -> Base:
        raw = self.r.get(self._base_key)
        if raw is None:
            return Base({}, None)
        data = json.loads(raw)
        cats = {k: CategoryParams.model_validate(v) for k, v in data["categories"].items()}
        default = data.get("default")
        return Base(cats, None if default is None else CategoryParams.model_validate(default))

    def held(self) -> bool:
        """Whether automatic refits are held back (after a rollback with ``hold``)."""
        return bool(self.r.exists(self._hold_key))

    # --- writes --------------------------------------------------------------------------
    def publish_fit(
        self, categories: Mapping[str, CategoryParams], default: CategoryParams | None, note: str
    ) -> PolicyDocument:
        """Record a new fit as the base and publish base + overrides."""
        payload = {
            "categories": {k: v.model_dump() for k, v in categories.items()},
            "default": None if default is None else default.model_dump(),
        }
        self.r.set(self._base_key, json.dumps(payload))
        return self._publish(note)

    def set_override(self, category: str, values: Mapping[str, float]) -> PolicyDocument:
        unknown = set(values) - set(OVERRIDE_FIELDS)
        if unknown or not values:
            raise StoreError(f"override takes any of {', '.join(OVERRIDE_FIELDS)}")
        merged = {**self.overrides().get(category, {}), **values}
        # Validate before storing: a bad override must never reach agents.
        self._apply_one(self._params_for_override(category), merged)
        self.r.hset(self.keys.overrides, category, json.dumps(merged))
        return self._publish(f"override {category}: {json.dumps(merged, sort_keys=True)}")

    def delete_override(self, category: str) -> PolicyDocument:
        if not self.r.hdel(self.keys.overrides, category):
            raise StoreError(f"no override for category {category!r}")
        return self._publish(f"override {category} removed")

    def rollback(self, version: int, *, hold: bool = False) -> PolicyDocument:
        """Publish a new version carrying ``version``'s parameters.

        With ``hold``, automatic refits stop publishing until a manual refit."""
        old = self.get(version)
        if old is None:
            raise StoreError(f"version {version} is not kept (see GET /v1/policy/versions)")
        payload = {
            "categories": {k: v.model_dump() for k, v in old.categories.items()},
            "default": old.default.model_dump(),
        }
        self.r.set(self._base_key, json.dumps(payload))
        self.r.delete(self.keys.overrides)
        if hold:
            self.r.set(self._hold_key, str(version))
        return self._publish(f"rollback to version {version}", copy_of=old)

    def release_hold(self) -> None:
        self.r.delete(self._hold_key)

    # --- internals -----------------------------------------------------------------------
    def _params_for_override(self, category: str) -> CategoryParams:
        base = self.base()
        if category in base.categories:
            return base.categories[category]
        cur = self.current()
        if cur is not None:
            return cur.params_for(category)
        return base.default or PolicyDocument(version=0).default

    @staticmethod
    def _apply_one(params: CategoryParams, values: Mapping[str, Any]) -> CategoryParams:
        data = params.model_dump()
        data.update(values)
        data["source"] = "override"
        return CategoryParams.model_validate(data)

    def _compose(self) -> tuple[dict[str, CategoryParams], CategoryParams | None]:
        base = self.base()
        cats = dict(base.categories)
        for name, values in self.overrides().items():
            start = cats.get(name) or base.default or PolicyDocument(version=0).default
            cats[name] = self._apply_one(start, values)
        return cats, base.default

    def _publish(self, note: str, copy_of: PolicyDocument | None = None) -> PolicyDocument:
        default: CategoryParams | None
        if copy_of is not None:
            cats, default = dict(copy_of.categories), copy_of.default
        else:
            cats, default = self._compose()
        k = self.keys
        with self.r.pipeline() as pipe:
            while True:
                try:
                    pipe.watch(k.policy_versions)  # type: ignore[no-untyped-call]
                    top = cast(list[bytes], pipe.zrevrange(k.policy_versions, 0, 0))
                    version = int(top[0]) + 1 if top else 1
                    fields: dict[str, Any] = {"version": version, "categories": cats}
                    fields["note"] = note[:500]
                    fields["created_at"] = time.time()
                    if default is not None:
                        fields["default"] = default
                    doc = PolicyDocument(**fields)
                    kept = cast(list[bytes], pipe.zrange(k.policy_versions, 0, -1))
                    drop = [int(v) for v in kept][: max(0, len(kept) + 1 - self.history_size)]
                    pipe.multi()
                    pipe.set(k.policy_doc(version), encode_policy(doc))
                    pipe.zadd(k.policy_versions, {str(version): version})
                    pipe.set(k.policy_current, str(version))
                    for v in drop:
                        pipe.zrem(k.policy_versions, str(v))
                        pipe.delete(k.policy_doc(v))
                    pipe.publish(k.policy_channel, str(version))
                    pipe.execute()
                    return doc
                except redis.WatchError:
                    continue


def _s(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v

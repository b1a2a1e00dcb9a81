"""Name -> policy factory. Policies register themselves; callers never dispatch on names.

Owns the mapping and the error for unknown names. It must never import a policy module
itself (``agent.policies`` does that once), so the registry has no dependency cycle.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from agent.policies.base import EvictionPolicy
from agent.unknown_names import unknown_name

PolicyFactory = Callable[[int], EvictionPolicy]
"""Builds a policy for a cache of ``capacity`` blocks."""

_F = TypeVar("_F", bound=PolicyFactory)
_REGISTRY: dict[str, PolicyFactory] = {}


class UnknownPolicyError(KeyError):
    """Raised for a policy name nobody registered; the message lists the known ones, the
    name a slip was meant as first (``unknown_name``)."""

    def __init__(self, name: str, known: list[str]) -> None:
        super().__init__(name)
        self.name = name
        self.known = known

    def __str__(self) -> str:
        return unknown_name("policy", self.name, self.known)


def register(name: str) -> Callable[[_F], _F]:
    """Class or function decorator: make ``name`` build this policy."""

    def deco(factory: _F) -> _F:
        if name in _REGISTRY and _REGISTRY[name] is not factory:
            raise ValueError(f"policy name {name!r} is already registered")
        _REGISTRY[name] = factory
        return factory

    return deco


def names() -> list[str]:
    """Registered policy names, in registration order."""
    return list(_REGISTRY)


def factory(name: str) -> PolicyFactory:
    """The factory registered under ``name``; ``UnknownPolicyError`` otherwise."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownPolicyError(name, names()) from None


def create(name: str, capacity: int) -> EvictionPolicy:
    """A fresh policy ``name`` for a cache of ``capacity`` blocks."""
    return factory(name)(capacity)

"""Which instance serves a request: the ``Router`` Protocol and its registry.

Owns the routing rules, one class each, registered by name:

- ``round-robin``: request ``k`` (in arrival order) goes to instance ``k mod N``;
- ``least-loaded``: the instance with the fewest requests queued or running (ties: the
  lowest index);
- ``prefix``: the instance holding the longest resident prefix of the request (ties:
  the least loaded), unless it has more than ``slack`` requests more than the least
  loaded instance, which then gets it (cache-aware routing with a balance guard);
- ``session``: every request of one conversation goes where its first turn went (the
  least loaded instance then). A conversation is a chain of ``parent_chat_id``; a trace
  without chat ids keys requests by their first block (their system prompt).

A router sees the fleet only through ``Fleet`` (loads and resident prefixes). It must
never change instances or the cache.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

from controlplane.traces.model import Trace

DEFAULT_SLACK = 16
"""``prefix``: the most requests a prefix-matched instance may have beyond the least
loaded one before the request goes to the least loaded one instead."""


class UnknownRouterError(KeyError):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name

    def __str__(self) -> str:
        return f"unknown router {self.name!r}; known routers: {', '.join(names())}"


class Fleet(Protocol):
    """What a router may look at."""

    def loads(self) -> list[int]:
        """Requests queued or running on each instance."""

    def matched(self, instance: int, request: int) -> int:
        """Blocks of ``request``'s prefix resident on ``instance``."""


class Router(Protocol):
    def route(self, request: int) -> int:
        """The instance that serves ``request`` (called in arrival order)."""


RouterFactory = Callable[[Trace, Fleet, int, int], Router]
"""Builds a router for a trace, a fleet of ``n`` instances and a ``slack``."""

_F = TypeVar("_F", bound=RouterFactory)
_ROUTERS: dict[str, RouterFactory] = {}


def register(name: str) -> Callable[[_F], _F]:
    def deco(factory: _F) -> _F:
        _ROUTERS[name] = factory
        return factory

    return deco


def names() -> list[str]:
    return list(_ROUTERS)


def create(name: str, trace: Trace, fleet: Fleet, n: int, slack: int = DEFAULT_SLACK) -> Router:
    if name not in _ROUTERS:
        raise UnknownRouterError(name)
    return _ROUTERS[name](trace, fleet, n, slack)


def least_loaded(loads: list[int]) -> int:
    return loads.index(min(loads))


@register("round-robin")
class RoundRobin:
    def __init__(self, trace: Trace, fleet: Fleet, n: int, slack: int) -> None:
        self._n = n
        self._next = 0

    def route(self, request: int) -> int:
        i = self._next
        self._next = (i + 1) % self._n
        return i


@register("least-loaded")
class LeastLoaded:
    def __init__(self, trace: Trace, fleet: Fleet, n: int, slack: int) -> None:
        self._fleet = fleet

    def route(self, request: int) -> int:
        return least_loaded(self._fleet.loads())


@register("prefix")
class PrefixAffinity:
    def __init__(self, trace: Trace, fleet: Fleet, n: int, slack: int) -> None:
        self._fleet = fleet
        self._n = n
        self._slack = slack

    def route(self, request: int) -> int:
        loads = self._fleet.loads()
        lightest = least_loaded(loads)
        matched = [self._fleet.matched(i, request) for i in range(self._n)]
        best = max(range(self._n), key=lambda i: (matched[i], -loads[i], -i))
        if matched[best] == 0 or loads[best] - loads[lightest] > self._slack:
            return lightest
        return best


@register("session")
class SessionAffinity:
    def __init__(self, trace: Trace, fleet: Fleet, n: int, slack: int) -> None:
        self._fleet = fleet
        self._keys = session_keys(trace)
        self._home: dict[int, int] = {}

    def route(self, request: int) -> int:
        key = self._keys[request]
        home = self._home.get(key)
        if home is None:
            home = least_loaded(self._fleet.loads())
            self._home[key] = home
        return home


def session_keys(trace: Trace) -> list[int]:
    """Per request, its conversation's key: the root chat id of its ``parent_chat_id``
    chain, or (no chat ids) ``-1 - first block``, so the two kinds never collide."""
    chats = trace.chat_ids.tolist()
    parents = trace.parent_chat_ids.tolist()
    starts = trace.offsets[:-1]
    first_blocks = trace.blocks[starts].tolist() if trace.n_accesses else []
    root: dict[int, int] = {}
    keys: list[int] = []
    for chat, parent, first in zip(chats, parents, first_blocks, strict=True):
        if chat < 0:
            keys.append(-1 - first)
            continue
        top = root.get(parent, parent) if parent >= 0 else chat
        root[chat] = top
        keys.append(top)
    return keys

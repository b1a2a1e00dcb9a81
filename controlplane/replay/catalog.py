"""Which policies a replay can run: every agent policy plus the offline ones.

Owns the name -> ``ReplayFactory`` lookup used by ``kvwise replay``. Agent policies come
from ``agent.policies`` (they need only a capacity); offline ones (bounds, fitted policies
with a replay-time refitter) register here and also receive the trace. It must never
hold per-run state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import agent.policies as agent_policies
from agent.policies.base import EvictionPolicy
from agent.policies.registry import UnknownPolicyError
from controlplane.replay.bounds import BeladyPolicy, InfinitePolicy
from controlplane.traces.model import Trace

ReplayFactory = Callable[[int, Trace], EvictionPolicy]
"""Builds a policy for a cache of ``capacity`` blocks that will replay ``trace``."""

_F = TypeVar("_F", bound=ReplayFactory)
_OFFLINE: dict[str, ReplayFactory] = {}
BOUNDS = ("belady", "inf")
"""Reference bounds, shown in every report."""


def register_offline(name: str) -> Callable[[_F], _F]:
    """Register a replay-only policy (it may read the trace)."""

    def deco(f: _F) -> _F:
        _OFFLINE[name] = f
        return f

    return deco


register_offline("belady")(BeladyPolicy)
register_offline("inf")(InfinitePolicy)


def names() -> list[str]:
    """Every runnable name: agent policies, then offline ones (bounds last)."""
    offline = [n for n in _OFFLINE if n not in BOUNDS]
    return [*agent_policies.names(), *offline, *BOUNDS]


def factory(name: str) -> ReplayFactory:
    if name in _OFFLINE:
        return _OFFLINE[name]
    try:
        agent_factory = agent_policies.factory(name)
    except UnknownPolicyError:
        raise UnknownPolicyError(name, names()) from None
    return lambda capacity, trace: agent_factory(capacity)


def create(name: str, capacity: int, trace: Trace) -> EvictionPolicy:
    return factory(name)(capacity, trace)

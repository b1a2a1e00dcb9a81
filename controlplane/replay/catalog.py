"""Which policies a replay can run: every agent policy plus the offline ones.

Owns the name -> ``ReplayFactory`` lookup used by ``kvwise replay``. Agent policies come
from ``agent.policies`` (they need only a capacity); offline ones (bounds, fitted policies
with a replay-time refitter) register here and also receive the trace and the run's
``ReplayOptions``. An offline name wins over the agent policy of the same name: ``wa`` and
``wa-ref`` replay fitted (``controlplane.replay.online``), not with built-in parameters.
It must never hold per-run state.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar, runtime_checkable

import agent.policies as agent_policies
from agent.policies.base import EvictionPolicy
from agent.policies.registry import UnknownPolicyError
from controlplane.replay import experts, mixture, online, pace, shared_rate, superseded
from controlplane.replay.bounds import BeladyPolicy, InfinitePolicy
from controlplane.replay.options import DEFAULT_OPTIONS, ReplayOptions
from controlplane.traces.model import Trace

ReplayFactory = Callable[[int, Trace, ReplayOptions], EvictionPolicy]
"""Builds a policy for a cache of ``capacity`` blocks that will replay ``trace``."""


@runtime_checkable
class TraceIndexed(Protocol):
    """An offline policy that knows which request of its trace it serves: a fitted one
    (the request's category, refits by trace time) or ``belady`` (next uses).

    The replay drives it through ``free``, one call per request in trace order, which
    counts requests. A driver whose requests finish out of order, or release only some of
    their blocks (the serving simulator), calls ``arrive`` for every request in trace
    order and ``free_request`` instead of ``free``.
    """

    def arrive(self, request: int) -> None:
        """Request ``request`` (trace order) has arrived; every earlier one has too."""

    def free_request(
        self, request: int, blocks: Sequence[int], offsets: Sequence[int], now: float
    ) -> None:
        """``free`` of some of request ``request``'s blocks (``offsets`` in its prompt)."""


_F = TypeVar("_F", bound=ReplayFactory)
_OFFLINE: dict[str, ReplayFactory] = {}
BOUNDS = ("belady", "inf")
"""Reference bounds: listed last, run with ``-p all`` and with every plot."""


def register_offline(name: str) -> Callable[[_F], _F]:
    """Register a replay-only policy (it may read the trace and the run's options)."""

    def deco(f: _F) -> _F:
        _OFFLINE[name] = f
        return f

    return deco


register_offline("wa")(online.fitted_wa)
register_offline("wa-ref")(online.fitted_wa_ref)
register_offline("wa-mix")(mixture.fitted_wa_mix)
register_offline("wa-pace")(pace.fitted_wa_pace)
register_offline("wa-superseded")(superseded.fitted_wa_superseded)
register_offline("wa-shared")(shared_rate.fitted_wa_shared)
register_offline("wa-regret")(experts.fitted_wa_regret)
register_offline("belady")(lambda capacity, trace, options: BeladyPolicy(capacity, trace))
register_offline("inf")(lambda capacity, trace, options: InfinitePolicy(capacity, trace))


def names() -> list[str]:
    """Every runnable name: agent policies, then offline ones (bounds last)."""
    agent_names = agent_policies.names()
    offline = [n for n in _OFFLINE if n not in BOUNDS and n not in agent_names]
    return [*agent_names, *offline, *BOUNDS]


def is_fitted(name: str) -> bool:
    """Whether ``name`` replays fitted from the trace (an offline policy, not a bound)."""
    return name in _OFFLINE and name not in BOUNDS


def factory(name: str) -> ReplayFactory:
    if name in _OFFLINE:
        return _OFFLINE[name]
    try:
        agent_factory = agent_policies.factory(name)
    except UnknownPolicyError:
        raise UnknownPolicyError(name, names()) from None
    return lambda capacity, trace, options: agent_factory(capacity)


def create(
    name: str, capacity: int, trace: Trace, options: ReplayOptions = DEFAULT_OPTIONS
) -> EvictionPolicy:
    return factory(name)(capacity, trace, options)

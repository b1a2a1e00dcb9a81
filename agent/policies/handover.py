"""Switching a cache from one eviction policy to another without losing a block.

Owns the optional abilities a family switch needs, declared as Protocols (tested with
``isinstance``): ``HandsOver`` (give up every block: the evictable ones in victim order,
and the ones in use) and ``Adopts`` (a fresh policy takes them), plus the two that hot
reload uses, ``ReloadsPolicy`` (``set_policy``) and ``NamesCategories``
(``add_category``), and ``hand_over``, the switch itself, written once for every caller
(the agent, the vLLM queue, replay). Also the steps the policies' own abilities share:
``drain`` (every ``hand_over``) and ``queue_up`` (the queue policies' ``adopt``).

What survives a switch: every cached block, and the order in which the moved blocks
would have been evicted (the new policy evicts them in the old policy's victim order
before any new access reorders them). What does not: each policy's own history (S3-FIFO's
ghost and counts, ARC's ghosts and target, LFU's frequencies, ``wa``'s stamps). A
baseline knows no access times, so ``wa`` files the blocks it adopts at the switch's time
in one queue of the document's default curve, in victim order. A switch that fails keeps
every block with the old policy, in its victim order. It must never do I/O or know which
family a caller wants.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection
from typing import NamedTuple, Protocol, runtime_checkable

from agent.policies.base import EvictionPolicy
from agent.policy_document import PolicyDocument


class Handover(NamedTuple):
    """Every block a policy held: ``evictable`` in victim order (first victim first) and
    ``in_use`` (touched, not yet freed: they join the new order when freed)."""

    evictable: list[int]
    in_use: list[int]


@runtime_checkable
class HandsOver(Protocol):
    """A policy that can give up all its blocks (it is empty afterwards)."""

    def hand_over(self) -> Handover:
        """Remove every block; return them, the evictable ones in victim order."""


@runtime_checkable
class Adopts(Protocol):
    """A fresh (empty) policy that can take over another's blocks."""

    def adopt(self, handover: Handover, now: float) -> None:
        """Hold ``handover``'s blocks from ``now`` on, so that, before any new access,
        ``evict`` returns the evictable ones in their order."""


@runtime_checkable
class ReloadsPolicy(Protocol):
    """An evictor whose parameters come from a policy document (``wa``)."""

    def set_policy(self, doc: PolicyDocument) -> None:
        """Use ``doc`` from the next eviction on; a refusal raises having changed
        nothing."""


@runtime_checkable
class NamesCategories(Protocol):
    """An evictor that numbers categories itself (``wa``): ``free`` takes its codes."""

    def add_category(self, name: str) -> int:
        """The evictor's code of category ``name``."""


def drain(policy: EvictionPolicy, in_use: Collection[int]) -> Handover:
    """``policy``'s blocks, taken out: evicting everything gives the victim order. Every
    policy's ``hand_over`` is this with its own set of blocks in use (emptied here)."""
    held = list(in_use)
    evictable = policy.evict(len(policy))
    if isinstance(in_use, set):
        in_use.clear()
    return Handover(evictable, held)


def queue_up(handover: Handover, queue: deque[int], in_use: set[int]) -> None:
    """Append ``handover``'s blocks to a queue policy's ``queue``: the evictable ones in
    victim order, then the ones in use, which stay in ``in_use`` (the policy's scan parks
    them until they are freed)."""
    queue.extend(handover.evictable)
    queue.extend(handover.in_use)
    in_use.update(handover.in_use)


class SwitchRefused(RuntimeError):
    """One of the two policies cannot take part in a switch."""


def hand_over(old: EvictionPolicy, new: EvictionPolicy, now: float) -> None:
    """Move every block of ``old`` into the fresh ``new`` at ``now``, victim order kept.
    Whatever raises leaves every block in ``old``, in its victim order (an ``adopt`` that
    fails gives them back to ``old``, which adopts them as a fresh policy would)."""
    if not isinstance(old, HandsOver):
        raise SwitchRefused(f"{type(old).__name__} cannot hand its blocks over")
    if not isinstance(old, Adopts):
        raise SwitchRefused(
            f"{type(old).__name__} cannot adopt (its own blocks back, should the switch fail)"
        )
    if not isinstance(new, Adopts):
        raise SwitchRefused(f"{type(new).__name__} cannot adopt blocks")
    if len(new):
        raise SwitchRefused(f"{type(new).__name__} already holds {len(new)} blocks")
    handover = old.hand_over()
    try:
        new.adopt(handover, now)
    except BaseException:
        old.adopt(handover, now)
        raise

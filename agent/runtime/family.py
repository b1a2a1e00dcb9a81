"""Which evictor family an agent runs, and whether it follows the policy document's.

Owns the rule and the builder: an agent configured with ``wa`` (or ``device``, the torch
``wa``) follows the ``evictor`` the document names; one configured with a baseline
(``KVWISE_EVICTOR=lru``, as the demo's control workers) is a fixed control and keeps it.
The ``wa`` family is the torch evictor on ``KVWISE_DEVICE`` where the agent was
configured with ``device`` (``build_evictor``, for the agent and the engine integrations
alike: at start and at each family switch); a baseline runs on the CPU policy of the
agent registry everywhere (there is no device baseline). It also owns the names an agent
accepts (every registered policy and ``device``) and how a run names a family the
document put in place of the configured one. It must never do I/O, nor import torch
other than through ``agent.device_evictor``, and that only when ``device`` is configured
(an agent without torch runs every other evictor).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from agent.policies import EvictionPolicy, UnknownPolicyError, create, names
from agent.policy_document import DEFAULT_FAMILY, PolicyDocument
from agent.settings import AgentSettings

DEVICE = "device"
"""The configured name of the torch ``wa`` (not a registered policy)."""

FOLLOWING = (DEFAULT_FAMILY, DEVICE)
"""Configured evictors that follow the document's family."""


def evictor_choices() -> list[str]:
    """Every configured evictor an agent accepts: the registered policies, then ``device``."""
    return [*names(), DEVICE]


def follows_document(settings: AgentSettings) -> bool:
    """Whether an agent with ``settings`` switches to the family the document names."""
    return settings.evictor in FOLLOWING


def configured_family(settings: AgentSettings) -> str:
    """The family the configured evictor belongs to (``device`` is ``wa``);
    ``UnknownPolicyError``, listing every accepted name, for any other name."""
    if settings.evictor not in evictor_choices():
        raise UnknownPolicyError(settings.evictor, evictor_choices())
    return DEFAULT_FAMILY if settings.evictor == DEVICE else settings.evictor


class EvictorUnavailable(RuntimeError):
    """The configured evictor cannot be built here: the device evictor without torch, or
    on a device this torch cannot use."""


def build_evictor(
    settings: AgentSettings, capacity: int, family: str | None = None
) -> EvictionPolicy:
    """An evictor of ``family`` (default: the configured one's) sized for ``capacity``
    blocks: ``wa`` is the torch evictor where ``device`` is configured; a baseline is the
    CPU policy everywhere."""
    family = family or configured_family(settings)
    if family == DEFAULT_FAMILY and settings.evictor == DEVICE:
        return device_evictor(settings, capacity)
    return create(family, capacity)


def device_evictor(settings: AgentSettings, capacity: int) -> EvictionPolicy:
    """The torch ``wa`` on ``KVWISE_DEVICE``; ``EvictorUnavailable`` naming the variable
    and the device where torch is missing or cannot use it (never a CPU ``wa`` instead)."""
    where = f"KVWISE_DEVICE={settings.device}"
    try:
        from agent.device_evictor import DeviceEvictor, DeviceUnusable  # torch: only here
    except ImportError as exc:
        raise EvictorUnavailable(
            f"{where}: the device evictor needs torch, which cannot be imported here ({exc}): "
            "install kvwise[torch], or configure another evictor"
        ) from None
    try:
        return DeviceEvictor(capacity, device=settings.device)
    except DeviceUnusable as exc:
        raise EvictorUnavailable(f"{where}: {exc}") from None


def family_label(configured: str, in_force: str) -> str:
    """How a run names its evictor: the family in force (``device`` where the torch ``wa``
    runs), and, where the document's family (the fleet's pin or selection) replaced the
    configured one, what was configured (``device -> s3fifo (fleet)``). A baseline never
    follows, so it is never replaced."""
    if configured not in FOLLOWING:
        return in_force
    if in_force == DEFAULT_FAMILY:
        return configured
    return f"{configured} -> {in_force} (fleet)"


@runtime_checkable
class SwitchesFamily(Protocol):
    """A policy slot that replaces its evictor itself (an engine's own order)."""

    def switch_family(self, doc: PolicyDocument) -> None:
        """Run ``doc``'s family on ``doc``'s parameters from now on, every cached block
        kept in its victim order; a failure (the family, the document or the blocks
        refused) raises with every block still in the evictor in force, on its document."""

"""Which evictor family an agent runs, and whether it follows the policy document's.

Owns the rule and the builder: an agent configured with ``wa`` (or ``device``, the torch
``wa``) follows the ``evictor`` the document names; one configured with a baseline
(``KVWISE_EVICTOR=lru``, as the demo's control workers) is a fixed control and keeps it.
The ``wa`` family is the torch evictor where the agent was configured with ``device``
(the vLLM integration builds it); a baseline runs on the CPU policy of the agent registry
everywhere (there is no device baseline). It must never do I/O or import torch.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from agent.policy_document import DEFAULT_FAMILY
from agent.settings import AgentSettings

FOLLOWING = ("wa", "device")
"""Configured evictors that follow the document's family."""


def follows_document(settings: AgentSettings) -> bool:
    """Whether an agent with ``settings`` switches to the family the document names."""
    return settings.evictor in FOLLOWING


def configured_family(settings: AgentSettings) -> str:
    """The family the configured evictor belongs to (``device`` is ``wa``)."""
    return DEFAULT_FAMILY if settings.evictor == "device" else settings.evictor


@runtime_checkable
class SwitchesFamily(Protocol):
    """A policy slot that replaces its evictor itself (an engine's own order)."""

    def switch_family(self, family: str) -> None:
        """Run ``family`` from now on, every cached block kept in its victim order."""

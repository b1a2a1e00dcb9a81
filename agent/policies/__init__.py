"""CPU eviction policies, one per module, each registered by name.

Importing this package registers every built-in policy. Use ``create(name, capacity)``;
an unknown name raises ``UnknownPolicyError`` listing the known ones.
"""

from agent.policies import arc, fifo, lfu, lru, s3fifo, sieve, wa  # noqa: F401  (register themselves)
from agent.policies.base import EvictionPolicy
from agent.policies.registry import UnknownPolicyError, create, factory, names, register

__all__ = ["EvictionPolicy", "UnknownPolicyError", "create", "factory", "names", "register"]

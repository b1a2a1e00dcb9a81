"""Which prefix subtrees the shadow keeps: a request is sampled when a hash of its key block
(``controlplane.shadow.rebuild``: the block at a fixed prompt offset, or the last one of a
shorter prompt) falls under the sampling rate.

Owns ``PrefixSampler``. Every request whose prompt runs through the same key block is kept
or dropped together, so a sampled request's prefix hits in the miniature cache are, below
the key, the hits it would have had in the full one (its whole subtree is there); the
miniature cache is about the full capacity times the rate (spatial sampling, as SHARDS
does for single keys; ``controlplane.shadow.inflow`` sets it). The key sits past the
shallow prompts many conversations share (a platform's system prompt): keyed on the first
block, a handful of such trees would carry most of the traffic and the sample would be all
or nothing. The hash is a fixed mix of the block id (splitmix64's finaliser) and a salt,
vectorised: the decision is the same on every controller replica and after a restart. It
must never hold state beyond its rate and salt.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_FULL = 1 << 64


def mix64(values: NDArray[np.int64] | NDArray[np.uint64], salt: int = 0) -> NDArray[np.uint64]:
    """splitmix64's finaliser of ``values + salt * golden``: uniform 64-bit hashes."""
    with np.errstate(over="ignore"):
        z = values.astype(np.uint64) + np.uint64(salt) * _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _MIX1
        z = (z ^ (z >> np.uint64(27))) * _MIX2
        return z ^ (z >> np.uint64(31))


class PrefixSampler:
    """Keeps the requests whose key block hashes under ``rate`` (0 < rate <= 1)."""

    def __init__(self, rate: float, salt: int = 0) -> None:
        if not 0 < rate <= 1:
            raise ValueError(f"sampling rate must be in (0, 1], got {rate}")
        self.rate = rate
        self.salt = salt
        self._threshold = min(int(rate * _FULL), _FULL - 1)

    def keep(self, key_blocks: NDArray[np.int64]) -> NDArray[np.bool_]:
        """Per request (given by its key block's id): whether it is sampled."""
        if self.rate >= 1:
            return np.ones(len(key_blocks), dtype=np.bool_)
        return mix64(key_blocks, self.salt) < np.uint64(self._threshold)

    def scaled(self, capacity: int) -> int:
        """The miniature cache's capacity for a full cache of ``capacity`` blocks (>= 1)."""
        return max(1, round(capacity * self.rate))

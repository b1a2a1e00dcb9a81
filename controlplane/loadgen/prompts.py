"""Trace blocks -> prompt token ids: each block id becomes a fixed run of token ids.

Owns the mapping that makes a server's prefix cache see exactly the sharing of a trace: a
block's tokens depend only on its original hash id (and the salt), so requests that share a
prefix of blocks share that prefix of tokens, and two distinct blocks get the same tokens
only if ``block_tokens`` independent draws from the vocabulary all agree. A prompt is its
blocks' tokens followed by one extra token: a server computes at least the last prompt
token, so without it a request whose blocks are all cached could reuse one block less.
It must never do I/O or build one Python object per token (prompts stay numpy arrays).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


@dataclass(frozen=True)
class TokenSpace:
    """How blocks become token ids: ``block_tokens`` ids per block, drawn from
    ``[first_id, vocab)`` (ids below ``first_id`` are left to special tokens)."""

    block_tokens: int = 16
    vocab: int = 1000
    first_id: int = 10
    salt: int = 0

    def __post_init__(self) -> None:
        if self.block_tokens < 1:
            raise ValueError(f"block_tokens must be >= 1, got {self.block_tokens}")
        if not 0 <= self.first_id < self.vocab - 1:
            raise ValueError(
                f"token ids [first_id, vocab) = [{self.first_id}, {self.vocab}) leave fewer "
                "than two ids to draw from"
            )

    @property
    def tail_token(self) -> int:
        """The extra token after a prompt's blocks."""
        return self.first_id

    def block_token_ids(self, hash_ids: NDArray[np.int64]) -> NDArray[np.int64]:
        """Token ids of blocks with these original hash ids: shape ``(n, block_tokens)``."""
        ids = np.asarray(hash_ids, dtype=np.int64).astype(np.uint64)
        position = np.arange(self.block_tokens, dtype=np.uint64)
        key = (ids[:, None] * np.uint64(self.block_tokens) + position[None, :]) ^ np.uint64(
            self.salt & 0xFFFFFFFFFFFFFFFF
        )
        mixed = _splitmix64(key)
        span = np.uint64(self.vocab - self.first_id)
        return (mixed % span).astype(np.int64) + self.first_id

    def prompt(self, hash_ids: NDArray[np.int64]) -> NDArray[np.int64]:
        """A request's prompt: its blocks' tokens in order, then ``tail_token``."""
        tokens = self.block_token_ids(hash_ids).reshape(-1)
        return np.append(tokens, np.int64(self.tail_token))


def _splitmix64(x: NDArray[np.uint64]) -> NDArray[np.uint64]:
    """The splitmix64 finalizer, elementwise (uint64 arithmetic wraps, as intended)."""
    z = x + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))

"""``Blk``: a stand-in for vLLM's ``KVCacheBlock`` with the fields kvwise's free queue reads
(id, hash, and the two links it must leave ``None``). The real block runs in
tests/e2e/test_vllm.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(eq=False)
class Blk:
    block_id: int
    block_hash: bytes | None = None
    prev_free_block: Any = None
    next_free_block: Any = None

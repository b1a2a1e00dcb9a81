"""``PrefixEngine``: what vLLM's ``BlockPool`` and ``KVCacheManager`` do around kvwise's free
queue, one request at a time, for tests of the queue's superseded branches.

Per request (a prompt of content ids, one per full block): the longest cached prefix,
looked up by content, but never the last block (vLLM computes a prompt's last token
again, so a prompt's last block is never a hit) unless prompts end in a partial block
(``partial_tails``: never stored, so every full block may be a hit); touch it
(``remove`` from the free queue, ``note_hits``); pop new blocks (evicting cached ones:
their content leaves, as ``_maybe_evict_cached_block`` does); give them their hashes and
``note_stored`` them after the last hit; free them all, tail first. The real
``BlockPool`` runs with the queue in tests/unit/test_vllm_plugin.py.
"""

from __future__ import annotations

from agent.integrations.block_queue import KvwiseFreeQueue
from agent.policies import EvictionPolicy, create
from agent.policy_document import SupersedeRule
from tests.vllm_block import Blk


def key(content: int) -> bytes:
    """A 32-byte hash whose low 64 bits are ``content``, then a 4-byte group id."""
    return content.to_bytes(32, "big") + (0).to_bytes(4, "big")


class PrefixEngine:
    """A pool of ``n`` blocks (block 0 the null block) behind a ``KvwiseFreeQueue`` over
    ``evictor`` (a registered name, or an evictor of ``n`` blocks) with the supersede
    ``rule``."""

    def __init__(
        self,
        n: int,
        rule: SupersedeRule,
        evictor: str | EvictionPolicy = "wa",
        *,
        partial_tails: bool = False,
    ) -> None:
        self.partial_tails = partial_tails
        self.blocks = [Blk(i) for i in range(n)]
        ticks = iter(range(1 << 62))
        policy = create(evictor, n) if isinstance(evictor, str) else evictor
        self.queue = KvwiseFreeQueue(
            self.blocks, policy, clock=lambda: float(next(ticks)), supersede=rule
        )
        self.queue.popleft()  # the null block, as vLLM takes it at start
        self.holders: dict[int, dict[int, None]] = {}
        """Content -> the blocks holding it, first stored first (vLLM's hash map)."""
        self.hits = 0
        self.evicted: list[int] = []
        """The content of each block taken for reuse, in order, by the latest request."""

    def content(self, block_id: int) -> int | None:
        """What block ``block_id`` holds (None: nothing)."""
        held = self.blocks[block_id].block_hash
        return None if held is None else int.from_bytes(held[24:32], "big")

    def cached_prefix(self, prompt: list[int]) -> list[Blk]:
        """The blocks of ``prompt``'s cached prefix (its last block only with
        ``partial_tails``)."""
        found: list[Blk] = []
        for content in prompt if self.partial_tails else prompt[:-1]:
            holders = self.holders.get(content)
            if not holders:
                break
            found.append(self.blocks[next(iter(holders))])
        return found

    def run(self, prompt: list[int]) -> int:
        """Serve ``prompt``; returns its hit count."""
        queue = self.queue
        hits = self.cached_prefix(prompt)
        for block in hits:
            queue.remove(block)
        if hits:
            queue.note_hits(hits, 0)
        new = queue.popleft_n(len(prompt) - len(hits))
        self.evicted = [c for c in map(self._reuse, new) if c is not None]
        for block, content in zip(new, prompt[len(hits) :], strict=True):
            block.block_hash = key(content)
            self.holders.setdefault(content, {})[block.block_id] = None
        parent = hits[-1] if hits else None
        if new:
            queue.note_stored(new, len(hits), 0, parent=parent, parting=True)
        queue.append_n([*reversed(hits + new)])
        self.hits += len(hits)
        return len(hits)

    def _reuse(self, block: Blk) -> int | None:
        """``block`` is taken for new content: what it held leaves the cache."""
        content = self.content(block.block_id)
        if content is not None:
            del self.holders[content][block.block_id]
            if not self.holders[content]:
                del self.holders[content]
            block.block_hash = None
        return content

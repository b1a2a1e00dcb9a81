"""How the vLLM plugin reads block hashes fast: ``hashes64`` (one unpack for a request's
keys) agrees with ``hash64`` key by key, and ``hash_reader`` reads vLLM's ``_block_hash``
slot only where ``block_hash`` is a property over such a slot."""

from __future__ import annotations

import random
import tracemalloc
from dataclasses import dataclass

from agent.integrations.block_queue import BLOCK_HASH, KvwiseFreeQueue, hash64, hashes64
from agent.integrations.vllm import hash_reader
from agent.policies import create
from tests.vllm_block import Blk


@dataclass(slots=True)
class SlottedBlock:
    """Shaped like vLLM 0.32's ``KVCacheBlock``: the hash in a slot, read by a property."""

    block_id: int
    _block_hash: bytes | None = None

    @property
    def block_hash(self) -> bytes | None:
        return self._block_hash


def test_hashes64_is_hash64_of_each_key_whatever_their_lengths() -> None:
    rng = random.Random(7)
    for n in (0, 1, 16, 300):
        keys = [rng.randbytes(36) for _ in range(n)]
        assert hashes64(keys) == [hash64(k) for k in keys]
        raw = [rng.randbytes(32) for _ in range(n)]
        assert hashes64(raw, 0) == [hash64(k, 0) for k in raw]
    mixed = [rng.randbytes(36), rng.randbytes(20), rng.randbytes(12), b"abc"]
    assert hashes64(mixed) == [hash64(k) for k in mixed]


def test_hashes64_keeps_few_small_unpackers_whatever_the_prompt_lengths() -> None:
    """One unpacker was cached per distinct key count: long prompts of many lengths
    could pin hundreds of MB in the engine (0.31 MB each at 8,192 keys)."""
    rng = random.Random(8)
    keys = [rng.randbytes(36) for _ in range(3000)]
    tracemalloc.start()
    try:
        for n in range(1, 3000, 7):
            assert hashes64(keys[:n]) == [hash64(k) for k in keys[:n]]
        kept, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert kept < 5_000_000, kept  # 1.3 MB; unbounded, it was 24.5 MB here


def test_hash_reader_reads_the_slot_behind_vllms_property_else_the_property() -> None:
    slot_read = hash_reader(SlottedBlock)
    assert slot_read is not BLOCK_HASH
    block = SlottedBlock(3, b"k" * 36)
    assert slot_read(block) is block.block_hash
    assert hash_reader(Blk) is BLOCK_HASH  # a plain field: no slot behind a property


def test_queue_notes_stored_blocks_through_the_slot_read() -> None:
    blocks = [SlottedBlock(i) for i in range(4)]
    queue = KvwiseFreeQueue(blocks, create("lru", 4), hash_of=hash_reader(SlottedBlock))
    got = queue.popleft_n(4)
    for b in got[1:3]:
        b._block_hash = random.Random(b.block_id).randbytes(36)
    hashes, offsets, ids = queue.note_stored(got[1:], 5, 2)
    assert ids == [1, 2]  # block 3 has no hash: skipped
    assert list(offsets) == [5, 6]
    assert hashes == [hash64(b.block_hash) for b in got[1:3] if b.block_hash is not None]
    assert queue.code[1:3] == [2, 2] and queue.offset[1:3] == [5, 6]
    queue.append_n(got[1:])
    assert queue.num_free_blocks == 3

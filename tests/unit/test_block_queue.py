"""``KvwiseFreeQueue`` on its own: vLLM's free-queue contract with kvwise's victim order.

``Blk`` stands for vLLM's ``KVCacheBlock`` with the fields the queue reads (id, hash, the
two links it must leave ``None``); the real ``BlockPool`` runs with the queue in
tests/e2e/test_vllm.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.integrations.block_queue import KvwiseFreeQueue, hash64
from agent.policies import create, names
from agent.policies.base import Discards, EvictionPolicy
from agent.policies.fifo import FIFOPolicy
from agent.policies.wa import WAPolicy
from agent.policy_document import CategoryParams, PolicyDocument
from tests.vllm_block import Blk


class Hooks:
    """Counts the queue's hook calls (the engine agent's place)."""

    def __init__(self) -> None:
        self.calls = 0
        self.hashes: list[int] = []

    def before_call(self) -> None:
        self.calls += 1

    def evicted(self, hashes: list[int], now: float) -> None:
        self.hashes += hashes


def key(i: int) -> bytes:
    """A 32-byte hash followed by a 4-byte group id, as vLLM keys cached blocks."""
    return i.to_bytes(32, "big") + (0).to_bytes(4, "big")


def make(n: int, evictor: Any = None) -> tuple[KvwiseFreeQueue, list[Blk]]:
    blocks = [Blk(i) for i in range(n)]
    ticks = iter(range(1 << 62))  # every queue call one second later
    pol = evictor if evictor is not None else create("wa", n)
    queue = KvwiseFreeQueue(blocks, pol, clock=lambda: float(next(ticks)))
    return queue, blocks


class Holding(FIFOPolicy):
    """An evictor without ``Discards`` (every built-in one has it; one registered outside
    kvwise may not): ``fifo`` with ``discard`` taken away (``None`` hides a method from
    ``isinstance``, as for the collections ABCs)."""

    __slots__ = ()
    discard = None  # type: ignore[assignment]


def evictor_named(name: str, n: int) -> EvictionPolicy:
    """A registered evictor, or ``Holding`` for ``"holding"``."""
    return Holding(n) if name == "holding" else create(name, n)


def all_taken(n: int, evictor: str) -> tuple[KvwiseFreeQueue, Hooks, list[Blk]]:
    """A queue of ``n`` blocks under ``evictor`` (``evictor_named``), its clock stopped at
    1 s, whose hook calls ``Hooks`` counts, once every block is taken (``popleft_n``, one
    hook call): the queue, its hooks and the blocks in id order."""
    blocks = [Blk(i) for i in range(n)]
    hooks = Hooks()
    q = KvwiseFreeQueue(blocks, evictor_named(evictor, n), hooks=hooks, clock=lambda: 1.0)
    return q, hooks, q.popleft_n(n)


def cache(q: KvwiseFreeQueue, blocks: list[Blk], code: int = 0) -> None:
    """Give ``blocks`` hashes (as ``cache_full_blocks`` does) and note them."""
    for b in blocks:
        b.block_hash = key(1000 + b.block_id)
    q.note_stored(blocks, 0, code)


def test_start_up_pops_block_0_first_then_in_id_order() -> None:
    q, blocks = make(6)
    assert q.num_free_blocks == 6
    assert q.popleft() is blocks[0]  # vLLM's null block
    assert [b.block_id for b in q.popleft_n(3)] == [1, 2, 3]
    assert q.num_free_blocks == 2 and len(q) == 2


def test_hashless_frees_are_reused_first_and_unpinned_ones_last() -> None:
    q, blocks = make(8)
    got = q.popleft_n(8)
    cache(q, got[4:6])
    q.append_n(got[4:6])  # cached: the evictor's
    q.append_n([got[6]])  # hash-less append (vLLM's unpin_blocks): last resort
    q.prepend_n([got[2], got[3]])  # hash-less free (vLLM's prepend_n): first, in order
    assert q.num_free_blocks == 5
    assert [b.block_id for b in q.get_all_free_blocks()] == [2, 3, 4, 5, 6]
    order = [b.block_id for b in q.popleft_n(5)]
    assert order[:2] == [2, 3] and set(order[2:4]) == {4, 5} and order[4] == 6
    assert all(b.prev_free_block is None and b.next_free_block is None for b in blocks)
    with pytest.raises(ValueError):
        q.popleft()


def test_victims_follow_the_evictor_not_release_order() -> None:
    doc = PolicyDocument(
        version=1,
        categories={
            "keep": CategoryParams(rate=0.01, p_reuse=0.9, life_s=60),
            "drop": CategoryParams(rate=0.01, p_reuse=0.0, life_s=60),
        },
    )
    pol = WAPolicy(category_names=["keep", "drop"], doc=doc)
    q, _ = make(7, pol)
    got = q.popleft_n(7)
    cache(q, got[1:4], code=0)  # released first: LRU would evict these first
    cache(q, got[4:7], code=1)
    q.append_n(list(reversed(got[1:4])))
    q.append_n(list(reversed(got[4:7])))
    # p_reuse 0: the "drop" blocks go first, tail first; then "keep", tail first.
    assert [b.block_id for b in q.popleft_n(6)] == [6, 5, 4, 3, 2, 1]


def test_remove_takes_a_hit_out_of_the_victims_and_it_comes_back_when_freed() -> None:
    q, _ = make(5)
    got = q.popleft_n(5)
    cache(q, got[1:])
    q.append_n(list(reversed(got[1:])))  # victims in order 4, 3, 2, 1
    q.remove(got[3])  # a prefix hit on block 3
    assert q.num_free_blocks == 3
    assert [b.block_id for b in q.popleft_n(2)] == [4, 2]
    q.append_n([got[3]])  # the request that hit it finishes
    assert [b.block_id for b in q.popleft_n(2)] == [1, 3]
    with pytest.raises(RuntimeError):
        q.remove(got[1])  # not free


def test_hooks_see_every_call_and_the_hashes_of_evicted_cached_blocks() -> None:
    q, hooks, got = all_taken(4, "lru")
    cache(q, got[2:])
    q.append_n([got[3], got[2]])
    q.prepend_n([got[1]])
    q.popleft_n(3)
    assert hooks.calls == 3  # popleft_n, append_n, popleft_n (prepend_n does no eviction)
    assert hooks.hashes == [hash64(key(1003)), hash64(key(1002))]


def test_hash64_is_vllms_int_hash_read_as_signed() -> None:
    h = bytes(range(200, 232))
    unsigned = int.from_bytes(h, "big") & ((1 << 64) - 1)  # vLLM's maybe_convert_block_hash
    signed = unsigned - (1 << 64) if unsigned >= 1 << 63 else unsigned
    assert hash64(h + b"\0\0\0\1") == signed
    assert hash64(h, 0) == signed


ops = st.lists(
    st.tuples(st.sampled_from(["pop", "free", "hit", "unpin"]), st.integers(1, 5)), max_size=60
)


@settings(max_examples=150, deadline=None)
@given(script=ops, evictor=st.sampled_from(["wa", "lru", "s3fifo"]))
def test_holds_exactly_the_free_blocks(script: list[tuple[str, int]], evictor: str) -> None:
    """Against a model of which blocks are free: the count, the listed set, no duplicates,
    and a pop of more than is free fails loudly."""
    n = 12
    q, blocks = make(n, create(evictor, n))
    free = set(range(n))
    used: list[Blk] = []
    for kind, k in script:
        if kind == "pop":
            if k > len(free):
                with pytest.raises(ValueError):
                    q.popleft_n(k)
                continue
            got = q.popleft_n(k)
            assert {b.block_id for b in got} <= free
            free -= {b.block_id for b in got}
            for b in got:
                b.block_hash = None  # vLLM drops an evicted block's hash
            used += got
        elif kind in ("free", "unpin") and used:
            batch, used = used[:k], used[k:]
            if kind == "free":
                cache(q, batch)
                q.append_n(batch[::-1])
            else:
                q.append_n(batch)  # hash-less: unpinned
            free |= {b.block_id for b in batch}
        elif kind == "hit":
            cached = [blocks[i] for i in sorted(free) if blocks[i].block_hash is not None]
            for b in cached[:k]:
                q.remove(b)
                free.discard(b.block_id)
                used.append(b)
        listed = [b.block_id for b in q.get_all_free_blocks()]
        assert len(listed) == len(set(listed)) == q.num_free_blocks == len(free)
        assert set(listed) == free
        after = list(q.iter_blocks_after(blocks[listed[0]])) if listed else []
        assert [b.block_id for b in after] == listed[1:]


def test_cached_blocks_whose_hash_was_reset_while_free_are_reported_evicted_when_reused() -> None:
    """A connector's ``evict_blocks`` drops the hashes of free cached blocks (and so does a
    prefix-cache reset, which the plugin reports at once: ``drop_all_cached``): their
    content left the cache. Reused, they must be reported evicted,
    or the agent's history keeps them cached and the same content stored again is taken
    for a block it already holds (no INSERT)."""
    q, hooks, got = all_taken(4, "lru")
    cache(q, got[1:3])
    q.append_n([got[2], got[1]])
    q.prepend_n([got[3]])
    for b in got:  # the prefix-cache reset, every block free
        b.block_hash = None
    q.popleft_n(3)
    assert hooks.hashes == [hash64(key(1002)), hash64(key(1001))]


def test_content_cached_in_two_blocks_is_reported_evicted_once_when_its_last_block_goes() -> None:
    """vLLM does not deduplicate: two requests computing the same prompt in one step store
    it in two blocks with one hash. Reusing one block leaves the content cached (a later
    request hits the other), so only the last one is an eviction of that hash."""
    q, hooks, got = all_taken(4, "lru")
    for b in got[1:3]:
        b.block_hash = key(7)
        q.note_stored([b], 0, 0)
    q.append_n([got[1]])
    q.append_n([got[2]])
    first = q.popleft_n(1)[0]
    first.block_hash = None  # vLLM's eviction of that copy
    assert hooks.hashes == []
    q.popleft_n(1)
    assert hooks.hashes == [hash64(key(7))]


def test_a_block_put_back_at_the_front_with_its_hash_is_evicted_only_when_popped() -> None:
    """``prepend_n`` of a block that kept its hash (reused first, as vLLM frees blocks it
    wants reused first): its content is still cached and a hit may take it back, so it is
    reported evicted when popped for reuse, not when put back."""
    q, hooks, got = all_taken(4, "lru")
    cache(q, got[1:3])
    q.prepend_n([got[1], got[2]])
    assert hooks.hashes == []
    q.remove(got[1])  # a prefix hit takes it back
    assert [b.block_id for b in q.popleft_n(1)] == [2]
    assert hooks.hashes == [hash64(key(1002))]
    q.append_n([got[1]])  # the request that hit it is done
    q.popleft_n(1)
    assert hooks.hashes == [hash64(key(1002)), hash64(key(1001))]


def test_a_prefix_cache_reset_reports_every_stored_content_evicted_at_once() -> None:
    """vLLM's ``reset_prefix_cache`` drops every hash, every block free: all the content
    stored is reported evicted then (once, whatever zone its block was in), and the
    emptied blocks are reused before any block cached after the reset."""
    q, hooks, got = all_taken(6, "lru")
    cache(q, got[1:4])
    q.append_n([got[2], got[1]])  # the evictor's
    q.prepend_n([got[3], got[5]])  # at the front, one with its hash
    q.append_n([got[4]])  # hash-less: unpinned
    for b in got:
        b.block_hash = None
    q.drop_all_cached()
    assert sorted(hooks.hashes) == sorted(hash64(key(1000 + i)) for i in (1, 2, 3))
    assert q.num_free_blocks == 5 and len(q.evictor) == 0
    popped = q.popleft_n(2)
    cache(q, popped)
    q.append_n(popped)  # cached after the reset
    emptied = {1, 2, 3, 5} - {b.block_id for b in popped}
    assert {b.block_id for b in q.popleft_n(2)} == emptied
    assert len(hooks.hashes) == 3


def test_a_block_whose_hash_was_dropped_while_in_use_is_reported_evicted_when_freed() -> None:
    """A connector's ``evict_blocks`` drops the hash of a block a request still holds:
    vLLM frees it hash-less (``prepend_n``), its content gone from the cache."""
    q, hooks, got = all_taken(3, "wa")
    cache(q, got[1:])
    got[1].block_hash = None  # evicted from the prefix cache while in use
    q.prepend_n([got[1]])
    got[2].block_hash = None
    q.append_n([got[2]])  # the same, given back hash-less with append
    assert hooks.hashes == [hash64(key(1001)), hash64(key(1002))]


@pytest.mark.parametrize("evictor", names())
def test_free_cached_blocks_a_connector_drops_leave_the_evictor_and_are_reused_first(
    evictor: str,
) -> None:
    """A connector's ``evict_blocks`` drops the hashes of free cached blocks: they hold
    nothing, so the evictor lets them go (it would otherwise keep them as candidates and
    evict content before them), they are the next blocks reused, and their content is
    reported evicted at the drop, once, not again when they are reused."""
    q, hooks, got = all_taken(6, evictor)
    cache(q, got[1:5])
    q.append_n([got[4], got[3], got[2], got[1]])
    for b in (got[2], got[3]):
        b.block_hash = None
    q.drop_hashes([2, 3, 4, 5, 3])  # 4 kept its hash; 5 is in use and kept none
    assert sorted(hooks.hashes) == sorted(hash64(key(1000 + i)) for i in (2, 3))
    assert 2 not in q.evictor and 3 not in q.evictor and len(q.evictor) == 2
    assert q.num_free_blocks == 4
    assert {b.block_id for b in q.popleft_n(2)} == {2, 3}
    assert len(hooks.hashes) == 2
    assert {b.block_id for b in q.get_all_free_blocks()} == {1, 4}


def test_an_evictor_that_cannot_discard_holds_a_dropped_block_as_in_use_until_freed() -> None:
    """The fallback for an evictor without ``Discards``: the emptied block is touched
    (in use: counted, never a victim) and still reused first; freed again with new
    content, it is evictable, and the queue stays in step with the evictor."""
    q, hooks, got = all_taken(6, "holding")
    assert not isinstance(q.evictor, Discards)
    cache(q, got[1:5])
    q.append_n([got[4], got[3], got[2], got[1]])
    got[2].block_hash = None
    q.drop_hashes([2])
    assert hooks.hashes == [hash64(key(1002))]
    assert [b.block_id for b in q.popleft_n(1)] == [2]  # reused first; the touch is sent
    assert 2 in q.evictor and len(q.evictor) == 4
    assert {b.block_id for b in q.popleft_n(3)} == {1, 3, 4}  # never 2 while in use
    cache(q, [got[2]])
    q.append_n([got[2]])
    assert [b.block_id for b in q.popleft_n(1)] == [2] and len(q.evictor) == 0


def test_a_connector_drop_on_blocks_in_use_is_reported_when_they_are_freed() -> None:
    """Blocks a request holds keep today's path: nothing at the drop, reported when vLLM
    frees them hash-less; a fresh block put back with its hash is reported at the drop."""
    q, hooks, got = all_taken(4, "wa")
    cache(q, got[1:4])
    q.prepend_n([got[3]])  # free, at the front, with its hash
    got[1].block_hash = got[3].block_hash = None
    q.drop_hashes([1, 3])
    assert hooks.hashes == [hash64(key(1003))]
    q.prepend_n([got[1]])
    assert hooks.hashes == [hash64(key(1003)), hash64(key(1001))]
    q.popleft_n(2)
    assert len(hooks.hashes) == 2


def test_hashes_moved_to_a_copy_move_the_side_table_entry_with_them() -> None:
    """vLLM's ``move_block_hashes``: a request keeps writing into its block, a private
    copy takes over its cache entries. The content stays cached: freeing the original
    (hash-less) reports nothing; the copy carries its offset, category and hash, and is
    reported evicted when reused."""
    q, hooks, got = all_taken(3, "wa")
    got[1].block_hash = key(1001)
    q.note_stored([got[1]], 5, 2)
    got[2].block_hash, got[1].block_hash = got[1].block_hash, None
    q.moved(got[1], got[2])
    assert (q.offset[2], q.code[2], q.hash[2]) == (5, 2, hash64(key(1001)))
    q.prepend_n([got[1]])
    q.append_n([got[2]])
    assert hooks.hashes == []
    q.popleft_n(2)
    assert hooks.hashes == [hash64(key(1001))]


def test_a_block_holding_only_a_partial_entry_is_filed_as_its_request_stored_it() -> None:
    """vLLM's ``cache_partial_block`` gives a block in use a hash that kvwise does not
    report: freed, the block is filed at its request's prompt position and category, not
    as the content it last held; a block holding noted content keeps its entry."""
    q, hooks, got = all_taken(3, "wa")
    cache(q, got[1:2], code=1)
    q.offset[2], q.code[2] = 7, 1  # what block 2 held before it was reused
    for b in got[1:]:
        q.note_partial(b, 3, 2)  # block 1: a partial entry beside its full hash
    assert (q.offset[1], q.code[1], q.offset[2], q.code[2]) == (0, 1, 7, 1)  # 2: no hash
    got[2].block_hash = key(2)
    q.note_partial(got[2], 3, 2)
    assert (q.offset[2], q.code[2]) == (3, 2)
    q.append_n([got[2]])
    assert hooks.hashes == []


def test_a_block_written_over_in_place_reports_what_it_held_evicted_at_once() -> None:
    """A hybrid model's checkpoint writes over a block in use and drops its entries
    (``cache_partial_block`` with ``replace_existing_hashes``): its old content leaves the
    cache then, not when the block is next reused; a content another block holds stays.
    The block is then filed as its partial entry's request stored it."""
    q, hooks, got = all_taken(4, "wa")
    cache(q, got[1:3], code=1)
    got[3].block_hash = got[2].block_hash  # a second copy of block 2's content
    q.note_stored([got[3]], 1, 1)
    assert q.held_content(got[1]) == hash64(key(1001))
    for b in got[1:3]:
        b.block_hash = key(5000 + b.block_id)
        q.note_partial(b, 3, 2, replaced=True)
    assert hooks.hashes == [hash64(key(1001))]  # block 2's content lives on in block 3
    assert q.held_content(got[1]) is None and (q.offset[1], q.code[1]) == (3, 2)
    q.append_n(got[1:3])
    q.popleft_n(2)
    assert hooks.hashes == [hash64(key(1001))]  # not again when reused


class PrefixCache:
    """vLLM's side of the queue, as a model: which blocks are free or in use, the content
    (hash) each holds and how many blocks hold each content; a content leaves the cache
    when its last block is overwritten or its hash dropped."""

    def __init__(self, n: int) -> None:
        self.blocks = [Blk(i) for i in range(n)]
        self.free = set(range(n))
        self.in_use: list[Blk] = []
        self.copies: dict[int, int] = {}

    def drop(self, block: Blk) -> list[int]:
        """``block``'s hash is dropped; the content that left the cache with it."""
        assert block.block_hash is not None
        content = hash64(block.block_hash)
        block.block_hash = None
        self.copies[content] -= 1
        if self.copies[content]:
            return []
        del self.copies[content]
        return [content]

    def store(self, blocks: list[Blk], first: int) -> None:
        for i, block in enumerate(blocks):
            block.block_hash = key((first + i) % 5)  # five contents: copies are common
            content = hash64(block.block_hash)
            self.copies[content] = self.copies.get(content, 0) + 1

    def free_cached(self, k: int) -> list[Blk]:
        return [b for b in self.blocks if b.block_id in self.free and b.block_hash][:k]


def _step(q: KvwiseFreeQueue, vllm: PrefixCache, kind: str, k: int, first: int) -> list[int]:
    """One queue call as vLLM makes it; the contents that left the cache with it."""
    left: list[int] = []
    if kind == "pop" and vllm.free:
        got = q.popleft_n(min(k, len(vllm.free)))
        for b in got:  # get_new_blocks: a reused block's hash goes
            left += vllm.drop(b) if b.block_hash else []
        vllm.free -= {b.block_id for b in got}
        vllm.in_use += got
    elif kind == "store":  # cache_full_blocks on hash-less blocks in use
        blocks = [b for b in vllm.in_use if b.block_hash is None][:k]
        vllm.store(blocks, first)
        q.note_stored(blocks, 0, first % 3)
    elif kind in ("append", "prepend"):  # either, with or without a hash
        batch, vllm.in_use = vllm.in_use[:k], vllm.in_use[k:]
        (q.append_n if kind == "append" else q.prepend_n)(batch)
        vllm.free |= {b.block_id for b in batch}
    elif kind == "hit":  # touch: free cached blocks back in use
        for b in vllm.free_cached(k):
            q.remove(b)
            vllm.free.discard(b.block_id)
            vllm.in_use.append(b)
    elif kind == "drop":  # a connector's evict_blocks on free blocks, then the wrapper
        dropped = [b for b in vllm.blocks if b.block_id in vllm.free and b.block_hash][:k]
        for b in dropped:
            left += vllm.drop(b)
        q.drop_hashes([b.block_id for b in dropped])
    elif kind == "reset":  # reset_prefix_cache, then the plugin's wrapper
        for b in vllm.blocks:
            left += vllm.drop(b) if b.block_hash else []
        q.drop_all_cached()
    return left


queue_calls = st.lists(
    st.tuples(
        st.sampled_from(["pop", "store", "append", "prepend", "hit", "drop", "reset"]),
        st.integers(1, 4),
        st.integers(0, 4),
    ),
    max_size=80,
)


@settings(max_examples=300, deadline=None)
@given(script=queue_calls, evictor=st.sampled_from(["wa", "lru", "s3fifo", "arc", "holding"]))
def test_content_is_reported_evicted_exactly_when_it_leaves_the_cache(
    script: list[tuple[str, int, int]], evictor: str
) -> None:
    """Any sequence of vLLM's queue calls (``popleft_n``, ``append_n`` and ``prepend_n``
    of blocks with or without a hash, ``remove`` of hits, a connector's drop of free
    blocks' hashes, a prefix-cache reset): each call
    reports evicted exactly the contents whose last block it overwrote or dropped, never
    one still cached."""
    n = 10
    vllm = PrefixCache(n)
    hooks = Hooks()
    q = KvwiseFreeQueue(vllm.blocks, evictor_named(evictor, n), hooks=hooks, clock=lambda: 1.0)
    for kind, k, first in script:
        reported = len(hooks.hashes)
        left = _step(q, vllm, kind, k, first)
        assert sorted(hooks.hashes[reported:]) == sorted(left), kind
        assert not set(hooks.hashes[reported:]) & set(vllm.copies)
        assert q.num_free_blocks == len(vllm.free)
        assert {b.block_id for b in q.get_all_free_blocks()} == vllm.free

"""``KvwiseFreeQueue``: a drop-in for vLLM's ``FreeKVCacheBlockQueue`` whose eviction order
is a kvwise evictor's, and the per-block side table that feeds it.

Owns the free blocks of one block pool, in three zones, popped in this order:

1. *fresh*: the blocks ``prepend_n`` puts back at the front, last in first out, as
   vLLM's does: mostly blocks that hold no cached content (never filled, or freed without
   a hash); at start-up every block in id order, so the first ``popleft`` returns block 0
   (vLLM's null block). One prepended with its hash still holds cached content (a hit may
   take it back): its content is reported evicted when it is popped for reuse, not
   before. A cached free block whose hash the engine drops (``drop_hashes``) joins them
   at the head: it holds nothing;
2. *cached*: free blocks with a block hash, held by the evictor (``wa`` by default), which
   decides the victims; their ids are vLLM block ids;
3. *unpinned*: hash-less blocks given back with ``append`` (vLLM's ``unpin_blocks``: still
   read by someone until reused), first in first out, the last resort as in vLLM.

It also owns the side table (per block id: prompt offset, evictor category code, the low
64 bits of the block hash), filled by the integration from the engine's cache and hit
paths, and how many blocks hold each hash (vLLM may store one content twice): a hash is
reported evicted when the last of them is reused. Where the policy document's
``supersede`` is ``tree`` and the evictor is ``wa``'s (it takes the document and
``Discards``), it also feeds ``SupersededBranches`` (``agent.branches``) each
request's hits and stores, and each eviction takes the superseded blocks still free and
untouched first, then the evictor's victims. The invariants of vLLM's queue hold: it
holds exactly the free blocks and ``num_free_blocks`` is their count; ``remove`` is O(1)
(a hit's evictor ``touch`` is staged and applied, batched, at the next ``popleft_n`` or
``append_n``); ``popleft_n(n)`` returns ``n`` blocks or raises; blocks are never linked
(their ``prev_free_block`` and ``next_free_block`` stay ``None``); it never resets hashes
or emits vLLM events. Only the engine thread calls it; a sample of its ``popleft_n`` and
``append_n`` calls is timed (``agent.engine_time``: ``remove``, O(1), would cost more to
count than it does). It must never import vLLM, do I/O or wait on another thread.
"""

from __future__ import annotations

import struct
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import compress, groupby, repeat
from operator import attrgetter, is_not
from typing import Any, Protocol, cast

from agent.branches import SupersededBranches
from agent.engine_time import EngineTime
from agent.policies.base import Discards, EvictionPolicy
from agent.policies.handover import ReloadsPolicy, hand_over
from agent.policy_document import PolicyDocument, SupersedeRule


class Block(Protocol):
    """What the queue reads of a vLLM ``KVCacheBlock``."""

    block_id: int

    @property
    def block_hash(self) -> bytes | None: ...


BLOCK_ID = attrgetter("block_id")
BLOCK_HASH = attrgetter("block_hash")
"""A block's fields (C-level reads)."""
HashOf = Callable[[Any], "bytes | None"]
"""How the queue reads a block's hash (``BLOCK_HASH`` unless the engine knows a cheaper
read of the same value). Whether a list of them are all set is ``all(keys)`` (a hash is
never empty): ``None in keys`` would compare each hash with ``None``, twice the cost."""


class QueueHooks(Protocol):
    """The agent side of one queue (events, hot reload); see ``engine_agent``."""

    def before_call(self) -> object:
        """Called at the start of ``popleft_n`` and ``append_n`` (engine thread); what it
        returns is ignored."""

    def evicted(self, hashes: list[int], now: float) -> None:
        """Cached blocks with these hashes (low 64 bits) were just taken for reuse."""


def hash64(key: bytes, group_suffix: int = 4) -> int:
    """The low 64 bits of a vLLM block hash, as a signed int (what kvwise events carry).

    vLLM publishes ``int.from_bytes(hash, "big") & (2**64 - 1)`` when integer hashes are
    on: the same 64 bits, read unsigned. ``key`` is a ``BlockHashWithGroupId`` (the hash
    followed by a 4-byte group id) unless ``group_suffix`` is 0.
    """
    end = len(key) - group_suffix
    return int.from_bytes(key[end - 8 : end], "big", signed=True)


_LAYOUTS: dict[tuple[int, int, int], struct.Struct] = {}
"""``hashes64``'s unpackers by (keys, bytes per key, group suffix)."""
MAX_LAYOUTS = 1024
MAX_LAYOUT_KEYS = 256
"""Keys one cached unpacker reads at most (an unpacker costs about 40 bytes per key):
the cache stays under about 10 MB whatever prompt lengths come. More keys are read in
runs of this many."""


def hashes64(keys: Sequence[bytes], group_suffix: int = 4) -> list[int]:
    """``hash64`` of each key, in one C call when they are all the same length (vLLM's
    are: one hash function per engine): their concatenation unpacked as big-endian
    signed 64-bit fields, the bytes around them skipped."""
    n = len(keys)
    size = len(keys[0]) if n else 0
    if size < 8 + group_suffix or list(map(len, keys)).count(size) != n:
        return [hash64(key, group_suffix) for key in keys]
    if n > MAX_LAYOUT_KEYS:
        step = MAX_LAYOUT_KEYS
        return [h for lo in range(0, n, step) for h in hashes64(keys[lo : lo + step], group_suffix)]
    layout = _LAYOUTS.get((n, size, group_suffix))
    if layout is None:
        if len(_LAYOUTS) >= MAX_LAYOUTS:
            _LAYOUTS.clear()
        field = f"{size - 8 - group_suffix}xq{group_suffix}x"
        layout = _LAYOUTS[n, size, group_suffix] = struct.Struct(">" + field * n)
    return list(layout.unpack(b"".join(keys)))


class KvwiseFreeQueue:
    """vLLM's free-queue surface over an evictor. ``blocks[i].block_id`` must be ``i``."""

    def __init__(
        self,
        blocks: Sequence[Any],
        evictor: EvictionPolicy,
        *,
        hooks: QueueHooks | None = None,
        clock: Callable[[], float] = time.time,
        hash_of: HashOf = BLOCK_HASH,
        engine_time: EngineTime | None = None,
        supersede: SupersedeRule = "off",
    ) -> None:
        """``hash_of`` reads a block's hash: by default its ``block_hash``; the engine
        integration may pass a cheaper read of the same value. ``engine_time`` (the
        agent's, else one of its own) times ``popleft_n`` and ``append_n`` on a sample.
        ``supersede``: the rule in force until ``set_supersede`` (the document's)."""
        n = len(blocks)
        if any(block.block_id != i for i, block in enumerate(blocks)):
            raise ValueError("blocks[i].block_id must equal i")
        self.blocks = list(blocks)
        self.evictor = evictor
        self.hooks = hooks
        self.clock = clock
        self.hash_of = hash_of
        self.engine_time = engine_time if engine_time is not None else EngineTime()
        self.num_free_blocks = n
        # The end of the dict is the head: popitem() takes it in O(1).
        self._fresh: dict[int, Any] = {block.block_id: block for block in reversed(self.blocks)}
        self._cached: dict[int, None] = {}  # free block ids the evictor holds, release order
        self._unpinned: OrderedDict[int, Any] = OrderedDict()
        self._hits: list[int] = []  # removed from the evictor's free set, touch not yet sent
        # Side table, per block id.
        self.offset = [0] * n
        self.code = [0] * n
        self.hash = [0] * n
        # Blocks holding each stored hash (vLLM does not deduplicate: two requests computing
        # one prompt in one step store it twice), and whether a block is counted there.
        self._copies: dict[int, int] = {}
        self._counted = [False] * n
        self._fresh_held = 0  # fresh blocks counted there (prepended with their hash)
        self.supersede: SupersedeRule = supersede
        self.branches: SupersededBranches | None = None
        """The ``tree`` rule's links and marks while it is in force on this evictor."""
        self._track_branches()

    # --- vLLM's surface --------------------------------------------------------------------
    def popleft(self) -> Any:
        if self.num_free_blocks <= 0:
            raise ValueError("No free blocks available")
        return self.popleft_n(1)[0]

    def popleft_n(self, n: int) -> list[Any]:
        if n <= 0:
            return []
        if n > self.num_free_blocks:
            raise ValueError(f"cannot pop {n} blocks: {self.num_free_blocks} free")
        started = self.engine_time.begin()
        if self.hooks is not None:
            self.hooks.before_call()
        if self._hits:
            self._send_hits()
        fresh = self._fresh
        if fresh:
            out = [fresh.popitem()[1] for _ in range(min(n, len(fresh)))]
            if self._fresh_held:
                self._reuse_held(out)
            if len(out) < n:
                out += self._evict(n - len(out))
        else:
            out = self._evict(n)
        if len(out) < n:
            unpinned = self._unpinned
            out += [
                unpinned.popitem(last=False)[1] for _ in range(min(n - len(out), len(unpinned)))
            ]
        if len(out) != n:
            raise RuntimeError(f"free queue out of sync: {n} wanted, {len(out)} found")
        self.num_free_blocks -= n
        if started:
            self.engine_time.end(started, n)
        return out

    def _evict(self, n: int) -> list[Any]:
        branches = self.branches
        if branches is not None and branches.superseded:
            victims = self._superseded_victims(branches, n)
        else:
            victims = self.evictor.evict(n)
        if not victims:
            return []
        cached = self._cached
        try:
            for block_id in victims:  # a plain loop: cheaper than map over __delitem__
                del cached[block_id]
        except KeyError as exc:
            raise RuntimeError(f"evictor returned block {exc} that is not free") from None
        blocks = self.blocks
        out = [blocks[block_id] for block_id in victims]
        # Every victim was cached when freed, so the side table holds its hash; one whose
        # hash vLLM dropped while it was free through a path not reported to the queue left
        # the cache then, and is reported now (a prefix-cache reset or a connector's
        # evict_blocks is reported at once: drop_all_cached, drop_hashes).
        self._content_left(victims)
        return out

    def _superseded_victims(self, branches: SupersededBranches, n: int) -> list[int]:
        """Superseded blocks still free and untouched first (out of the evictor, which
        ``Discards``), then the evictor's victims."""
        victims = branches.victims(n, self._cached)
        if victims:
            cast(Discards, self.evictor).discard(victims)  # ``_track_branches`` checked
        if len(victims) < n:
            victims += self.evictor.evict(n - len(victims))
        return victims

    def _reuse_held(self, popped: list[Any]) -> None:
        """Fresh blocks ``popped`` for reuse: the content of those prepended with their
        hash leaves the cache now (where no other block holds it)."""
        ids = list(map(BLOCK_ID, popped))
        self._fresh_held -= sum(map(self._counted.__getitem__, ids))
        self._content_left(ids)

    def _content_left(self, ids: Sequence[int]) -> None:
        """Blocks ``ids`` no longer hold what they held: the hashes no other block holds
        are reported evicted now."""
        hashes = self._uncount(ids)
        if hashes and self.hooks is not None:
            self.hooks.evicted(hashes, self.clock())

    def _uncount(self, ids: Sequence[int]) -> list[int]:
        """Blocks ``ids`` are reused: the hashes no other block holds any more (their
        content left the cache)."""
        copies, table, counted = self._copies, self.hash, self._counted
        gone: list[int] = []
        for block_id in ids:
            if counted[block_id]:
                counted[block_id] = False
                hash_ = table[block_id]
                left = copies[hash_] - 1
                if left:
                    copies[hash_] = left
                else:
                    del copies[hash_]
                    gone.append(hash_)
        return gone

    def remove(self, block: Any) -> None:
        bid = block.block_id
        if self._cached.pop(bid, 0) is None:
            self._hits.append(bid)  # the evictor hears of it, batched, before its next use
        elif self._fresh.pop(bid, None) is not None:
            self._fresh_held -= self._counted[bid]  # a hit on a block prepended with its hash
        elif self._unpinned.pop(bid, None) is None:
            raise RuntimeError(f"remove() called on a block that is not free: {bid}")
        self.num_free_blocks -= 1

    def append(self, block: Any) -> None:
        self.append_n([block])

    def append_n(self, blocks: Sequence[Any]) -> None:
        if not blocks:
            return
        started = self.engine_time.begin()
        if self.hooks is not None:
            self.hooks.before_call()
        if self._hits:
            self._send_hits()
        keys = list(map(self.hash_of, blocks))
        if not all(keys):
            unpinned = self._unpinned
            hashless = [block for block, key in zip(blocks, keys, strict=True) if key is None]
            for block in hashless:
                unpinned[block.block_id] = block
            self._dropped_in_use(hashless)
            ids = [b.block_id for b, key in zip(blocks, keys, strict=True) if key is not None]
        else:
            ids = list(map(BLOCK_ID, blocks))
        if ids:
            self._free(ids)
        self.num_free_blocks += len(blocks)
        if started:
            self.engine_time.end(started, len(blocks))

    def _free(self, ids: list[int]) -> None:
        """Cached blocks become evictable, stamped now, each with its side-table category
        and prompt offset (one evictor call per run of equal categories)."""
        now = self.clock()
        offset, code = self.offset, self.code
        offs = [offset[block_id] for block_id in ids]
        codes = [code[block_id] for block_id in ids]
        free = self.evictor.free
        if codes.count(codes[0]) == len(codes):
            free(ids, offs, now, codes[0])
        else:
            start = 0
            for run_code, run in groupby(codes):
                end = start + sum(1 for _ in run)
                free(ids[start:end], offs[start:end], now, run_code)
                start = end
        cached = self._cached
        for block_id in ids:  # a plain loop: cheaper than update() from pairs
            cached[block_id] = None

    def switch_evictor(self, evictor: EvictionPolicy) -> None:
        """Hot reload of the evictor family: staged hits reach the old evictor, then every
        block it holds moves into the fresh ``evictor`` in its victim order
        (``agent.policies.handover``); the free blocks and the side table stay as they are."""
        if self._hits:
            self._send_hits()
        hand_over(self.evictor, evictor, self.clock())
        self.evictor = evictor
        self._track_branches()

    def follow(self, doc: PolicyDocument) -> None:
        """The queue's part of a document put in force (engine thread): its ``supersede``."""
        self.set_supersede(doc.supersede)

    def set_supersede(self, rule: SupersedeRule) -> None:
        """From the next call on, demote what ``rule`` supersedes (the document's
        ``supersede``; engine thread). Tracking starts afresh when it is turned on and
        is kept across documents that leave it on."""
        if rule != self.supersede:
            self.supersede = rule
            self.branches = None
            self._track_branches()

    def _track_branches(self) -> None:
        """Track branches where the rule is on and the evictor is ``wa``'s (it takes the
        document and ``Discards``); a baseline, a fixed control, runs as it is."""
        evictor = self.evictor
        on = self.supersede == "tree"
        on = on and isinstance(evictor, ReloadsPolicy) and isinstance(evictor, Discards)
        if not on:
            self.branches = None
        elif self.branches is None:
            self.branches = SupersededBranches(len(self.blocks), self.hash)

    def prepend_n(self, blocks: Sequence[Any]) -> None:
        if not blocks:
            return
        self._fresh.update((block.block_id, block) for block in reversed(blocks))
        self.num_free_blocks += len(blocks)
        counted = self._counted
        held = [block for block in blocks if counted[block.block_id]]
        if held:
            self._prepend_held(held)

    def _prepend_held(self, held: list[Any]) -> None:
        """Blocks with stored content put back at the front: one that kept its hash still
        holds that content (reported evicted when popped for reuse); one without lost it
        while in use."""
        hash_of = self.hash_of
        hashless = [block for block in held if hash_of(block) is None]
        self._fresh_held += len(held) - len(hashless)
        if hashless:
            self._dropped_in_use(hashless)

    def _dropped_in_use(self, hashless: Sequence[Any]) -> None:
        """Blocks given back without a hash: one that had stored content lost it while in
        use (a connector's ``evict_blocks``), so that content left the cache."""
        self._content_left(list(map(BLOCK_ID, hashless)))

    def get_all_free_blocks(self) -> list[Any]:
        """Every free block: fresh (pop order), cached (release order, not the evictor's
        victim order, which would cost a full sort), unpinned (pop order)."""
        blocks = self.blocks
        return [
            *reversed(self._fresh.values()),
            *(blocks[i] for i in self._cached),
            *self._unpinned.values(),
        ]

    def iter_blocks_after(self, cursor: Any | None) -> Iterator[Any]:
        """Free blocks after ``cursor`` in ``get_all_free_blocks`` order (O(free blocks))."""
        seen = cursor is None
        for block in self.get_all_free_blocks():
            if seen:
                yield block
            elif block is cursor:
                seen = True

    # --- side table (called by the integration's wrappers) ----------------------------------
    def drop_all_cached(self) -> None:
        """The engine dropped every block's hash (vLLM's ``reset_prefix_cache``): all the
        content stored left the cache, reported evicted now; the free blocks the evictor
        held hold nothing any more and are reused first."""
        gone = list(self._copies)
        self._copies.clear()
        self._counted = [False] * len(self.blocks)
        self._fresh_held = 0
        if gone and self.hooks is not None:
            self.hooks.evicted(gone, self.clock())
        if self._hits:
            self._send_hits()
        emptied = self._evict(len(self._cached))
        self._fresh.update((block.block_id, block) for block in reversed(emptied))

    def drop_hashes(self, ids: Iterable[int]) -> None:
        """The engine dropped the hashes of blocks ``ids`` (a KV connector's
        ``evict_blocks``; an id whose block still has its hash is left alone). A free one
        the evictor held holds nothing any more: it leaves the evictor (``_empty``) for the
        head of the fresh zone, reused first. Its content, and that of a fresh one
        prepended with its hash, is reported evicted now (where no other block holds it).
        One in use is reported when freed, without its hash (``_dropped_in_use``)."""
        hash_of, blocks, cached = self.hash_of, self.blocks, self._cached
        emptied: list[int] = []
        held: list[int] = []
        for block_id in dict.fromkeys(ids):  # each once, in the order named
            if hash_of(blocks[block_id]) is not None:
                continue
            if block_id in cached:
                emptied.append(block_id)
            elif self._counted[block_id] and block_id in self._fresh:
                held.append(block_id)
        if emptied:
            self._empty(emptied)
        if held:
            self._fresh_held -= len(held)
        self._content_left(emptied + held)

    def _empty(self, ids: list[int]) -> None:
        """Free cached blocks ``ids`` lost their hash: out of the evictor, to the head of
        the fresh zone (the last one named is popped first).

        Every built-in evictor (each registered policy, and the device evictor through
        ``wa``'s) ``Discards``: it forgets them, and each is a new block when freed again.
        One without that ability (registered outside kvwise) is told they are in use, a
        touch sent with the next hits: it holds them, never as victims, until they are
        freed again, when it takes the new content for a hit of the old."""
        cached, fresh, blocks = self._cached, self._fresh, self.blocks
        for block_id in ids:
            del cached[block_id]
            fresh[block_id] = blocks[block_id]
        evictor = self.evictor
        if isinstance(evictor, Discards):
            evictor.discard(ids)
        else:
            self._hits += ids  # touched with the next hits: in use, never a victim

    def moved(self, src: Any, dst: Any) -> None:
        """The engine moved ``src``'s hashes to ``dst`` (vLLM's ``move_block_hashes``: a
        private copy of the content takes over its cache entries; both are in use): the
        side table's entry follows the content, which stays cached."""
        s, d = src.block_id, dst.block_id
        if self.hash_of(dst) is None:
            return  # ``src`` had no hash: nothing moved
        self._content_left([d])
        self.offset[d], self.code[d], self.hash[d] = self.offset[s], self.code[s], self.hash[s]
        self._counted[d], self._counted[s] = self._counted[s], False

    def held_content(self, block: Any) -> int | None:
        """The hash (low 64 bits) of the content noted in ``block`` (``note_stored``), or
        None where it holds none noted here."""
        block_id = block.block_id
        return self.hash[block_id] if self._counted[block_id] else None

    def note_partial(
        self, block: Any, position: int, code: int | None, *, replaced: bool = False
    ) -> None:
        """``block`` (in use) got a partial prefix-cache entry (vLLM's
        ``cache_partial_block``), which is not reported stored. ``replaced``: the engine
        wrote over its content first and dropped its cache entries (a hybrid model's state
        checkpoint), so what it held left the cache, reported evicted now (where no other
        block holds it). If it holds no content noted here, the evictor files it, once
        freed, at prompt block ``position`` under ``code`` (the storing request's;
        ``None``: left as is), not as what it last held."""
        block_id = block.block_id
        if replaced:
            self._content_left([block_id])
        if self._counted[block_id] or self.hash_of(block) is None:
            return
        self.offset[block_id] = position
        if code is not None:
            self.code[block_id] = code

    def _send_hits(self) -> None:
        hits, self._hits = self._hits, []
        self.evictor.touch(hits, self.clock())

    def note_stored(
        self,
        blocks: Sequence[Any],
        first: int,
        code: int,
        *,
        parent: Any | None = None,
        parting: bool = False,
    ) -> tuple[list[int], Sequence[int], list[int]]:
        """``blocks`` (a request's, from prompt position ``first``) just got their hashes:
        remember position, category and hash. Returns the hashes, their prompt positions
        and the ids of the blocks that have them (blocks without a hash, e.g. null or
        masked ones, are skipped and get none). ``parent``: the request's block before
        them (None from its prompt's start); ``parting``: this is the request's first
        store, after its hits (both read only while branches are tracked)."""
        keys: list[Any] = list(map(self.hash_of, blocks))
        ids = list(map(BLOCK_ID, blocks))
        offsets: Sequence[int] = range(first, first + len(ids))
        if not all(keys):
            kept = list(map(is_not, keys, repeat(None)))
            keys = list(compress(keys, kept))
            ids = list(compress(ids, kept))
            offsets = list(compress(offsets, kept))
        hashes = hashes64(keys)
        self._uncount(ids)  # a block reused without an eviction (its hash dropped in use)
        offset, codes, table = self.offset, self.code, self.hash
        copies, counted = self._copies, self._counted
        for bid, position, hash_ in zip(ids, offsets, hashes, strict=True):
            offset[bid] = position
            codes[bid] = code
            table[bid] = hash_
            copies[hash_] = copies.get(hash_, 0) + 1
            counted[bid] = True
        branches = self.branches
        if branches is not None and ids:
            after = branches.root if parent is None else parent.block_id
            branches.stored(after, ids, parting)
        return hashes, offsets, ids

    def note_hits(self, blocks: Sequence[Any], code: int) -> tuple[list[int], list[int]]:
        """A request of category ``code`` reuses cached ``blocks``: its category becomes
        theirs (attribution to the last accessor). Returns their hashes and offsets."""
        codes = self.code
        ids = [block.block_id for block in blocks]
        for bid in ids:
            codes[bid] = code
        if self.branches is not None and ids:
            self.branches.touched(ids)
        return list(map(self.hash.__getitem__, ids)), list(map(self.offset.__getitem__, ids))

    def __len__(self) -> int:
        return self.num_free_blocks

    def __repr__(self) -> str:
        return (
            f"KvwiseFreeQueue(free={self.num_free_blocks}, fresh={len(self._fresh)}, "
            f"cached={len(self._cached)}, unpinned={len(self._unpinned)}, "
            f"evictor={type(self.evictor).__name__})"
        )

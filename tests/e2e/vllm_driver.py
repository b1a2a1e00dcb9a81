"""Drives a real vLLM engine for tests/e2e/test_vllm.py; runs inside the vLLM virtualenv.

A tiny randomly initialised 2-layer Llama (``load_format="dummy"``, prompts as token ids)
with prefix caching and a small cache. The workload: rounds of one ``chat`` request (a
shared system prompt plus a few new blocks) followed by a flood of ``doc`` requests (long,
unique, never reused) big enough to push the system prompt out of an LRU cache. The
figure is the ``num_cached_tokens`` of each ``chat`` request after a flood.

    python vllm_driver.py [--out FILE] workload --model DIR [--controller URL ...]

With ``--controller``, the phase ``before`` runs on the policy in force, then the driver
pushes ``--override`` through the controller's REST API, waits until the engine's agent
reports that version applied (stepping the engine meanwhile; no restart), and runs the
phase ``after``. Prints one JSON line with the results.

    python vllm_driver.py pool --blocks N --ops K --seed S

Builds vLLM's real ``BlockPool`` twice, stock and with the kvwise queue (plugin
registered), applies the same random allocate / cache / hit / free operations to both and
checks after each one that both hold the same free-block count, that the kvwise queue holds
exactly the blocks with no reference, that popped blocks are unlinked, and that the null
block is block 0. Prints (or writes) one JSON line.

    python vllm_driver.py drop [--evictor wa]

A connector's ``BlockPool.evict_blocks`` on the real ``BlockPool`` with the kvwise queue:
free cached blocks whose hashes it drops leave the evictor (any built-in one: each
``Discards``), are reported evicted at the drop and are the next blocks allocated; blocks
in use are reported when freed. Also
``move_block_hashes``: the copy carries the content's side-table entry, and freeing the
original reports nothing; ``cache_partial_block``: the block gets the request's prompt
position and category. Checks as it goes; prints (or writes) one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

BLOCK = 32
SYSTEM_BLOCKS = 4
CHAT_NEW_BLOCKS = 2
DOC_BLOCKS = 16
DOCS_PER_FLOOD = 5
VOCAB = 1000


def write_model(path: Path) -> None:
    """config.json of a 2-layer Llama: hidden 128, 2 heads of 64, vocab 1000."""
    path.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "num_hidden_layers": 2,
        "vocab_size": VOCAB,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "torch_dtype": "float32",
        "bos_token_id": 1,
        "eos_token_id": 2,
        "tie_word_embeddings": False,
    }
    (path / "config.json").write_text(json.dumps(config))


class Workload:
    def __init__(self, llm: Any, seed: int) -> None:
        from vllm import SamplingParams

        self.llm = llm
        self.rng = random.Random(seed)
        self.system = self.tokens(SYSTEM_BLOCKS * BLOCK)
        self.params = {
            cat: SamplingParams(max_tokens=1, detokenize=False, extra_args={"kv_category": cat})
            for cat in ("chat", "doc", "poke")
        }

    def tokens(self, n: int) -> list[int]:
        return [self.rng.randrange(3, VOCAB) for _ in range(n)]

    def run(self, prompt: list[int], category: str) -> int:
        out = self.llm.generate(
            [{"prompt_token_ids": prompt}], self.params[category], use_tqdm=False
        )
        return int(out[0].num_cached_tokens or 0)

    def chat(self) -> int:
        return self.run(self.system + self.tokens(CHAT_NEW_BLOCKS * BLOCK + 5), "chat")

    def flood(self) -> None:
        for _ in range(DOCS_PER_FLOOD):
            self.run(self.tokens(DOC_BLOCKS * BLOCK + 5), "doc")

    def rounds(self, n: int) -> list[int]:
        """Cached tokens of the chat request after each of ``n`` floods."""
        self.chat()  # the system prompt is cached from here on (if kept)
        out = []
        for _ in range(n):
            self.flood()
            out.append(self.chat())
        return out


def push_override(url: str, token: str, category: str, body: dict[str, float]) -> int:
    import httpx

    r = httpx.put(
        f"{url}/v1/policy/overrides/{category}",
        json=body,
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    )
    r.raise_for_status()
    return int(r.json()["version"])


def wait_applied(url: str, worker: str, version: int, work: Workload, timeout: float) -> float:
    """Step the engine (tiny requests) until ``worker`` reports ``version`` applied."""
    import httpx

    start = time.monotonic()
    while time.monotonic() - start < timeout:
        work.run(work.tokens(BLOCK + 1), "poke")
        agents = httpx.get(f"{url}/v1/agents", timeout=5).json()
        if any(a["id"] == worker and a["applied_version"] >= version for a in agents):
            return time.monotonic() - start
        time.sleep(0.2)
    raise SystemExit(f"version {version} not applied by {worker} within {timeout} s")


def workload(args: argparse.Namespace) -> dict[str, Any]:
    from vllm import LLM

    write_model(Path(args.model))
    llm = LLM(
        model=args.model,
        load_format="dummy",
        skip_tokenizer_init=True,
        enable_prefix_caching=True,
        block_size=BLOCK,
        num_gpu_blocks_override=args.blocks,
        gpu_memory_utilization=0.3,
        max_model_len=1024,
        max_num_seqs=4,
        enforce_eager=True,
        seed=0,
    )
    work = Workload(llm, args.seed)
    result: dict[str, Any] = {"kvwise": os.environ.get("KVWISE_ENABLE") == "1"}
    result["before"] = work.rounds(args.rounds)
    if args.controller:
        version = push_override(args.controller, args.token, "doc", json.loads(args.override))
        result["version"] = version
        result["applied_after_s"] = wait_applied(
            args.controller, args.worker, version, work, timeout=60
        )
        result["after"] = work.rounds(args.rounds)
    del llm  # shuts the engine core down: its agent flushes its events
    return result


def pool(args: argparse.Namespace) -> dict[str, Any]:
    """Stock and kvwise ``BlockPool`` in lockstep on random operations."""
    os.environ["KVWISE_ENABLE"] = "1"
    os.environ.setdefault("KVWISE_REDIS_URL", "redis://127.0.0.1:1/0")  # no events needed
    from vllm.v1.core import block_pool as bp
    from vllm.v1.core.kv_cache_utils import make_block_hash_with_group_id

    stock = bp.BlockPool(args.blocks, enable_caching=True, hash_block_size=BLOCK)
    from agent.integrations import vllm as plugin

    plugin.register()
    kv = bp.BlockPool(args.blocks, enable_caching=True, hash_block_size=BLOCK)
    assert type(kv.free_block_queue).__name__ == "KvwiseFreeQueue", kv.free_block_queue
    assert kv.null_block.block_id == 0 and stock.null_block.block_id == 0
    rng = random.Random(args.seed)
    live: list[tuple[list[Any], list[Any]]] = []  # running requests' blocks: stock, kvwise
    counts = {"alloc": 0, "hit": 0, "free": 0, "evicted": 0, "reset": 0}

    def cached_free(p: Any) -> list[Any]:
        return [b for b in p.blocks if b.ref_cnt == 0 and b.block_hash is not None]

    for step in range(args.ops):
        kind = rng.random()
        if kind < 0.01:  # every request done, then a prefix-cache reset
            for s_b, k_b in live:
                stock.free_blocks(reversed(s_b))
                kv.free_blocks(reversed(k_b))
            live.clear()
            assert stock.reset_prefix_cache() and kv.reset_prefix_cache(), step
            assert not cached_free(kv) and len(kv.free_block_queue.evictor) == 0, step
            counts["reset"] += 1
        elif kind < 0.45 and stock.get_num_free_blocks() > 1:
            n = rng.randint(1, min(8, stock.get_num_free_blocks()))
            hashed = rng.random() < 0.8
            pair = []
            for p in (stock, kv):
                before = len(cached_free(p))
                got = p.get_new_blocks(n)
                assert all(b.prev_free_block is None and b.next_free_block is None for b in got)
                assert all(b.block_hash is None and b.ref_cnt == 1 for b in got)
                if p is kv:
                    counts["evicted"] += before - len(cached_free(p))
                if hashed:  # cached, as cache_full_blocks leaves them
                    for b in got:
                        key = make_block_hash_with_group_id(rng.randbytes(32), 0)
                        p._insert_block_hash(key, b, None)
                pair.append(got)
            live.append((pair[0], pair[1]))
            counts["alloc"] += 1
        elif kind < 0.65:
            s_c, k_c = cached_free(stock), cached_free(kv)
            k = min(rng.randint(1, 6), len(s_c), len(k_c))
            if k:  # a prefix hit on free cached blocks: touch removes them from the queue
                s_hit, k_hit = rng.sample(s_c, k), rng.sample(k_c, k)
                stock.touch(s_hit)
                kv.touch(k_hit)
                live.append((s_hit, k_hit))
                counts["hit"] += 1
        elif live:
            s_b, k_b = live.pop(rng.randrange(len(live)))
            stock.free_blocks(reversed(s_b))
            kv.free_blocks(reversed(k_b))
            counts["free"] += 1
        queue = kv.free_block_queue
        assert stock.get_num_free_blocks() == kv.get_num_free_blocks(), step
        listed = queue.get_all_free_blocks()
        assert len(listed) == len({b.block_id for b in listed}) == queue.num_free_blocks, step
        truth = {b.block_id for b in kv.blocks if b.ref_cnt == 0 and not b.is_null}
        assert {b.block_id for b in listed} == truth, step
    return {"checks": args.ops, **counts, "free_at_end": kv.get_num_free_blocks()}


class SeenEvictions:
    """The queue's hooks, passed through, with each ``evicted`` call kept."""

    def __init__(self, hooks: Any) -> None:
        self.hooks = hooks
        self.calls: list[tuple[list[int], float]] = []

    def before_call(self) -> object:
        return self.hooks.before_call()

    def evicted(self, hashes: list[int], now: float) -> None:
        self.calls.append((list(hashes), now))
        self.hooks.evicted(hashes, now)


class DropPool:
    """A real 12-block ``BlockPool`` with the kvwise queue, its eviction reports kept."""

    def __init__(self, seed: int) -> None:
        from vllm.v1.core import block_pool as bp

        self.kv = bp.BlockPool(12, enable_caching=True, hash_block_size=BLOCK)
        self.queue = self.kv.free_block_queue
        assert type(self.queue).__name__ == "KvwiseFreeQueue", self.queue
        self.seen = SeenEvictions(self.queue.hooks)
        self.queue.hooks = self.seen
        self.rng = random.Random(seed)

    def request(self, n: int, category: str | None = None) -> Any:
        """A request of ``n`` new prompt blocks, of ``category`` (None: unnamed)."""
        from types import SimpleNamespace

        extra = {} if category is None else {"kv_category": category}
        return SimpleNamespace(
            block_hashes=[self.rng.randbytes(32) for _ in range(n)],
            num_prompt_tokens=n * BLOCK,
            sampling_params=SimpleNamespace(extra_args=extra),
        )

    def stored(self, n: int) -> tuple[list[Any], list[int]]:
        """``n`` new blocks, stored by a request (``cache_full_blocks``), and their hashes."""
        from vllm.v1.core.kv_cache_utils import make_block_hash_with_group_id

        from agent.integrations.block_queue import hash64

        request = self.request(n)
        blocks = self.kv.get_new_blocks(n)
        self.kv.cache_full_blocks(request, blocks, 0, n, BLOCK, 0)
        keys = request.block_hashes
        return blocks, [hash64(make_block_hash_with_group_id(k, 0)) for k in keys]

    def check_free(self) -> None:
        listed = {b.block_id for b in self.queue.get_all_free_blocks()}
        assert listed == {b.block_id for b in self.kv.blocks if b.ref_cnt == 0 and not b.is_null}


def drop(args: argparse.Namespace) -> dict[str, Any]:
    """A connector's ``evict_blocks``, a ``move_block_hashes`` and a
    ``cache_partial_block`` on the real pool."""
    os.environ["KVWISE_ENABLE"] = "1"
    os.environ.setdefault("KVWISE_REDIS_URL", "redis://127.0.0.1:1/0")  # no events needed
    os.environ["KVWISE_EVICTOR"] = args.evictor
    from agent.integrations import vllm as plugin

    plugin.register()
    pool = DropPool(args.seed)
    dropped, fresh = _connector_drop(pool)
    _hashes_moved(pool)
    _partial_entry(pool)
    _written_over(pool)
    return {"dropped": dropped, "fresh_before": fresh, "events": len(pool.seen.calls)}


def _connector_drop(pool: DropPool) -> tuple[list[int], list[int]]:
    """Two free cached blocks and one in use lose their hashes (``evict_blocks``): the free
    ones leave the evictor, are reported at once and reused first; the one in use is
    reported when freed. The blocks dropped, and the two never filled before them."""
    from agent.policies.base import Discards

    kv, queue, seen = pool.kv, pool.queue, pool.seen
    a, a_hashes = pool.stored(4)  # blocks 1-4, freed: cached, the evictor's
    kv.free_blocks(reversed(a))
    b, b_hashes = pool.stored(3)  # blocks 5-7, in use
    fresh = [b.block_id for b in queue.get_all_free_blocks()][:2]  # never filled: 8, 9
    dropped = {a[1].block_id, a[2].block_id}
    before = time.time()
    kv.evict_blocks({*dropped, b[0].block_id})
    after = time.time()
    assert all(a[i].block_hash is None for i in (1, 2)) and b[0].block_hash is None
    assert len(seen.calls) == 1, seen.calls
    hashes, at = seen.calls[0]
    assert sorted(hashes) == sorted(a_hashes[1:3]) and before <= at <= after, seen.calls
    assert isinstance(queue.evictor, Discards)  # every built-in evictor lets them go
    assert not dropped & {i for i in range(12) if i in queue.evictor}
    assert a[0].block_id in queue.evictor and a[3].block_id in queue.evictor
    assert len(queue.evictor) == 2
    pool.check_free()
    taken = kv.get_new_blocks(2)
    assert {t.block_id for t in taken} == dropped, (taken, fresh)
    assert len(seen.calls) == 1, seen.calls  # reported at the drop, not again
    kv.free_blocks(reversed(b))  # b[0] comes back hash-less: reported now
    assert seen.calls[1][0] == b_hashes[:1], seen.calls
    pool.check_free()
    return sorted(dropped), fresh


def _hashes_moved(pool: DropPool) -> None:
    """A request keeps writing into its block: a copy takes over its cache entries
    (``move_block_hashes``); freeing the original reports nothing, dropping the copy's
    hash reports the content."""
    kv, queue, seen = pool.kv, pool.queue, pool.seen
    src, src_hashes = pool.stored(1)
    queue.code[src[0].block_id] = 3
    dst = kv.get_new_blocks(1)
    calls = len(seen.calls)
    kv.move_block_hashes(src[0], dst[0])
    kv.free_blocks(src)  # hash-less now, but its content lives on in dst
    assert len(seen.calls) == calls, seen.calls[calls:]
    assert queue.code[dst[0].block_id] == 3
    kv.free_blocks(dst)
    assert dst[0].block_id in queue.evictor
    kv.evict_blocks({dst[0].block_id})
    assert seen.calls[calls:] == [(src_hashes, seen.calls[-1][1])], seen.calls[calls:]
    pool.check_free()


def _partial_entry(pool: DropPool) -> None:
    """A prompt tail ending inside a block of a group with 64-token blocks gets a partial
    entry (``cache_partial_block``): the block is filed at its request's position and
    category, never reported stored."""
    from agent.integrations import vllm as plugin

    kv, queue, seen = pool.kv, pool.queue, pool.seen
    tail = pool.request(3, category="tail")
    part = kv.get_new_blocks(1)
    code = plugin._category(plugin._state.engine, tail)[1]
    part_id = part[0].block_id
    queue.offset[part_id], queue.code[part_id] = 7, code + 1  # what it held before
    kv.cache_partial_block(tail, part[0], 3 * BLOCK, 0, 2 * BLOCK)
    assert part[0].block_hash is not None
    assert (queue.offset[part_id], queue.code[part_id]) == (1, code)
    calls = len(seen.calls)
    kv.free_blocks(part)
    assert part_id in queue.evictor and len(seen.calls) == calls  # never reported stored
    pool.check_free()


def _written_over(pool: DropPool) -> None:
    """A hybrid model's checkpoint written over a stored block still in use
    (``cache_partial_block`` replacing its entries): what it held is reported evicted at
    once, after the request's INSERT of it (the request is recorded first, its prompt
    not yet whole), and not again when the block is reused."""
    from vllm.v1.core.kv_cache_utils import make_block_hash_with_group_id

    from agent.integrations import vllm as plugin
    from agent.integrations.block_queue import hash64

    kv, seen = pool.kv, pool.seen
    request = pool.request(3)
    blocks = kv.get_new_blocks(2)
    kv.cache_full_blocks(request, blocks, 0, 2, BLOCK, 0)
    content = hash64(make_block_hash_with_group_id(request.block_hashes[1], 0))
    assert not getattr(request, plugin.REQUEST_REPORT_ATTR).recorded  # prompt not whole
    calls = len(seen.calls)
    kv.cache_partial_block(
        request, blocks[1], 3 * BLOCK, 0, 2 * BLOCK, replace_existing_hashes=True
    )
    assert [hashes for hashes, _ in seen.calls[calls:]] == [[content]], seen.calls[calls:]
    report = getattr(request, plugin.REQUEST_REPORT_ATTR)
    assert report.recorded and not report.stored_hashes  # its INSERTs went first
    kv.free_blocks(reversed(blocks))
    kv.get_new_blocks(kv.get_num_free_blocks())  # every free block reused
    assert content not in [h for hashes, _ in seen.calls[calls + 1 :] for h in hashes]
    pool.check_free()


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("workload")
    w.add_argument("--model", required=True)
    w.add_argument("--blocks", type=int, default=64)
    w.add_argument("--rounds", type=int, default=3)
    w.add_argument("--seed", type=int, default=1)
    w.add_argument("--controller", default="")
    w.add_argument("--token", default="")
    w.add_argument("--worker", default="")
    w.add_argument("--override", default='{"p_reuse": 0.0}')
    p = sub.add_parser("pool")
    p.add_argument("--blocks", type=int, default=48)
    p.add_argument("--ops", type=int, default=2000)
    p.add_argument("--seed", type=int, default=1)
    d = sub.add_parser("drop")
    d.add_argument("--seed", type=int, default=1)
    d.add_argument("--evictor", default="wa")
    ap.add_argument("--out", default="", help="write the JSON result here (else stdout)")
    args = ap.parse_args()
    commands = {"workload": workload, "pool": pool, "drop": drop}
    result = commands[args.cmd](args)
    if args.out:
        Path(args.out).write_text(json.dumps(result))
    else:
        print(json.dumps(result), flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()

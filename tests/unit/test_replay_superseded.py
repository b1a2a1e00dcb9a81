"""``wa-superseded`` (replay only): what each rule supersedes, and the evictions it demotes."""

from __future__ import annotations

import numpy as np
import pytest

from controlplane.replay import catalog
from controlplane.replay.engine import replay_hits
from controlplane.replay.options import ReplayOptions
from controlplane.replay.superseded import (
    BranchTracker,
    ChatTracker,
    LastAccess,
    Tracker,
    shared_prefix,
    superseding_wa,
    tracker,
)
from controlplane.traces.model import Trace

RAW: dict[str, list[int]] = {}
"""Per test trace (by name), the hash ids it was made from, in access order."""


def _arrivals(rule: Tracker, last: LastAccess, trace: Trace) -> list[list[int]]:
    """What each request of ``trace`` supersedes, told in order, as the hash ids of
    ``_trace``'s prompts (the trace holds them renumbered)."""
    raw = dict(zip(trace.blocks.tolist(), RAW[trace.name], strict=True))
    out = []
    for r in range(trace.n_requests):
        blocks = trace.request_blocks(r).tolist()
        out.append([raw[b] for b in rule.arrive(r, blocks)])
        last.accessed(r, blocks)
    return out


def test_the_tree_rule_supersedes_the_branch_a_request_leaves_at_a_new_parting() -> None:
    prompts = [[1, 2, 3, 4], [1, 2, 5, 6], [1, 2, 7], [1, 2, 5, 6, 8], [1, 2, 5, 9]]
    trace = _trace(prompts)
    last = LastAccess()
    assert _arrivals(BranchTracker(trace, last), last, trace) == [
        [],
        [3, 4],  # leaves 2 for 5: the branch 3, 4 of request 0
        [],  # 2 has parted before: a fan-out point, nothing superseded
        [],  # extends the leaf 6: nothing left behind
        [6, 8],  # parts at 5 for the first time: request 3's branch past 5
    ]
    last = LastAccess()
    every = BranchTracker(trace, last, every_fork=True)
    assert _arrivals(every, last, trace)[2] == [5, 6]  # the latest branch through 2


def test_the_tree_rule_ignores_a_request_that_walks_a_seen_path() -> None:
    prompts = [[1, 2, 3], [1, 4], [1, 2, 3], [1, 2]]
    trace, last = _trace(prompts), LastAccess()
    assert _arrivals(BranchTracker(trace, last), last, trace) == [[], [2, 3], [], []]


def test_the_chat_rule_supersedes_the_parent_past_the_shared_prefix() -> None:
    prompts = [[1, 2, 3], [1, 2, 4, 5], [1, 6], [1, 2, 4, 5, 7], [9]]
    trace = _trace(prompts, chats=[10, 11, 12, 13, 14], parents=[-1, 10, 11, 11, 99])
    last = LastAccess()
    assert _arrivals(ChatTracker(trace), last, trace) == [[], [3], [2, 4, 5], [], []]
    assert shared_prefix([1, 2, 3], [1, 2]) == 2 and shared_prefix([4], [1]) == 0


def test_an_unknown_scope_is_refused_by_name() -> None:
    trace = _trace([[1]])
    with pytest.raises(ValueError, match=r"supersede scope must be one of .*'depth'"):
        tracker("depth", trace, LastAccess())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="supersede scope"):
        superseding_wa("depth")  # type: ignore[arg-type]


def test_superseded_blocks_go_first_tail_first_unless_accessed_since() -> None:
    prompts = [[0, 1, 2], [0, 3]]  # ids 0..n-1: the trace keeps them as they are
    policy = _driven(prompts, times=[0.0, 1.0])
    assert policy.evict(1) == [2] and policy.evict(1) == [1]
    assert policy.demoted == 2
    again = _driven([*prompts, [0, 1, 2]], times=[0.0, 1.0, 2.0])
    assert again.evict(1) == [3]  # 1 and 2 were accessed since: wa's own order (oldest)
    assert again.demoted == 0


def test_wa_superseded_keeps_slow_conversations_over_quick_ones_dead_branches() -> None:
    """Quick conversations replace 16 blocks every second, slow ones 4 every ~8 s: ``wa``
    (LRU order within one category) holds the quick ones' dead branches as long as the
    slow ones' live blocks and loses those; ``wa-superseded`` evicts the dead first,
    under either rule (in a 150-block cache: ``lru`` and ``wa`` hit 432 of 2,146
    accesses, ``wa-superseded`` 768, Belady 784)."""
    trace = _replacing_trace()
    options = ReplayOptions(refit_every_s=20.0)
    policies = {
        "wa": catalog.create("wa", 150, trace, options),
        "tree": catalog.create("wa-superseded", 150, trace, options),
        "chat": superseding_wa("chat")(150, trace, options),
    }
    hits = {name: replay_hits(trace, p, 150, check=True).sum() for name, p in policies.items()}
    assert hits["tree"] > 1.5 * hits["wa"], hits
    assert hits["chat"] > 1.5 * hits["wa"], hits


def _driven(prompts: list[list[int]], times: list[float]):  # type: ignore[no-untyped-def]
    """A ``wa-superseded`` (tree rule) freed ``prompts`` as the replay frees them."""
    trace = _trace(prompts, times=times)
    assert trace.blocks.tolist() == RAW[trace.name]
    policy = superseding_wa("tree")(100, trace, ReplayOptions())
    for ids, t in zip(prompts, times, strict=True):
        policy.free(ids[::-1], range(len(ids) - 1, -1, -1), t, 0)
    return policy


def _replacing_trace() -> Trace:
    """Eight slow conversations (a turn every ~8 s) and quick ones, one after another (ten
    turns a second apart each) over 60 s: a turn keeps its history (one block more than
    the last turn's) and replaces the rest of its prompt, 4 blocks of a slow
    conversation, 16 of a quick one (synthetic, made for this test)."""
    rng = np.random.default_rng(5)
    turns: list[tuple[float, int]] = []
    for conv in range(8):
        t = rng.uniform(0.0, 8.0)
        while t < 60.0:
            turns.append((t, conv))
            t += rng.uniform(6.4, 9.6)
    turns += [(t, 8 + int(t) // 10) for t in np.arange(0.5, 60.0, 1.0).tolist()]
    turns.sort()
    prompts, parents, done, last = [], [], dict[int, int](), dict[int, int]()
    for r, (_, conv) in enumerate(turns):
        n = done.get(conv, 0)
        history = [conv * 1000 + i for i in range(4 + n)]
        replaced = 4 if conv < 8 else 16
        prompts.append(history + [100_000 + r * 100 + k for k in range(replaced)])
        parents.append(last.get(conv, -1))
        done[conv], last[conv] = n + 1, r
    return _trace(
        prompts, chats=list(range(len(turns))), parents=parents, times=[t for t, _ in turns]
    )


def _trace(
    prompts: list[list[int]],
    chats: list[int] | None = None,
    parents: list[int] | None = None,
    times: list[float] | None = None,
) -> Trace:
    n = len(prompts)
    name = f"superseded-test-{len(RAW)}"
    RAW[name] = [b for p in prompts for b in p]
    return Trace.from_arrays(
        name=name,
        source_format="test",
        hash_ids=np.asarray(RAW[name], dtype=np.int64),
        lengths=np.asarray([len(p) for p in prompts], dtype=np.int64),
        timestamps=np.asarray(times if times is not None else range(n), dtype=np.float64),
        types=["text"] * n,
        turns=np.full(n, 2, dtype=np.int64),
        chat_ids=np.asarray(chats if chats is not None else [-1] * n, dtype=np.int64),
        parent_chat_ids=np.asarray(parents if parents is not None else [-1] * n, dtype=np.int64),
    )

"""``trace_stats`` on hand-made traces (every number worked out in a comment), the ideal
hit ratio cross-checked against the replay loop with an infinite cache, and the real
Mooncake sample (no type or turn: those statistics are unavailable, not zero)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from controlplane.replay.bounds import InfinitePolicy
from controlplane.replay.engine import replay_hits
from controlplane.traces.model import Trace
from controlplane.traces.reader import load_trace
from controlplane.traces.synth import synthesize
from controlplane.traces.workload_stats import (
    Quantiles,
    prefix_hits,
    skew_request_share,
    trace_stats,
)

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "mooncake_synthetic.jsonl.gz"


def small() -> Trace:
    # t=0 [1,2,3]  no block seen before                      -> 0 hits
    # t=1 [1,2,4]  1, 2 seen; 4 new                          -> 2 hits
    # t=2 [1,5,2]  1 seen; 5 new breaks the prefix (2 is     -> 1 hit
    #              cached but after the break: a miss)
    # t=4 [2,3]    2, 3 seen                                 -> 2 hits
    # ideal hit ratio = (0 + 2 + 1 + 2) / (3 + 3 + 3 + 2) = 5 / 11
    return Trace.from_requests([[1, 2, 3], [1, 2, 4], [1, 5, 2], [2, 3]], [0.0, 1.0, 2.0, 4.0])


def bailian(
    requests: list[list[int]],
    times: list[float],
    types: list[str],
    turns: list[int],
    chats: list[int],
    parents: list[int],
) -> Trace:
    lengths = np.array([len(r) for r in requests], dtype=np.int64)
    return Trace.from_arrays(
        name="hand",
        source_format="bailian",
        hash_ids=np.array([h for r in requests for h in r], dtype=np.int64),
        lengths=lengths,
        timestamps=np.array(times),
        types=types,
        turns=np.array(turns, dtype=np.int64),
        input_lengths=lengths * 16,
        output_lengths=np.full(len(requests), 10, dtype=np.int64),
        chat_ids=np.array(chats, dtype=np.int64),
        parent_chat_ids=np.array(parents, dtype=np.int64),
    )


def test_ideal_hits_by_hand() -> None:
    s = trace_stats(small())
    assert s.ideal_hits == 5
    assert s.ideal_hit_ratio == pytest.approx(5 / 11)
    assert prefix_hits(small()).tolist() == [0, 2, 1, 2]
    assert (s.requests, s.block_accesses, s.unique_blocks) == (4, 11, 5)
    assert s.duration_s == 4.0
    assert s.qps == pytest.approx(1.0)


def test_reuse_time_quantiles_by_hand() -> None:
    # Next access by a later request: block 1 at t=0,1,2 -> gaps 1, 1; block 2 at
    # t=0,1,2,4 -> 1, 1, 2; block 3 at t=0,4 -> 4; blocks 4 and 5 never again.
    # Sorted gaps [1, 1, 1, 1, 2, 4]: CDF(1) = 4/6 >= 0.5 -> P50 = 1; CDF(2) = 5/6 >= 0.8
    # -> P80 = 2; P90 = P99 = 4 (inverted CDF: always an observed gap).
    s = trace_stats(small())
    assert s.reuse_time == Quantiles(count=6, p50=1.0, p80=2.0, p90=4.0, p99=4.0)
    # One category (no type/turn): the same sample.
    assert s.reuse_time_by_category == {"unknown": s.reuse_time}


def test_lifespans_by_hand() -> None:
    # First to last access: block 1 0->2 = 2 s; block 2 0->4 = 4 s; block 3 0->4 = 4 s;
    # blocks 4 and 5 are accessed once. Reused blocks: [2, 4, 4] -> P50 = 4 (CDF(2) = 1/3).
    # All blocks: [0, 0, 2, 4, 4] -> P50 = 2 (CDF(0) = 0.4, CDF(2) = 0.6), P80 = 4.
    s = trace_stats(small())
    assert s.lifespan == Quantiles(count=3, p50=4.0, p80=4.0, p90=4.0, p99=4.0)
    assert s.lifespan_all_blocks == Quantiles(count=5, p50=2.0, p80=4.0, p90=4.0, p99=4.0)


def test_skew_by_hand() -> None:
    # Hits per request [0, 2, 1, 2], total 5, 90 % = 4.5: the two largest give 4, three
    # give 5 -> 3 of 4 requests.
    assert trace_stats(small()).skew_request_share == 0.75
    assert skew_request_share(np.array([0, 0, 0, 10, 0], dtype=np.int64)) == 0.2
    assert skew_request_share(np.zeros(3, dtype=np.int64)) is None


def test_block_repeated_inside_a_request_is_no_hit() -> None:
    # The first request holds 7 twice: it was not cached when the request arrived, so
    # neither copy hits; the pair inside one request is no reuse. Then 7 hits at t=1.
    t = Trace.from_requests([[7, 7], [7]], [0.0, 1.0])
    s = trace_stats(t)
    assert prefix_hits(t).tolist() == [0, 1]
    assert s.reuse_time == Quantiles(count=1, p50=1.0, p80=1.0, p90=1.0, p99=1.0)
    assert s.lifespan is not None and s.lifespan.count == 1


def test_turns_types_and_single_turn_hits_by_hand() -> None:
    # chat 10 text t1 [1,2]      -> 0 hits   (continued by 11)
    # chat 11 text t2 [1,2,3]    -> 2 hits   (continued by 12)
    # chat 12 text t3 [1,2,3,4]  -> 3 hits
    # chat 13 search t1 [9]      -> 0 hits
    # chat 14 text t1 [1,8]      -> 1 hit
    t = bailian(
        [[1, 2], [1, 2, 3], [1, 2, 3, 4], [9], [1, 8]],
        [0.0, 10.0, 20.0, 25.0, 30.0],
        ["text", "text", "text", "search", "text"],
        [1, 2, 3, 1, 1],
        [10, 11, 12, 13, 14],
        [-1, 10, 11, -1, -1],
    )
    s = trace_stats(t)
    assert s.type_mix == {"search": 0.2, "text": 0.8}
    assert s.multi_turn_share == 0.4  # 2 of 5 requests have turn >= 2
    assert s.multi_turn_share_by_type == {"search": 0.0, "text": 0.5}
    assert s.next_turn_prob_first == pytest.approx(1 / 3)  # chats 10, 13, 14: only 10 goes on
    assert s.next_turn_prob_later == 0.5  # chats 11, 12: only 11 goes on
    assert s.followup_share_by_type == {"search": 0.0, "text": 0.5}
    assert s.single_turn_hit_share == pytest.approx(1 / 6)  # chat 14's 1 of 6 hits
    # Gaps by the earlier access's category: text_1 blocks 1, 2 (t=0->10); text_2 blocks
    # 1, 2, 3 (t=10->20); text_3 block 1 (t=20->30, chat 14). Search's block 9: never.
    cats = s.reuse_time_by_category
    assert {c: q.count for c, q in cats.items()} == {"text_1": 2, "text_2": 3, "text_3": 1}
    assert all(q == Quantiles(q.count, 10.0, 10.0, 10.0, 10.0) for q in cats.values())


def test_later_turns_with_no_parent_links_leave_next_turn_unknown() -> None:
    """A recorded trace keeps turns but not which chat a turn continues: its next-turn
    probabilities are unknown, not 0."""
    t = bailian(
        [[1, 2], [1, 2, 3], [9]],
        [0.0, 10.0, 20.0],
        ["text", "text", "search"],
        [1, 2, 1],
        [0, 1, 2],
        [-1, -1, -1],
    )
    s = trace_stats(t)
    assert s.multi_turn_share == pytest.approx(1 / 3)
    assert s.next_turn_prob_first is None and s.next_turn_prob_later is None
    assert s.followup_share_by_type is None


def test_ideal_hits_match_the_replay_loop_with_an_infinite_cache() -> None:
    trace = synthesize("to-c", duration_s=120, qps=4, seed=11)
    replayed = replay_hits(trace, InfinitePolicy(), 0)
    assert trace.n_requests > 100
    np.testing.assert_array_equal(prefix_hits(trace), replayed)


def test_mooncake_sample_reports_type_and_turn_as_unavailable() -> None:
    trace = load_trace(SAMPLE)
    s = trace_stats(trace)
    assert s.source_format == "mooncake"
    assert s.requests == trace.n_requests > 0
    for unavailable in (
        s.type_mix,
        s.multi_turn_share,
        s.multi_turn_share_by_type,
        s.next_turn_prob_first,
        s.next_turn_prob_later,
        s.followup_share_by_type,
        s.single_turn_hit_share,
    ):
        assert unavailable is None
    assert s.ideal_hits == int(replay_hits(trace, InfinitePolicy(), 0).sum())
    assert set(s.reuse_time_by_category) == {"unknown"}
    json.dumps(s.to_json())  # JSON-ready: unavailable fields are null


def test_empty_trace() -> None:
    s = trace_stats(Trace.from_requests([]))
    assert (s.requests, s.ideal_hits, s.ideal_hit_ratio) == (0, 0, 0.0)
    assert s.reuse_time is None and s.lifespan is None and s.skew_request_share is None
    assert s.qps is None


def test_to_json_round_trips_through_json() -> None:
    doc = json.loads(json.dumps(trace_stats(small()).to_json()))
    assert doc["ideal_hits"] == 5
    assert doc["reuse_time"]["p80"] == 2.0
    assert doc["type_mix"] is None

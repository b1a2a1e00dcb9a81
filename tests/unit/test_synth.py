"""Synthetic traces: calibrated to the paper's findings (docs/traces.md), deterministic per seed,
prefix-consistent, and written/read back unchanged.

Each target below is the paper's number, then the band the synthetic trace must land in
and why the band is that wide (docs/traces.md, "Synthetic traces", has the same table
with the measured values). Synthetic data: these bands check the generator, not the
paper.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from controlplane.traces.model import Trace
from controlplane.traces.reader import load_trace
from controlplane.traces.synth import synthesize
from controlplane.traces.synth_prefix import BLOCK_TOKENS, PromptForest
from controlplane.traces.synth_toc import ToCKnobs
from controlplane.traces.workload_stats import TraceStats, trace_stats
from controlplane.traces.writer import write_bailian
from tests.trace_columns import columns

# to-C (trace A): 30 minutes at 6 QPS (~10,500 requests, ~2.5 M block accesses). The
# window must be long next to a conversation (lifespans reach ten minutes).
TO_C = {"duration_s": 1800.0, "qps": 6.0, "seed": 7}
# to-B (trace B): 10 minutes at 20 QPS (~12,000 requests).
TO_B = {"duration_s": 600.0, "qps": 20.0, "seed": 7}


@pytest.fixture(scope="module")
def toc() -> Trace:
    return synthesize("to-c", **TO_C)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def tob() -> Trace:
    return synthesize("to-b", **TO_B)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def toc_stats(toc: Trace) -> TraceStats:
    return trace_stats(toc)


@pytest.fixture(scope="module")
def tob_stats(tob: Trace) -> TraceStats:
    return trace_stats(tob)


def test_to_c_calibration(toc_stats: TraceStats) -> None:
    s = toc_stats
    assert s.qps is not None and s.qps == pytest.approx(6.0, rel=0.1)
    # Ideal hit ratio: paper 62 % (public trace A: 58 %); band 0.60 +- 0.05.
    assert 0.55 <= s.ideal_hit_ratio <= 0.65
    # Mean input 2,338 tokens, output 430: +-15 % and +-10 % (lognormal sampling noise).
    assert s.mean_input_tokens is not None and 1990 <= s.mean_input_tokens <= 2690
    assert s.mean_output_tokens is not None and 387 <= s.mean_output_tokens <= 473
    # Type mix: text 78 % of requests, +-3 points; all four types present.
    assert s.type_mix is not None and set(s.type_mix) == {"text", "search", "image", "file"}
    assert 0.75 <= s.type_mix["text"] <= 0.81
    # Next-turn probability: 0.5 after turn 1, 0.8 after later turns. Measured inside a
    # window it reads lower: regenerated requests are never continued (3 %) and the
    # window's end cuts conversations. Bands: 0.42-0.55 and 0.70-0.85.
    assert s.next_turn_prob_first is not None and 0.42 <= s.next_turn_prob_first <= 0.55
    assert s.next_turn_prob_later is not None and 0.70 <= s.next_turn_prob_later <= 0.85
    # "Multi-turn share 47-51 % per type": read as the share of each type's
    # conversations that get a next turn (a few hundred per small type: band 0.33-0.6).
    assert s.followup_share_by_type is not None
    assert all(0.33 <= v <= 0.6 for v in s.followup_share_by_type.values())
    # Consequence of 0.5/0.8: 2.5 later turns per 3.5 requests, so 71 % of requests
    # have turn >= 2 (the literal reading of the table cannot also hold; docs/traces.md).
    assert s.multi_turn_share is not None and 0.66 <= s.multi_turn_share <= 0.76
    # Reuse: 80 % within 10 min; human think time keeps the P80 above half a minute.
    assert s.reuse_time is not None and 30 <= s.reuse_time.p80 <= 600
    # Lifespan of reused blocks: 90 % by 612 s; band +-30 %.
    assert s.lifespan is not None and 430 <= s.lifespan.p90 <= 800
    # Skew: paper 19 % of requests give 90 % of hits. Not reached: with 71 % of
    # requests re-sending a previous prompt and answer, hits spread over them; the
    # model gives about 0.4 (docs/traces.md). Band 0.3-0.5 guards that value.
    assert s.skew_request_share is not None and 0.3 <= s.skew_request_share <= 0.5


def test_to_b_calibration(tob_stats: TraceStats) -> None:
    s = tob_stats
    assert s.qps is not None and s.qps == pytest.approx(20.0, rel=0.1)
    # Ideal hit ratio: paper 54 %; band +-0.05.
    assert 0.49 <= s.ideal_hit_ratio <= 0.59
    # Multi-turn requests < 0.1 %; hits from single-turn requests 97 % (>= 0.95 here).
    assert s.multi_turn_share is not None and s.multi_turn_share < 0.001
    assert s.single_turn_hit_share is not None and s.single_turn_hit_share >= 0.95
    # Mostly API calls.
    assert s.type_mix is not None and s.type_mix["api"] >= 0.7
    assert set(s.type_mix) <= {"api", "text"}
    # Reuse: 80 % within 10 s.
    assert s.reuse_time is not None and s.reuse_time.p80 <= 10.0
    # Lifespan of reused blocks: 90 % by 0.3 s; band 0.1-0.6 s. (The paper's P99 of 97 s
    # needs a window of an hour or more: docs/traces.md.)
    assert s.lifespan is not None and 0.1 <= s.lifespan.p90 <= 0.6
    # Skew: 4 % of requests give 90 % of hits; band 2-8 %.
    assert s.skew_request_share is not None and 0.02 <= s.skew_request_share <= 0.08


def test_same_seed_same_trace_other_seed_other_trace(toc: Trace) -> None:
    again = synthesize("to-c", **TO_C)  # type: ignore[arg-type]
    for name in ("blocks", "offsets", "timestamps", "hashes", "turns", "types", "chat_ids"):
        np.testing.assert_array_equal(getattr(toc, name), getattr(again, name))
    other = synthesize("to-c", **{**TO_C, "seed": 8})  # type: ignore[arg-type]
    assert not np.array_equal(other.timestamps, toc.timestamps)
    assert not np.array_equal(other.hashes[other.blocks][:1000], toc.hashes[toc.blocks][:1000])
    b1 = synthesize("to-b", duration_s=60, qps=10, seed=1)
    b2 = synthesize("to-b", duration_s=60, qps=10, seed=1)
    b3 = synthesize("to-b", duration_s=60, qps=10, seed=2)
    np.testing.assert_array_equal(b1.blocks, b2.blocks)
    assert not np.array_equal(b1.timestamps[:50], b3.timestamps[:50])


def test_a_next_turn_shares_every_full_block_of_its_parent(toc: Trace) -> None:
    """The generative rule: a text follow-up is the previous prompt + answer + new input,
    so it starts with every full block of the previous prompt."""
    row = {int(c): r for r, c in enumerate(toc.chat_ids)}
    text = toc.type_names.index("text")
    checked = 0
    for r in np.flatnonzero((toc.turns >= 2) & (toc.types == text))[:500]:
        parent = row.get(int(toc.parent_chat_ids[r]))
        if parent is None:  # the previous turn fell before the window
            continue
        if toc.input_lengths[parent] + toc.output_lengths[parent] > ToCKnobs().history_limit:
            continue  # the app cut the old history: only the system prompt is shared
        full = int(toc.input_lengths[parent]) // BLOCK_TOKENS
        child = toc.request_blocks(int(r))
        np.testing.assert_array_equal(child[:full], toc.request_blocks(parent)[:full])
        assert toc.timestamps[r] >= toc.timestamps[parent]
        assert toc.turns[r] == toc.turns[parent] + 1
        checked += 1
    assert checked > 100


def test_token_lengths_agree_with_blocks(toc: Trace, tob: Trace) -> None:
    for t in (toc, tob):
        blocks = (t.input_lengths + BLOCK_TOKENS - 1) // BLOCK_TOKENS
        np.testing.assert_array_equal(blocks, t.lengths)
        assert np.all(t.output_lengths >= 1)
        assert np.all((t.timestamps >= 0) & (t.timestamps < 1e9))
        assert np.all(np.diff(t.timestamps) >= 0)
        assert len(np.unique(t.chat_ids)) == t.n_requests


@pytest.mark.parametrize("name", ["t.jsonl", "t.jsonl.gz"])
def test_write_then_read_gives_the_same_arrays(tmp_path: Path, name: str) -> None:
    trace = synthesize("to-c", duration_s=120, qps=5, seed=3)
    path = tmp_path / name
    write_bailian(trace, path)
    back = load_trace(path)
    assert back.source_format == "bailian" and back.n_requests == trace.n_requests > 0
    assert columns(back) == columns(trace) | {"source_format": "bailian"}
    assert path.read_bytes()[:2] == (b"\x1f\x8b" if name.endswith(".gz") else b'{"')


def test_writer_refuses_a_trace_without_bailian_metadata(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a Bailian trace"):
        write_bailian(Trace.from_requests([[1, 2]]), tmp_path / "x.jsonl")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"profile": "to-x", "duration_s": 10, "qps": 1}, "known profiles: to-c, to-b"),
        ({"profile": "to-c", "duration_s": 0, "qps": 1}, "duration_s"),
        ({"profile": "to-b", "duration_s": 10, "qps": -1}, "qps"),
    ],
)
def test_bad_arguments_are_refused(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        synthesize(seed=0, **kwargs)  # type: ignore[arg-type]


def test_prompt_forest_ids_by_hand() -> None:
    forest = PromptForest()
    # A: 40 tokens = blocks [full, full, partial] -> fresh ids 0, 1, 2.
    (a,) = forest.add(parent=np.array([-1]), shared=np.array([0]), length=np.array([40]))
    # B: shares A's 40 tokens, 70 in all: inherits A's two full blocks (not the partial
    # one: B's third block holds different tokens) -> [0, 1, 3, 4, 5].
    (b,) = forest.add(parent=np.array([a]), shared=np.array([40]), length=np.array([70]))
    # C re-sends B verbatim (partial block included); D shares 35 of B's tokens (two
    # full blocks), 50 in all -> [0, 1, 6, 7].
    c, d = forest.add(
        parent=np.array([b, b]),
        shared=np.array([70, 35]),
        length=np.array([70, 50]),
        copy=np.array([True, False]),
    )
    offsets, ids = forest.block_ids()
    got = [ids[offsets[i] : offsets[i + 1]].tolist() for i in (a, b, c, d)]
    assert got == [[0, 1, 2], [0, 1, 3, 4, 5], [0, 1, 3, 4, 5], [0, 1, 6, 7]]
    with pytest.raises(ValueError, match="same length"):
        forest.add(
            parent=np.array([b]),
            shared=np.array([0]),
            length=np.array([71]),
            copy=np.array([True]),
        )


@pytest.mark.parametrize(
    ("name", "final_name", "recorded"),
    [
        ("tob.jsonl.gz", None, b"tob.jsonl"),
        ("TOB.JSONL.GZ", None, b"TOB.JSONL"),
        (".claimed-tob.jsonl.gz", "tob.jsonl.gz", b"tob.jsonl"),
        ("twice.jsonl.gz.gz", None, b"twice.jsonl.gz"),  # one .gz off, as gzip(1) does
    ],
)
def test_a_gzip_header_names_the_file_not_its_temporary(
    tmp_path: Path, name: str, final_name: str | None, recorded: bytes
) -> None:
    """The header's FNAME (RFC 1952) once named the hidden partial file the trace was
    written to, so ``gunzip -N`` restored ``.tob.jsonl.gz.<pid>.partial``."""
    path = tmp_path / name
    write_bailian(synthesize("to-b", duration_s=10, qps=2, seed=1), path, final_name=final_name)
    head = path.read_bytes()
    assert head[:2] == b"\x1f\x8b" and head[3] & 0x08, "no FNAME flag"
    assert head[10 : head.index(b"\0", 10)] == recorded
    assert load_trace(path).n_requests > 0

"""Trace readers: formats, auto-detection, gzip, ordering, and every kind of malformed line."""

from __future__ import annotations

import gzip
import json
import os
import pickle
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from typer.testing import CliRunner

from controlplane.cli import app
from controlplane.cli.common import reading_status
from controlplane.traces.chaining import prefix_chained
from controlplane.traces.model import UNKNOWN_CATEGORY, Trace
from controlplane.traces.reader import MAX_SKIP_DETAILS, TraceError, load_trace
from tests.conftest import REPO
from tests.trace_columns import columns

DATA = Path(__file__).resolve().parents[1] / "data"
SAMPLE = DATA / "mooncake_synthetic.jsonl.gz"


def bailian(i: int, ids: list[int] | None = None, **over: Any) -> dict[str, Any]:
    line: dict[str, Any] = {
        "chat_id": i,
        "parent_chat_id": -1 if i % 2 == 0 else i - 1,
        "timestamp": 0.5 * i,
        "input_length": 40 + i,
        "output_length": 7 + i,
        "type": "text" if i % 3 else "file",
        "turn": 1 + i % 2,
        "hash_ids": ids if ids is not None else [100 + i, 200 + i],
    }
    line.update(over)
    return line


def mooncake(i: int, ids: list[int] | None = None, **over: Any) -> dict[str, Any]:
    line: dict[str, Any] = {
        "timestamp": 1000 * i,
        "input_length": 1024 + i,
        "output_length": 3 + i,
        "hash_ids": ids if ids is not None else [i, i + 1, 50 + i],
    }
    line.update(over)
    return line


def write(path: Path, lines: list[Any], *, compress: bool = False) -> Path:
    """Each item is a dict (dumped as JSON) or raw text; one per line."""
    body = b"".join(
        (item.encode() if isinstance(item, str) else orjson.dumps(item)) + b"\n" for item in lines
    )
    path.write_bytes(gzip.compress(body) if compress else body)
    return path


def without(d: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in d.items() if k != key}


# ---- the two formats --------------------------------------------------------------------


def test_bailian_columns_round_trip(tmp_path: Path) -> None:
    lines = [bailian(i) for i in range(5)]
    trace = load_trace(write(tmp_path / "qwen_trace_blksz_16.jsonl", lines))
    assert trace.name == "qwen_trace_blksz_16.jsonl"
    assert trace.source_format == "bailian"
    assert trace.n_requests == 5
    assert [trace.hashes[trace.request_blocks(r)].tolist() for r in range(5)] == [
        ln["hash_ids"] for ln in lines
    ]
    assert trace.timestamps.tolist() == [ln["timestamp"] for ln in lines]
    assert trace.chat_ids.tolist() == [ln["chat_id"] for ln in lines]
    assert trace.parent_chat_ids.tolist() == [ln["parent_chat_id"] for ln in lines]
    assert trace.input_lengths.tolist() == [ln["input_length"] for ln in lines]
    assert trace.output_lengths.tolist() == [ln["output_length"] for ln in lines]
    assert trace.turns.tolist() == [ln["turn"] for ln in lines]
    assert [trace.type_names[t] for t in trace.types] == [ln["type"] for ln in lines]
    cats = [trace.category_names[c] for c in trace.categories]
    assert cats == [f"{ln['type']}_{ln['turn']}" for ln in lines]
    assert trace.skipped_lines == ()


def test_a_bailian_traces_block_size_is_read_when_its_lines_say_it(tmp_path: Path) -> None:
    """A recorded trace's lines carry ``block_tokens``; a public one's do not (None: the
    format's own); lines that disagree are refused, or skipped when asked."""
    assert load_trace(write(tmp_path / "public.jsonl", [bailian(0)])).block_tokens is None
    said = [bailian(i, block_tokens=32) for i in range(3)]
    assert load_trace(write(tmp_path / "mine.jsonl", said)).block_tokens == 32
    mixed = write(tmp_path / "mixed.jsonl", [*said, bailian(3, block_tokens=16), bailian(4)])
    with pytest.raises(TraceError) as err:
        load_trace(mixed)
    assert str(err.value) == (
        f"{mixed}:4: field 'block_tokens': expected the earlier lines' block size (32), got 16 "
        "(a trace gives block_tokens on every line or on none)"
    )
    # A line without it said 'got None'; one that lacks more says that first.
    unsaid = write(tmp_path / "unsaid.jsonl", [*said, bailian(3)])
    with pytest.raises(TraceError, match=r"\(32\), got none \(a trace gives block_tokens"):
        load_trace(unsaid)
    bare = write(tmp_path / "bare.jsonl", [*said, {"chat_id": 3}])
    with pytest.raises(TraceError, match=r":4: field 'parent_chat_id': missing$"):
        load_trace(bare)
    trace = load_trace(mixed, skip_bad_lines=True)
    assert trace.n_requests == 3 and trace.block_tokens == 32
    with pytest.raises(TraceError, match="field 'block_tokens': expected an integer >= 1"):
        load_trace(write(tmp_path / "zero.jsonl", [bailian(0, block_tokens=0)]))


def test_mooncake_timestamps_are_milliseconds(tmp_path: Path) -> None:
    lines = [mooncake(0), mooncake(1, timestamp=1500), mooncake(2, timestamp=2250.5)]
    trace = load_trace(write(tmp_path / "x_trace.jsonl", lines))
    assert trace.source_format == "mooncake"
    assert trace.timestamps.tolist() == [0.0, 1.5, 2.2505]
    assert trace.category_names == (UNKNOWN_CATEGORY,)
    assert trace.chat_ids.tolist() == [-1, -1, -1]
    assert trace.turns.tolist() == [-1, -1, -1]
    assert trace.input_lengths.tolist() == [1024, 1025, 1026]


def test_bundled_mooncake_sample_loads() -> None:
    trace = load_trace(SAMPLE)
    assert trace.name == "mooncake_synthetic.jsonl.gz"
    assert trace.source_format == "mooncake"
    assert (trace.n_requests, trace.n_accesses, trace.n_unique) == (3993, 121_877, 43_924)
    assert trace.timestamps[-1] == pytest.approx(1022.025)  # 1,022,025 ms
    assert np.all(np.diff(trace.timestamps) >= 0)


def test_many_lines_cross_chunk_boundaries_intact(tmp_path: Path) -> None:
    # More lines than one hash chunk holds (16,384), of varied lengths, sharing ids.
    rng = np.random.default_rng(7)
    draws = rng.integers(0, 60_000, size=(20_000, 5)).tolist()
    cuts = rng.integers(1, 6, size=20_000).tolist()
    requests = [list(dict.fromkeys(row[:k])) for row, k in zip(draws, cuts, strict=True)]
    lines = [mooncake(i, ids, timestamp=i) for i, ids in enumerate(requests)]
    trace = load_trace(write(tmp_path / "m.jsonl", lines))
    expected = prefix_chained(Trace.from_requests(requests))  # random ids chain no prefix
    assert trace.blocks.tolist() == expected.blocks.tolist()
    assert trace.hashes.tolist() == expected.hashes.tolist()
    assert trace.offsets.tolist() == expected.offsets.tolist()


# ---- auto-detection ---------------------------------------------------------------------


def test_auto_detects_both_ways(tmp_path: Path) -> None:
    b = write(tmp_path / "b.jsonl", [bailian(i) for i in range(3)])
    m = write(tmp_path / "m.jsonl", [mooncake(i) for i in range(3)])
    assert load_trace(b).source_format == "bailian"
    assert load_trace(m).source_format == "mooncake"
    # Forcing the detected format changes nothing.
    assert columns(load_trace(b, fmt="bailian")) == columns(load_trace(b))
    assert columns(load_trace(m, fmt="mooncake")) == columns(load_trace(m))


def test_forced_bailian_on_a_mooncake_file_names_the_missing_field(tmp_path: Path) -> None:
    path = write(tmp_path / "m.jsonl", [mooncake(0)])
    with pytest.raises(TraceError) as err:
        load_trace(path, fmt="bailian")
    assert (err.value.line, err.value.field) == (1, "chat_id")


def test_unknown_format_fails_clearly(tmp_path: Path) -> None:
    path = write(tmp_path / "odd.jsonl", [{"prompt": "hi", "ts": 3}, mooncake(1)])
    with pytest.raises(TraceError) as err:
        load_trace(path)
    assert (err.value.line, err.value.field) == (1, None)
    assert "cannot tell the trace format" in str(err.value)
    assert "prompt, ts" in str(err.value)


def test_detection_skips_bad_first_lines_when_asked(tmp_path: Path) -> None:
    path = write(tmp_path / "m.jsonl", ["{oops", {"prompt": "hi"}, mooncake(1), mooncake(2)])
    trace = load_trace(path, skip_bad_lines=True)
    assert trace.source_format == "mooncake"
    assert trace.n_requests == 2
    assert [ln for ln, _ in trace.skipped_lines] == [1, 2]


def test_unknown_fmt_argument_is_rejected(tmp_path: Path) -> None:
    path = write(tmp_path / "m.jsonl", [mooncake(0)])
    with pytest.raises(ValueError, match="auto, bailian, mooncake"):
        load_trace(path, fmt="csv")  # type: ignore[arg-type]


# ---- gzip -------------------------------------------------------------------------------


def test_gzip_and_plain_give_identical_arrays(tmp_path: Path) -> None:
    lines = [bailian(i, timestamp=float(9 - i) if i % 2 else 0.25 * i) for i in range(9)]
    plain = load_trace(write(tmp_path / "t.jsonl", lines))
    packed = load_trace(write(tmp_path / "t.jsonl.gz", lines, compress=True))
    assert columns(plain) == columns(packed)
    assert plain.name == "t.jsonl" and packed.name == "t.jsonl.gz"


def test_gzip_is_told_by_magic_bytes_not_suffix(tmp_path: Path) -> None:
    lines = [mooncake(i) for i in range(4)]
    expected = columns(load_trace(write(tmp_path / "a.jsonl", lines)))
    assert columns(load_trace(write(tmp_path / "gz_in_disguise.jsonl", lines, compress=True))) == (
        expected
    )
    assert columns(load_trace(write(tmp_path / "plain_in_disguise.gz", lines))) == expected


def test_truncated_gzip_is_a_trace_error(tmp_path: Path) -> None:
    whole = gzip.compress(b"".join(orjson.dumps(mooncake(i)) + b"\n" for i in range(2000)))
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(TraceError, match="gzip stream truncated or corrupt"):
        load_trace(path, skip_bad_lines=True)


def test_missing_file_is_an_os_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_trace(tmp_path / "nope.jsonl")


# ---- ordering, blank lines, odd bytes ---------------------------------------------------


def test_requests_sorted_by_timestamp_with_stable_ties(tmp_path: Path) -> None:
    stamps = [3.0, 1.0, 2.0, 1.0, 3.0, 0.5, 1.0]
    lines = [bailian(i, [10 * i, 10 * i + 1], timestamp=t) for i, t in enumerate(stamps)]
    trace = load_trace(write(tmp_path / "t.jsonl", lines))
    # Ties keep file order: chat 1, 3, 6 at t=1; chat 0, 4 at t=3.
    assert trace.chat_ids.tolist() == [5, 1, 3, 6, 2, 0, 4]
    assert trace.timestamps.tolist() == sorted(stamps)
    for r, chat in enumerate(trace.chat_ids.tolist()):
        assert trace.hashes[trace.request_blocks(r)].tolist() == [10 * chat, 10 * chat + 1]
        assert trace.input_lengths[r] == 40 + chat


def test_mooncake_ordering_in_milliseconds(tmp_path: Path) -> None:
    lines = [mooncake(0, [1], timestamp=2000), mooncake(1, [2], timestamp=1000)]
    lines.append(mooncake(2, [3], timestamp=2000))
    trace = load_trace(write(tmp_path / "m.jsonl", lines))
    assert trace.timestamps.tolist() == [1.0, 2.0, 2.0]
    assert trace.hashes[trace.blocks].tolist() == [2, 1, 3]


def test_blank_lines_crlf_and_bom_are_ignored(tmp_path: Path) -> None:
    body = b"\xef\xbb\xbf" + orjson.dumps(mooncake(0)) + b"\r\n\r\n   \n\t\n"
    body += orjson.dumps(mooncake(1)) + b"\r\n\n"
    path = tmp_path / "m.jsonl"
    path.write_bytes(body)
    trace = load_trace(path)
    assert trace.n_requests == 2 and trace.skipped_lines == ()


def test_empty_file_gives_an_empty_trace(tmp_path: Path) -> None:
    trace = load_trace(write(tmp_path / "empty.jsonl", ["", "  "]))
    assert (trace.n_requests, trace.n_accesses, trace.n_unique) == (0, 0, 0)


def test_unknown_keys_are_ignored(tmp_path: Path) -> None:
    path = write(tmp_path / "m.jsonl", [mooncake(0, note="x"), mooncake(1, extra=[1, 2])])
    assert load_trace(path).n_requests == 2


# ---- malformed lines --------------------------------------------------------------------

Make = Callable[[int], dict[str, Any]]
HUGE_ID_LINE = (
    f'{{"timestamp": 9, "input_length": 1, "output_length": 1, "hash_ids": [{2**64 + 5}]}}'
)
HUGE = 10**23 - 1
"""Written whole (the standard library's JSON writes integers of any size), orjson reads
it as 1e+23."""
HUGE_GOT = f"expected a non-negative integer (64-bit), got {HUGE}"

# (case id, format's line maker, bad line as dict or raw text, field, words in the message)
MALFORMED: list[tuple[str, Make, Any, str | None, str]] = [
    ("bad-json", mooncake, '{"timestamp": 1, "hash_ids": [1', None, "invalid JSON"),
    ("not-object", mooncake, "[1, 2, 3]", None, "expected a JSON object, got [1,2,3]"),
    ("infinite-ts", mooncake, '{"timestamp": 1e400}', None, "infinity"),
    ("nan-ts", bailian, '{"timestamp": NaN}', None, "invalid JSON"),
    ("ts-negative", mooncake, mooncake(9, timestamp=-1), "timestamp", "got -1"),
    ("ts-string", bailian, bailian(9, timestamp="5.0"), "timestamp", 'got "5.0"'),
    ("ts-bool", mooncake, mooncake(9, timestamp=True), "timestamp", "got true"),
    ("input-negative", mooncake, mooncake(9, input_length=-3), "input_length", "non-negative"),
    ("output-negative", bailian, bailian(9, output_length=-1), "output_length", "got -1"),
    ("input-float", mooncake, mooncake(9, input_length=12.0), "input_length", "got 12.0"),
    ("output-bool", bailian, bailian(9, output_length=False), "output_length", "got false"),
    ("input-string", bailian, bailian(9, input_length="12"), "input_length", 'got "12"'),
    ("input-null", mooncake, mooncake(9, input_length=None), "input_length", "got null"),
    ("chat-float", bailian, bailian(9, chat_id=9.0), "chat_id", "expected an integer"),
    ("chat-negative", bailian, bailian(9, chat_id=-1), "chat_id", "non-negative"),
    ("parent-below", bailian, bailian(9, parent_chat_id=-2), "parent_chat_id", ">= -1"),
    ("parent-bool", bailian, bailian(9, parent_chat_id=True), "parent_chat_id", "got true"),
    ("turn-float", bailian, bailian(9, turn=1.5), "turn", "got 1.5"),
    ("turn-negative", bailian, bailian(9, turn=-1), "turn", "non-negative"),
    ("type-int", bailian, bailian(9, type=3), "type", "expected a non-empty string, got 3"),
    ("type-empty", bailian, bailian(9, type=""), "type", 'got ""'),
    ("ids-empty", mooncake, mooncake(9, []), "hash_ids", "got []"),
    ("ids-not-list", mooncake, mooncake(9, hash_ids="1,2"), "hash_ids", 'got "1,2"'),
    ("ids-null", bailian, bailian(9, hash_ids=None), "hash_ids", "got null"),
    ("ids-bool", bailian, bailian(9, [4, True]), "hash_ids", "got true at index 1"),
    ("ids-float", mooncake, mooncake(9, [4, 5, 6.0]), "hash_ids", "got 6.0 at index 2"),
    ("ids-string", mooncake, mooncake(9, ["4"]), "hash_ids", 'got "4" at index 0'),
    ("ids-nested", mooncake, mooncake(9, [[4]]), "hash_ids", "got [4] at index 0"),
    ("ids-64bit", mooncake, mooncake(9, [1, 2**63]), "hash_ids", "64-bit"),
    # Past 64 bits orjson reads an integer as a float: the message quotes it as written.
    ("ids-huge", mooncake, HUGE_ID_LINE, "hash_ids", f"(64-bit), got {2**64 + 5} at index 0"),
    (
        "ids-huge-2",
        bailian,
        json.dumps(bailian(9, [7, HUGE])),
        "hash_ids",
        f"got {HUGE} at index 1",
    ),
    ("ids-float-1e23", mooncake, mooncake(9, [1, 1e23]), "hash_ids", "got 1e+23 at index 1"),
    ("input-huge", mooncake, json.dumps(mooncake(9, input_length=HUGE)), "input_length", HUGE_GOT),
    ("chat-huge", bailian, json.dumps(bailian(9, chat_id=-HUGE)), "chat_id", f"got {-HUGE}"),
] + [
    # The good lines before it have fixed the format, so every field is checked.
    (f"missing-{key}", maker, without(maker(9), key), key, "missing")
    for maker, keys in (
        (bailian, ["chat_id", "parent_chat_id", "timestamp", "input_length"]),
        (bailian, ["output_length", "type", "turn", "hash_ids"]),
        (mooncake, ["timestamp", "input_length", "output_length", "hash_ids"]),
    )
    for key in keys
]


def _file_with_bad_line(tmp_path: Path, make: Make, bad: Any) -> tuple[Path, list[Any]]:
    """Good lines 1-3, a blank line 4, the bad line 5, good lines 6-7."""
    good = [make(0), make(1), make(2), make(3), make(4)]
    lines: list[Any] = [*good[:3], "", bad, *good[3:]]
    return write(tmp_path / "trace.jsonl", lines), good


each_malformed_line = pytest.mark.parametrize(
    ("make", "bad", "field", "words"),
    [pytest.param(*case[1:], id=case[0]) for case in MALFORMED],
)
"""Runs a test once per ``MALFORMED`` case."""


@each_malformed_line
def test_malformed_line_stops_with_file_line_and_field(
    tmp_path: Path, make: Make, bad: Any, field: str | None, words: str
) -> None:
    path, _ = _file_with_bad_line(tmp_path, make, bad)
    with pytest.raises(TraceError) as err:
        load_trace(path)
    exc = err.value
    assert (exc.path, exc.line, exc.field) == (str(path), 5, field)
    prefix = f"{path}:5: " + (f"field '{field}': " if field else "")
    assert str(exc).startswith(prefix), str(exc)
    assert words in str(exc)
    assert isinstance(exc, ValueError)


@each_malformed_line
def test_skip_bad_lines_keeps_every_good_line(
    tmp_path: Path, make: Make, bad: Any, field: str | None, words: str
) -> None:
    path, good = _file_with_bad_line(tmp_path, make, bad)
    trace = load_trace(path, skip_bad_lines=True)
    expected = load_trace(write(tmp_path / "good.jsonl", good))
    assert columns(trace) == columns(expected)
    assert len(trace.skipped_lines) == 1
    line, reason = trace.skipped_lines[0]
    assert line == 5
    assert words in reason
    if field:
        assert reason.startswith(f"field '{field}': ")


def test_error_message_reads_as_documented(tmp_path: Path) -> None:
    lines: list[Any] = [mooncake(i) for i in range(16)] + [mooncake(16, [])]
    path = write(tmp_path / "trace.jsonl", lines)
    with pytest.raises(TraceError) as err:
        load_trace(path)
    assert str(err.value) == (
        f"{path}:17: field 'hash_ids': expected a non-empty list of integers, got []"
    )


def test_trace_error_survives_pickling() -> None:
    err = TraceError("t.jsonl", 4, "turn", "missing")
    back = pickle.loads(pickle.dumps(err))
    assert (back.path, back.line, back.field, back.problem) == ("t.jsonl", 4, "turn", "missing")
    assert str(back) == str(err) == "t.jsonl:4: field 'turn': missing"


def test_bad_json_names_the_column(tmp_path: Path) -> None:
    path = write(tmp_path / "t.jsonl", [mooncake(0), '{"a": 1,, }'])
    with pytest.raises(TraceError) as err:
        load_trace(path)
    assert str(err.value) == (
        f"{path}:2: invalid JSON (unexpected character, expected a string key, column 9)"
    )


def test_skipped_count_is_exact_past_the_detail_limit(tmp_path: Path) -> None:
    n_bad = MAX_SKIP_DETAILS + 37
    lines: list[Any] = []
    for i in range(n_bad):
        lines.append(mooncake(i))
        lines.append(mooncake(i, [], input_length=-1) if i % 2 else "not json")
    trace = load_trace(write(tmp_path / "m.jsonl", lines), skip_bad_lines=True)
    assert trace.n_requests == n_bad
    assert len(trace.skipped_lines) == n_bad
    assert [ln for ln, _ in trace.skipped_lines] == list(range(2, 2 * n_bad + 1, 2))
    detailed = trace.skipped_lines[MAX_SKIP_DETAILS - 1][1]
    short = trace.skipped_lines[MAX_SKIP_DETAILS][1]
    assert "got -1" in detailed  # line 2000: the offending value is quoted
    assert short == "bad JSON"  # past the limit: the kind of defect only
    assert trace.skipped_lines[-2][1] == "field 'input_length': out of range"


def test_mixed_defects_are_all_counted(tmp_path: Path) -> None:
    lines: list[Any] = [
        bailian(0),
        bailian(1, []),
        "{",
        bailian(2),
        without(bailian(3), "turn"),
        bailian(4, [1, "2"]),
        "",
        bailian(5, timestamp=-2.0),
        bailian(6),
    ]
    trace = load_trace(write(tmp_path / "b.jsonl", lines), skip_bad_lines=True)
    assert trace.chat_ids.tolist() == [0, 2, 6]
    assert [ln for ln, _ in trace.skipped_lines] == [2, 3, 5, 6, 8]
    fields = [r.split("'")[1] if r.startswith("field") else None for _, r in trace.skipped_lines]
    assert fields == ["hash_ids", None, "turn", "hash_ids", "timestamp"]


# ---- the CLI path ------------------------------------------------------------------------


def test_replay_cli_reports_a_bad_line_and_exits_2(tmp_path: Path) -> None:
    path = write(tmp_path / "trace.jsonl", [mooncake(0), mooncake(1, [])])
    res = CliRunner().invoke(app, ["replay", str(path), "-p", "lru", "--capacity", "4"])
    assert res.exit_code == 2
    # The console may wrap a long path anywhere: compare without whitespace.
    assert "".join(f"{path}:2: field 'hash_ids'".split()) in "".join(res.stderr.split())


def test_reading_says_how_far_it_got_on_a_terminal_and_nothing_elsewhere(
    tmp_path: Path,
) -> None:
    path = write(tmp_path / "trace.jsonl", [mooncake(0), mooncake(1)])
    res = CliRunner().invoke(app, ["replay", str(path), "-p", "inf", "--capacity", "4"])
    assert res.exit_code == 0, res.output
    assert "reading" not in res.stderr  # no terminal: no status line, no progress
    assert reading_status(path, 0, None).plain == f"reading {path}"
    shown = reading_status(path, 3 << 20, 12 << 20).plain
    assert shown == f"reading {path}: 3.0 of 12.0 MiB (25%)"
    assert reading_status(path, 3 << 20, None).plain == f"reading {path}: 3.0 MiB"  # a pipe


def test_replay_cli_skips_bad_lines_when_asked(tmp_path: Path) -> None:
    path = write(tmp_path / "trace.jsonl", [mooncake(0), mooncake(1, []), mooncake(2)])
    args = ["replay", str(path), "-p", "inf", "--capacity", "4", "--json", "--skip-bad-lines"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    doc = orjson.loads(res.stdout)
    assert (doc["requests"], doc["skipped_lines"]) == (2, 1)
    assert "skipped 1 bad line (line 2: field 'hash_ids'" in res.stderr


def test_the_skipped_lines_summary_says_how_many_reasons_it_left_out(tmp_path: Path) -> None:
    """It quoted the first three reasons and stopped: "skipped 5 bad lines (line 2: ...,
    line 3: ..., line 4: ...)" read as if those three were all of them."""
    lines = [mooncake(0), *(mooncake(i, []) for i in range(1, 6)), mooncake(6)]
    path = write(tmp_path / "trace.jsonl", lines)
    args = ["replay", str(path), "-p", "inf", "--capacity", "4", "--skip-bad-lines"]
    res = CliRunner().invoke(app, args, env={"COLUMNS": "400"})
    assert res.exit_code == 0, res.output
    summary = next(ln for ln in res.stderr.splitlines() if ln.startswith("skipped "))
    assert summary.startswith("skipped 5 bad lines (line 2: field 'hash_ids'")
    assert "line 4: " in summary and "line 5: " not in summary
    assert summary.endswith(", and 2 more)")


@pytest.mark.parametrize("gzipped", [False, True])
def test_a_trace_reads_from_a_pipe(tmp_path: Path, gzipped: bool) -> None:
    """``kvwise replay <(zcat t.gz)`` or ``... | kvwise replay /dev/stdin``: the file was
    opened twice (once to sniff gzip), and a pipe read as empty: "no requests"."""
    data = SAMPLE.read_bytes()
    if not gzipped:
        data = gzip.decompress(data)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    writer = threading.Thread(target=fifo.write_bytes, args=(data,))
    writer.start()
    try:
        trace = load_trace(fifo)
    finally:
        writer.join(timeout=10)
    assert trace.n_requests == load_trace(SAMPLE).n_requests > 0


def test_a_trace_read_from_a_descriptor_is_not_named_by_its_number(tmp_path: Path) -> None:
    """``kvwise replay <(cat t.jsonl)`` reads ``/dev/fd/63`` and was labelled ``63:``;
    ``/dev/stdin`` was labelled ``stdin:``."""
    data = gzip.decompress(SAMPLE.read_bytes())
    read_end, write_end = os.pipe()

    def feed() -> None:
        with os.fdopen(write_end, "wb") as pipe:
            pipe.write(data)

    writer = threading.Thread(target=feed)
    writer.start()
    try:
        assert load_trace(f"/dev/fd/{read_end}").name == "pipe"
    finally:
        writer.join(timeout=10)
        os.close(read_end)
    plain = tmp_path / "t.jsonl"
    plain.write_bytes(data)
    with plain.open("rb") as opened:
        assert load_trace(f"/proc/self/fd/{opened.fileno()}").name == "t.jsonl"
    code = "from controlplane.traces.reader import load_trace; print(load_trace('/dev/fd/0').name)"
    with plain.open("rb") as stdin:
        res = subprocess.run(
            [sys.executable, "-c", code], cwd=REPO, stdin=stdin, capture_output=True
        )
    assert res.stdout.decode().strip() == "stdin", res.stderr


def test_a_line_longer_than_the_bound_is_refused_without_reading_it_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A line with no newline for megabytes (a binary file, a broken writer) is a bad
    line named by file and line, and the reader never holds more of it than the bound."""
    import tracemalloc

    from controlplane.traces import reader

    monkeypatch.setattr(reader, "MAX_LINE_BYTES", 64 << 10)
    path = tmp_path / "long.jsonl"
    good = orjson.dumps(bailian(0)) + b"\n"
    path.write_bytes(good + b"[" + b"1," * (4 << 20) + b"1]\n" + orjson.dumps(bailian(2)))
    tracemalloc.start()
    try:
        with pytest.raises(TraceError) as err:
            load_trace(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert err.value.line == 2 and err.value.field is None
    assert str(err.value).startswith(f"{path}:2: line longer than 65,536 bytes")
    assert peak < 4 << 20, f"peak {peak:,} bytes: the 8 MiB line was read whole"
    trace = load_trace(path, skip_bad_lines=True)
    assert trace.n_requests == 2 and trace.skipped_lines[0][0] == 2

"""``kvwise trace synth`` and ``kvwise trace stats`` through the real Typer app."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from controlplane.cli import app
from controlplane.traces.reader import load_trace
from controlplane.traces.synth import synthesize
from controlplane.traces.workload_stats import trace_stats
from controlplane.traces.writer import write_bailian
from tests.terminal_text import assert_reads_at

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "mooncake_synthetic.jsonl.gz"


@pytest.mark.parametrize("profile", ["to-c", "to-b"])
def test_synth_writes_the_same_trace_as_the_library(tmp_path: Path, profile: str) -> None:
    out = tmp_path / "t.jsonl.gz"
    args = ["trace", "synth", "--profile", profile, "--duration", "60", "--qps", "5"]
    res = CliRunner().invoke(app, [*args, "--seed", "4", "-o", str(out)])
    assert res.exit_code == 0, res.output
    want = synthesize(profile, duration_s=60, qps=5, seed=4)  # type: ignore[arg-type]
    got = load_trace(out)
    assert got.n_requests == want.n_requests > 0
    assert (got.hashes[got.blocks] == want.hashes[want.blocks]).all()
    head, tail = res.stdout.strip().splitlines()  # two lines: each fits 80 columns
    assert res.stderr.splitlines() == [  # seconds to minutes of work: its steps, said
        f"trace synth: drawing {profile} requests (60 s at 5 QPS, "
        f"{1800 if profile == 'to-c' else 120:,} s warm-up, seed 4)",
        f"trace synth: writing {out}",
        "trace synth: counting its statistics",
    ]
    assert head.startswith(f"wrote {out}") and f"{want.n_requests:,} requests" in head
    assert tail.endswith(f"ideal hit ratio {trace_stats(want).ideal_hit_ratio:.3f}")
    assert len(tail) <= 80


def test_synth_to_standard_output_keeps_its_summary_out_of_the_trace(tmp_path: Path) -> None:
    """``-o -`` made a file named ``-``, and ``-o /dev/stdout`` put the summary after the
    trace's last line, so ``| kvwise replay /dev/stdin`` failed on it."""
    args = ["trace", "synth", "--duration", "10", "--seed", "3"]
    for output in ("-", "/dev/stdout"):
        command = [sys.executable, "-m", "controlplane", *args, "-o", output]
        run = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        piped = tmp_path / "piped.jsonl"
        piped.write_text(run.stdout)
        want = synthesize("to-c", duration_s=10, qps=6, seed=3)
        assert load_trace(piped).n_requests == want.n_requests > 0
        assert f"wrote /dev/stdout: {want.n_requests:,} requests" in run.stderr
        assert not (tmp_path / "-").exists()


@pytest.mark.parametrize("output", ["-", "/dev/stdout"])
def test_synth_to_standard_output_redirected_to_a_file_writes_that_file(
    tmp_path: Path, output: str
) -> None:
    """``-o - > t.jsonl`` (stdout a regular file behind ``/dev/stdout``) wrote the trace
    beside ``/dev/stdout`` and renamed it over the link, replacing ``/dev/stdout`` itself
    (as root; else it failed), and ``t.jsonl`` held only the summary."""
    redirected = tmp_path / "t.jsonl"
    command = [sys.executable, "-m", "controlplane", "trace", "synth", "--duration", "10"]
    with redirected.open("wb") as stdout:
        run = subprocess.run(
            [*command, "--seed", "3", "-o", output],
            cwd=tmp_path,
            stdout=stdout,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    assert run.returncode == 0, run.stderr
    assert Path("/dev/stdout").is_symlink() or not Path("/dev/stdout").is_file()
    want = synthesize("to-c", duration_s=10, qps=6, seed=3)
    assert load_trace(redirected).n_requests == want.n_requests > 0
    assert f"wrote /dev/stdout: {want.n_requests:,} requests" in run.stderr


def test_stats_json_is_trace_stats(tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl"
    CliRunner().invoke(app, ["trace", "synth", "--duration", "90", "--seed", "2", "-o", str(out)])
    res = CliRunner().invoke(app, ["trace", "stats", str(out), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    want = json.loads(json.dumps(trace_stats(load_trace(out)).to_json()))
    assert doc.pop("skipped_lines") == 0 and doc.pop("rechained") is None
    # Said once, as the trace summary of replay's and simulate's JSON says them: the JSON
    # repeated them as "name" (the file's name) and "block_accesses".
    assert (doc.pop("trace"), want.pop("name")) == (str(out), out.name)
    assert doc.pop("accesses") == want.pop("block_accesses") > 0
    assert doc == want


def test_stats_json_carries_no_float_noise(tmp_path: Path) -> None:
    """Reuse times are differences of timestamps: without rounding, 0.036 s reads
    0.036000000000001364."""
    out = tmp_path / "t.jsonl"
    CliRunner().invoke(app, ["trace", "synth", "--duration", "90", "--seed", "2", "-o", str(out)])
    numbers = list(_floats(trace_stats(load_trace(out)).to_json()))
    assert len(numbers) > 50
    assert all(float(f"{x:.12g}") == x for x in numbers)


def _floats(value: object) -> Iterator[float]:
    if isinstance(value, float):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _floats(item)
    elif isinstance(value, list):
        for item in value:
            yield from _floats(item)


def test_stats_table_on_a_mooncake_trace_says_n_a() -> None:
    res = CliRunner().invoke(app, ["trace", "stats", str(SAMPLE)])
    assert res.exit_code == 0, res.output
    s = trace_stats(load_trace(SAMPLE))
    assert f"{s.requests:,}" in res.stdout
    assert f"{s.ideal_hit_ratio:.4f}" in res.stdout
    assert "n/a" in res.stdout  # type mix, turns: Mooncake has none
    assert "reuse time, unknown" in res.stdout


def test_stats_table_reads_at_80_columns(tmp_path: Path) -> None:
    """Its labels wrapped ("next-turn probability after later" over "turns") beside a
    half-empty value column, shares broke between a type and its share ("search" over
    "61.9%"), and the titles were padded with spaces to the tables' width."""
    trace = tmp_path / "toc.jsonl"
    write_bailian(synthesize("to-c", duration_s=120, qps=4, seed=1), trace)
    res = CliRunner().invoke(app, ["trace", "stats", str(trace)], env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    assert_reads_at(80, res.stdout)
    summary = res.stdout.split("Times (s)")[0].splitlines()
    rows = [line.split("│")[1:-1] for line in summary if line.startswith("│")]
    labels = [row[0].strip() for row in rows]
    assert "next-turn probability after later turns" in labels
    assert "type mix" in labels
    for _, value in rows:  # shares ("text 70.9%, ...") break between one and the next
        if "%" in value:
            assert all(s.endswith("%") for s in value.strip().rstrip(",").split(", ")), value


def test_stats_on_a_terminal_says_each_step_after_reading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the trace was read, a terminal showed nothing while the statistics were
    counted and the figures drawn (seconds each on a large trace), and the figures'
    ``wrote`` lines were printed through the status line."""
    from io import StringIO

    from rich.console import Console

    from controlplane.cli import progress
    from controlplane.traces import workload_stats

    shown = StringIO()
    terminal = Console(file=shown, force_terminal=True, width=200, color_system=None)
    monkeypatch.setattr(progress, "Console", lambda stderr: terminal)
    counted_at_once = workload_stats.trace_stats

    def counted_slowly(*args: Any) -> Any:  # seconds on a large trace: a few refreshes here
        time.sleep(0.3)
        return counted_at_once(*args)

    monkeypatch.setattr(workload_stats, "trace_stats", counted_slowly)
    trace = tmp_path / "toc.jsonl"
    write_bailian(synthesize("to-c", duration_s=60, qps=2, seed=1), trace)
    figures = tmp_path / "figures"
    res = CliRunner().invoke(app, ["trace", "stats", str(trace), "--plot", str(figures)])
    assert res.exit_code == 0, res.output
    assert "trace stats: counting its statistics" in shown.getvalue()
    assert f"trace stats: drawing figures into {figures}" in shown.getvalue()
    assert f"wrote {figures / 'skew.png'}" not in shown.getvalue()
    assert f"wrote {figures / 'skew.png'}\n" in res.stderr


def test_user_errors_exit_2(tmp_path: Path) -> None:
    res = CliRunner().invoke(
        app, ["trace", "synth", "--profile", "to-x", "-o", str(tmp_path / "x.jsonl")]
    )
    assert (
        res.exit_code == 2 and "--profile: unknown profile 'to-x'; known: to-c, to-b" in res.stderr
    )
    res = CliRunner().invoke(
        app, ["trace", "synth", "--duration", "0", "-o", str(tmp_path / "x.jsonl")]
    )
    assert res.exit_code == 2 and "error: --duration: " in res.stderr
    assert "duration_s" not in res.stderr
    res = CliRunner().invoke(app, ["trace", "stats", str(tmp_path / "missing.jsonl")])
    assert res.exit_code == 2 and "missing.jsonl" in res.stderr
    bad = tmp_path / "bad.jsonl"
    good = '{"timestamp": 0, "input_length": 9, "output_length": 1, "hash_ids": [1]}'
    bad.write_text(good + "\n" + good.replace("[1]", "[]") + "\n")
    res = CliRunner().invoke(app, ["trace", "stats", str(bad)])
    assert res.exit_code == 2 and "hash_ids" in res.stderr
    res = CliRunner().invoke(app, ["trace", "stats", str(bad), "--skip-bad-lines", "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["requests"] == 1


@pytest.mark.parametrize(
    ("duration", "qps", "says"),
    [
        ("5", "1e9", "--duration x --qps asks for about 1,805,000,000,000 requests (1,800 s"),
        ("1e12", "6", "--duration x --qps asks for about"),
        ("0.01", "0.01", "--duration 0.01 at --qps 0.01 gave no request"),
    ],
)
def test_synth_refuses_a_trace_too_large_or_empty(
    tmp_path: Path, duration: str, qps: str, says: str
) -> None:
    out = tmp_path / "x.jsonl"
    args = ["trace", "synth", "--duration", duration, "--qps", qps, "-o", str(out)]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2 and says in res.stderr, res.output
    assert not out.exists()


def test_stats_on_an_empty_trace_errors_as_replay_does(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    for args in (["trace", "stats", str(empty)], ["replay", str(empty), "-p", "lru"]):
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 2, args
        assert res.stderr.strip() == f"error: {empty}: no requests"


def test_synth_cap_counts_the_warm_up_and_refuses_before_generating(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model generates the warm-up before the window too (to-B: 120 s, to-C: 1,800 s):
    a short window at a high rate asked for millions of requests the cap never saw (to-B
    at 1e5 QPS for 20 s: 14 million, tens of gigabytes). The cap counts them, and refuses
    before a single request is drawn."""
    import tracemalloc

    from controlplane.cli import trace_cmd

    monkeypatch.setattr(trace_cmd, "MAX_SYNTH_REQUESTS", 5_000)
    out = tmp_path / "x.jsonl"
    args = ["trace", "synth", "--profile", "to-b", "--duration", "1", "--qps", "100"]
    tracemalloc.start()
    try:
        res = CliRunner().invoke(app, [*args, "-o", str(out)])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    says = "--duration x --qps asks for about 12,100 requests (120 s of warm-up before"
    assert res.exit_code == 2 and says in res.stderr, res.output
    assert "at most 5,000 in one trace" in res.stderr and not out.exists()
    assert peak < 4 << 20, f"peak {peak:,} bytes: requests were generated before the refusal"


def test_synth_cap_keeps_the_largest_trace_under_two_gigabytes() -> None:
    """The cap was 2,000,000 requests at "about 3 KB each"; a kept to-C request takes
    about 13 KB while the trace is built, so the cap allowed some 26 GB. Measured on a
    window that keeps most of what it draws, the cap's worth of requests fits 2 GB."""
    import tracemalloc

    from controlplane.cli import trace_cmd

    tracemalloc.start()
    try:
        trace = synthesize("to-c", duration_s=3000, qps=6, seed=0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    per_request = peak / trace.n_requests
    assert per_request * trace_cmd.MAX_SYNTH_REQUESTS < 2e9, f"{per_request:,.0f} B a request"


def test_synth_refuses_just_over_the_cap_before_generating(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from controlplane.traces import synth

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("the trace was generated past the cap")

    monkeypatch.setattr(synth, "synthesize", never)
    out = tmp_path / "x.jsonl"
    args = ["trace", "synth", "--profile", "to-c", "--duration", "18300", "--qps", "6"]
    res = CliRunner().invoke(app, [*args, "-o", str(out)])
    assert res.exit_code == 2, res.output
    assert "asks for about 120,600 requests" in res.stderr
    assert "at most 120,000 in one trace" in res.stderr and not out.exists()


def test_synth_refuses_an_output_it_could_not_write_before_generating(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``-o nodir/x.jsonl`` was tried only once the trace was built: at the cap, minutes of
    work and gigabytes lost to a typo."""
    from controlplane.traces import synth

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("the trace was generated before its output was checked")

    monkeypatch.setattr(synth, "synthesize", never)
    out = tmp_path / "nodir" / "x.jsonl"
    res = CliRunner().invoke(app, ["trace", "synth", "--duration", "10", "-o", str(out)])
    assert res.exit_code == 2, res.output
    assert res.stderr == f"error: --output {out}: folder {out.parent} does not exist\n"
    res = CliRunner().invoke(app, ["trace", "synth", "--duration", "10", "-o", str(tmp_path)])
    assert res.exit_code == 2 and res.stderr == f"error: --output {tmp_path}: is a folder\n"

"""``kvwise simulate`` through the real Typer app: tables at 80 columns, JSON, the plot,
and one-line errors with exit code 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from controlplane.cli import app
from controlplane.replay.options import ReplayOptions
from controlplane.simulate.engine import SimOptions
from controlplane.simulate.profiles import BUILTIN
from controlplane.simulate.runner import SimJob, run_one
from controlplane.traces.reader import load_trace
from tests.terminal_text import assert_reads_at

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "mooncake_synthetic.jsonl.gz"
BASE = ["simulate", str(SAMPLE), "-p", "lru,wa", "--instances", "4", "-j", "1"]


def test_json_is_the_library_result() -> None:
    res = CliRunner().invoke(app, [*BASE, "--capacity", "800,1600", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["requests"] == 3993 and doc["block_tokens"] == 512
    assert doc["profile"]["name"] == "llama3-8b-h200"
    assert doc["profile_kv_pool_blocks"] == BUILTIN["llama3-8b-h200"].kv_pool_blocks(512)
    assert [(r["policy"], r["capacity"]) for r in doc["results"]] == [
        ("lru", 800),
        ("lru", 1600),
        ("wa", 800),
        ("wa", 1600),
    ]
    want = run_one(load_trace(SAMPLE), SimJob("lru", 1600), SimOptions(instances=4))
    got = doc["results"][1]
    assert got["hits"] == want.hits and got["qttft_s"] == want.qttft.to_json()
    assert len(got["qttft_quantiles_s"]) == 101
    assert got["qttft_s"]["mean"] > got["ttft_s"]["mean"] > 0  # queues present


def test_docs_name_every_key_of_the_json() -> None:
    """docs/simulate.md's ``--json`` paragraph names every top-level key and every key
    of a run (it once left ``rechained`` out)."""
    res = CliRunner().invoke(app, [*BASE, "-p", "lru", "--capacity", "800", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    text = (Path(__file__).resolve().parents[2] / "docs" / "simulate.md").read_text()
    paragraph = text.split("`--json` prints one object:")[1].split("\n\n")[0]
    keys = [*doc, *doc["options"], *doc["results"][0]]
    assert [k for k in keys if f"`{k}`" not in paragraph] == []


@pytest.mark.parametrize(
    "sizes", [["--capacity-gib", "10,10.001"], ["--capacity-frac", "0.1,0.100001"]]
)
def test_sizes_that_come_to_one_block_count_run_once(sizes: list[str]) -> None:
    res = CliRunner().invoke(app, ["simulate", str(SAMPLE), "-p", "lru", *sizes, "--json"])
    assert res.exit_code == 0, res.output
    assert len(json.loads(res.stdout)["results"]) == 1


def test_reuse_classes_reach_the_fitted_policies() -> None:
    """``--reuse-class hit`` is the replay option: ``wa`` files returns under ``w/re``, as
    ``SimOptions`` with it does, and differs from ``wa`` without it."""
    args = ["simulate", str(SAMPLE), "-p", "wa", "--capacity", "400", "-j", "1", "--json"]
    res = CliRunner().invoke(app, [*args, "--reuse-class", "hit"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["options"]["reuse_class"] == "hit"
    classed = SimOptions(replay=ReplayOptions(reuse_class="hit"))
    want = run_one(load_trace(SAMPLE), SimJob("wa", 400), classed)
    plain = run_one(load_trace(SAMPLE), SimJob("wa", 400), SimOptions())
    assert doc["results"][0]["hits"] == want.hits != plain.hits


def test_tables_fit_80_columns_and_default_to_the_gpus_pool() -> None:
    res = CliRunner().invoke(app, BASE, env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    pool = BUILTIN["llama3-8b-h200"].kv_pool_blocks(512)
    assert f"{pool:,}" in res.stdout
    for title in ("QTTFT = queue + time to first token", "TTFT and queue", "Prefill saved"):
        assert title in res.stdout
    assert max(len(line) for line in res.stdout.splitlines()) <= 80
    assert "vs lru" in res.stdout and "+0.0%" in res.stdout
    # stderr is no terminal here: a line per finished run says how far it is
    runs = [line for line in res.stderr.splitlines() if line.startswith("simulate: ")]
    assert len(runs) == 2 and runs[-1].startswith("simulate: ")
    assert "(2/2 runs done, " in runs[-1] and "blocks done" in runs[0]


VS_LRU = "vs lru: change of mean QTTFT from lru's at this size; - is faster"


@pytest.mark.parametrize("policies", ["lru,wa", "wa"])
def test_the_vs_lru_column_says_what_it_compares(policies: str) -> None:
    """Beside the hit ratio, "vs lru +0.9%" read as 0.9 % better: it is mean QTTFT, and
    + is slower. The table says so under it, only when the column is there."""
    args = ["simulate", str(SAMPLE), "-p", policies, "--capacity", "800", "-j", "1"]
    res = CliRunner().invoke(app, args, env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    flat = " ".join(res.stdout.split())
    assert (VS_LRU in flat) == ("lru" in policies.split(","))
    assert max(len(line) for line in res.stdout.splitlines()) <= 80


def test_the_output_reads_at_80_columns_where_its_tables_are_narrow() -> None:
    """QTTFT of 1,000 s and more takes four characters a column: the table grew narrower
    than its caption, which wrapped at the table's width and left "faster" on a line of
    its own; the fleet line left "instance" alone; the titles were padded with spaces to
    the tables' width."""
    args = [*BASE, "--instances", "1", "--capacity", "800", "--speed", "2"]
    res = CliRunner().invoke(app, args, env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    table = next(line for line in res.stdout.splitlines() if line.startswith("┏"))
    assert len(table) < len(VS_LRU)  # the case: the caption is wider than its table
    assert VS_LRU in res.stdout.splitlines()
    assert_reads_at(80, res.stdout)


def test_plot_writes_a_png(tmp_path: Path) -> None:
    out = tmp_path / "sim.png"
    args = [*BASE, "--capacity-gib", "10,20", "--plot", str(out), "--json"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"wrote {out}" in res.stderr  # as replay and trace stats say it


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["-p", "lru,nope"], "unknown policy 'nope'"),
        # the choice checks every command makes, in the same words (--policy, replay's)
        (["--router", "random"], "--router: unknown router 'random'; known: round-robin"),
        (["--router", "prefx"], "--router: unknown router 'prefx' (did you mean 'prefix'?)"),
        # names the options given (it read as if none was)
        (
            ["--capacity", "10", "--capacity-gib", "2"],
            "give only one of --capacity, --capacity-frac, --capacity-gib "
            "(got --capacity and --capacity-gib)",
        ),
        (
            ["--capacity", "10", "--capacity-frac", "0.1", "--capacity-gib", "2"],
            "(got --capacity, --capacity-frac and --capacity-gib)",
        ),
        (["--profile", "gpt-9"], "--profile: unknown profile 'gpt-9'"),
        # worded as every command's --speed (the parser in controlplane.cli.common)
        (["--speed", "0"], "--speed: must be a finite number > 0, got 0"),
        (["--speed", "abc"], "--speed: 'abc' is not a number"),
        (["--instances", "0"], "--instances: must be from 1 to 1,024, got 0"),
        # past a 64-bit int: a traceback
        (["--output-tokens", str(10**20)], "--output-tokens: must be from 1 to 16,777,216, got"),
        # the trace's span / speed overflows: arrivals at inf, NaN TTFTs (NaN in --json)
        (["--speed", "1e-310"], "--speed: 1e-310 puts arrivals past a float's range"),
        (["--capacity-gib", "x"], "--capacity-gib: 'x' is not a number"),
        (["--capacity-gib", "0.0001"], "--capacity-gib: 0.0001 is under one block"),
        # once said "inf is not in (0, inf]"
        (["--capacity-gib", "inf"], "--capacity-gib: inf is not a finite number > 0"),
        # beyond float range in bytes (a traceback: int(nan)), beyond int64 in blocks
        (["--capacity-gib", "1e300"], "--capacity-gib: 1e+300 is too large (at most 5.76e+17"),
        (["--capacity-gib", "1e20"], "--capacity-gib: 1e+20 is too large (at most 5.76e+17"),
        # named as the field of the library's options, not as the option
        (["--refit-every", "nan"], "--refit-every: must be a finite number > 0, got nan"),
        (["--refit-every", "inf"], "--refit-every: must be a finite number > 0, got inf"),
        (["--categories", "magic"], "--categories: 'magic' is not one of 'labels', 'auto'"),
        (["--reuse-class", "some"], "--reuse-class: 'some' is not one of 'off', 'hit', 'trace'"),
        (["--plot", "out.svg"], "plots are written as .png"),
        # a fitted policy's option with none to apply it to changed nothing, silently
        (["-p", "lru", "--reuse-class", "hit"], "--reuse-class applies only to the fitted"),
    ],
)
def test_user_errors_exit_2(extra: list[str], message: str, tmp_path: Path) -> None:
    res = CliRunner().invoke(app, [*BASE, *extra], env={"COLUMNS": "200"})
    assert res.exit_code == 2, res.output
    assert message in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_a_profile_file_whose_steps_overflow_is_named_with_its_fields(tmp_path: Path) -> None:
    fields = BUILTIN["llama3-8b-h100"].model_dump() | {"peak_tflops": 1e-300}
    path = tmp_path / "slow.json"
    path.write_text(json.dumps(fields))
    res = CliRunner().invoke(app, [*BASE, "--profile", str(path)], env={"COLUMNS": "200"})
    assert res.exit_code == 2, res.output
    assert f"--profile: {path}: profile 'llama3-8b-h100' makes step times overflow" in res.stderr
    assert "peak_tflops" in res.stderr and "Infinity" not in res.stdout
    assert len(res.stderr.strip().splitlines()) == 1


def test_missing_trace_exits_2(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["simulate", str(tmp_path / "none.jsonl")])
    assert res.exit_code == 2 and "none.jsonl" in res.stderr


def test_an_unlabelled_trace_and_a_fleet_that_falls_behind_are_said() -> None:
    """One engine for the Mooncake sample at its own speed: the queue only grows, and the
    fitted policies see one category; both made the table read as a verdict on wa."""
    res = CliRunner().invoke(app, ["simulate", str(SAMPLE), "-p", "lru,wa", "-j", "1"])
    assert res.exit_code == 0, res.output
    assert "note: the trace labels every request 'unknown'" in res.stderr
    assert "note: the fleet falls behind: the last request started" in res.stderr
    kept_up = [*BASE, "--speed", "0.15"]
    res = CliRunner().invoke(app, kept_up)
    assert res.exit_code == 0, res.output
    assert "falls behind" not in res.stderr
    res = CliRunner().invoke(app, [*kept_up, "--categories", "auto"])
    assert "labels every request" not in res.stderr


def test_a_zero_block_cache_is_said_to_hit_nothing_not_the_fleet_to_fall_behind() -> None:
    """``--capacity 0`` (a fleet with no prefix cache) is accepted, but its queue was put
    down to the fleet falling behind, with more --instances or a lower --speed for a cure:
    a cache of none hits nothing, and holding no running request's KV either, runs one
    request at a time. Other sizes of the same run are still judged."""
    args = ["simulate", str(SAMPLE), "-p", "lru", "-j", "1", "--capacity"]
    res = CliRunner().invoke(app, [*args, "0"])
    assert res.exit_code == 0, res.output
    said = " ".join(res.stderr.split())
    assert "note: a cache of 0 blocks can hit nothing" in said
    assert "falls behind" not in said
    res = CliRunner().invoke(app, [*args, "0,800"])
    said = " ".join(res.stderr.split())
    assert "note: a cache of 0 blocks can hit nothing" in said
    assert "note: the fleet falls behind" in said and "(lru at 800 blocks)" in said


def test_a_short_trace_whose_queue_stays_short_is_not_said_to_fall_behind(
    tmp_path: Path,
) -> None:
    """20 s of arrivals take 42 s to serve only for the last requests' decode: the queue
    is a quarter of QTTFT and never grows, so no note (it once said "mostly queueing")."""
    trace = tmp_path / "t20.jsonl"
    synth = ["trace", "synth", "--duration", "20", "--seed", "2", "-o", str(trace)]
    assert CliRunner().invoke(app, synth).exit_code == 0
    res = CliRunner().invoke(app, ["simulate", str(trace), "-p", "lru", "-j", "1"])
    assert res.exit_code == 0, res.output
    assert "falls behind" not in res.stderr
    res = CliRunner().invoke(app, ["simulate", str(trace), "-p", "lru", "--speed", "1e9"])
    assert "note: the fleet falls behind: the last request started" in res.stderr
    assert "for under 1 ms of arrivals" in res.stderr and "of QTTFT), so" in res.stderr


def test_inf_runs_once_and_each_column_has_one_precision(tmp_path: Path) -> None:
    """``inf`` has no size: it ran once per size and printed identical rows; and a column
    mixed "10.4" with "9.818". The JSON still gives ``inf`` at every size."""
    trace = tmp_path / "t20.jsonl"
    synth = ["trace", "synth", "--duration", "20", "--seed", "2", "-o", str(trace)]
    assert CliRunner().invoke(app, synth).exit_code == 0
    args = ["simulate", str(trace), "-p", "lru,inf", "--capacity-gib", "0.2,10", "-j", "1"]
    res = CliRunner().invoke(app, args, env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    assert "(3/3 runs done" in res.stderr and "4 runs" not in res.stderr
    # it said "inf at 102 blocks done" beside a table that gives inf at "any" size
    assert "simulate: inf at any size done (3/3 runs done, " in res.stderr
    assert "inf at 102 blocks" not in res.stderr
    first = res.stdout.split("TTFT and queue")[0]
    rows = [line.split("│")[1:-1] for line in first.splitlines() if line.startswith("│")]
    assert [(r[0].strip(), r[1].strip()) for r in rows] == [
        ("lru", "102"),
        ("lru", "5,120"),
        ("inf", "any"),
    ]
    for column in range(3, 7):  # mean, p50, p90, p99
        assert len({len(r[column].strip().partition(".")[2]) for r in rows}) == 1
    doc = json.loads(CliRunner().invoke(app, [*args, "--json"]).stdout)
    inf = [r for r in doc["results"] if r["policy"] == "inf"]
    assert [r["capacity"] for r in inf] == [102, 5120]
    assert inf[0]["qttft_s"] == inf[1]["qttft_s"]


def test_a_cache_no_instance_evicted_from_is_said_to_tie() -> None:
    """The profile's default pool (tens of thousands of blocks) holds a short trace whole:
    every policy ties there, said; a size under the trace's unique blocks is not."""
    res = CliRunner().invoke(app, [*BASE, "--capacity", "100,10000000"])
    assert res.exit_code == 0, res.output
    assert "note: no instance evicted a block from a cache of 10,000,000 blocks" in res.stderr
    doc = json.loads(
        CliRunner().invoke(app, [*BASE, "--capacity", "100,10000000", "--json"]).stdout
    )
    evicted = {(r["policy"], r["capacity"]): r["evicted_blocks"] for r in doc["results"]}
    assert all(evicted[policy, 10_000_000] == 0 for policy, _ in evicted)
    assert all(evicted[policy, 100] > 0 for policy, _ in evicted)
    res = CliRunner().invoke(app, [*BASE, "--capacity", "100"])
    assert res.exit_code == 0 and "no instance evicted" not in res.stderr


def test_instances_that_each_hold_what_they_were_sent_are_said_to_tie() -> None:
    """Spread over 8 instances, each cache held all it saw though it held less than the
    whole trace: every policy tied, with no word of why (the note compared one cache with
    the trace's unique blocks)."""
    trace = load_trace(SAMPLE)
    per_instance = trace.n_unique // 2  # under the trace's blocks, over any one's share
    args = ["simulate", str(SAMPLE), "-p", "lru,wa", "--instances", "8", "--capacity"]
    res = CliRunner().invoke(app, [*args, str(per_instance)])
    assert res.exit_code == 0, res.output
    assert f"no instance evicted a block from a cache of {per_instance:,} blocks" in res.stderr


def recorded_trace(path: Path, block_tokens: int) -> None:
    """A trace as ``kvwise trace record --block-tokens`` writes it: 24 blocks a request."""
    from controlplane.traces.recorded import RecordedRequests
    from controlplane.traces.writer import write_bailian

    gathered = RecordedRequests()
    for i in range(40):
        gathered.add(0.5 * i, "text_1", [*range(20), *range(100 + 4 * i, 104 + 4 * i)])
    write_bailian(gathered.trace(path.name, block_tokens), path)


def test_a_recorded_traces_block_size_is_the_one_simulate_counts_in(tmp_path: Path) -> None:
    """A trace recorded with --block-tokens 32 was simulated with 16-token blocks, and
    --block-tokens 32 was refused as not the trace's."""
    path = tmp_path / "mine.jsonl.gz"
    recorded_trace(path, 32)
    trace = load_trace(path)
    assert trace.block_tokens == 32 and set(trace.input_lengths.tolist()) == {24 * 32}
    run = ["simulate", str(path), "-p", "lru", "-j", "1", "--capacity", "50", "--json"]
    res = CliRunner().invoke(app, run)
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["block_tokens"] == 32
    res = CliRunner().invoke(app, [*run, "--block-tokens", "32"])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(app, [*run, "--block-tokens", "16"], env={"COLUMNS": "200"})
    assert res.exit_code == 2
    assert "this bailian trace's blocks hold 32 tokens each" in res.stderr


def test_a_prompt_no_engine_takes_is_refused_naming_its_request(tmp_path: Path) -> None:
    """An ``input_length`` of 10^12 tokens (the reader takes any 64-bit count) was
    prefilled one step budget at a time: 10^8 steps, a run that never ended."""
    from controlplane.simulate.requests import workload

    path = tmp_path / "huge.jsonl"
    lines = [(0, 32), (1000, 10**12)]
    path.write_text(
        "".join(
            json.dumps({"timestamp": t, "hash_ids": [1, 2], "input_length": n, "output_length": 1})
            + "\n"
            for t, n in lines
        )
    )
    trace = load_trace(path)
    with pytest.raises(ValueError, match="request 1 asks for 1,000,000,000,000 prompt tokens"):
        workload(trace)
    res = CliRunner().invoke(app, ["simulate", str(path), "-p", "lru", "--capacity", "4"])
    assert res.exit_code == 2, res.output
    assert res.stderr.startswith(f"error: {path}: request 1 asks for 1,000,000,000,000")
    assert len(res.stderr.strip().splitlines()) == 1


def test_a_fleet_past_its_bound_is_refused_before_any_instance_is_built() -> None:
    """``--instances`` had no upper bound: each instance holds arrays over the trace's
    unique blocks and a policy of its own, so 10^20 of them filled memory for ever."""
    args = ["simulate", str(SAMPLE), "-p", "lru", "--capacity", "10", "--instances", "1025"]
    res = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert res.exit_code == 2, res.output
    assert res.stderr.strip() == "error: --instances: must be from 1 to 1,024, got 1025"

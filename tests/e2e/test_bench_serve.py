"""``kvwise bench serve`` over real HTTP against a small OpenAI-compatible server with a real
prefix cache (``toy_openai_server``): the prompts carry the trace's sharing, the hit ratio
equals the server's counters, TTFT comes before the end, categories travel in
``vllm_xargs``, the concurrency cap holds, bad requests are counted without stopping the
run, and the command's outputs, comparison and errors. Against real vLLM:
tests/e2e/test_vllm.py."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from controlplane.cli import app
from tests.conftest import REPO
from tests.e2e.toy_openai_server import ToyServer, running_toy_server
from tests.waiting import wait_until

pytestmark = pytest.mark.e2e
BLOCK = 4


@pytest.fixture
def toy() -> Iterator[ToyServer]:
    with running_toy_server(ToyServer(block_size=BLOCK, max_len=6 * BLOCK + 1)) as server:
        yield server


def _trace_file(
    tmp_path: Path, requests: list[list[int]], types: list[str] | None = None, turns: Any = None
) -> Path:
    """Requests 0.05 s apart: a Bailian file when labelled, else a Mooncake one."""
    lines = []
    for i, blocks in enumerate(requests):
        line: dict[str, Any] = {"input_length": len(blocks) * BLOCK, "output_length": 0}
        if types is None:
            line.update(timestamp=50 * i, hash_ids=blocks)  # Mooncake: milliseconds
        else:
            line.update(timestamp=0.05 * i, type=types[i], turn=turns[i], hash_ids=blocks)
            line.update(chat_id=i, parent_chat_id=-1)
        lines.append(json.dumps(line))
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def bench(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["bench", "serve", *args])
    return result.exit_code, result.output


def test_prefix_sharing_hit_ratio_and_server_counters_agree(toy: ToyServer, tmp_path: Path) -> None:
    shared = [[1, 2, 3], [1, 2, 4], [1, 2, 3], [7, 8], [1, 2, 3, 5]]
    path = _trace_file(tmp_path, shared, types=["text"] * 5, turns=[1, 1, 2, 1, 3])
    summary_file, lines_file = tmp_path / "a.json", tmp_path / "a.jsonl"
    code, out = bench(
        str(path), "--url", toy.url, "--block-tokens", str(BLOCK), "--speed", "1",
        "--max-tokens", "3", "-o", str(summary_file), "--requests", str(lines_file), "--json",
    )  # fmt: skip
    assert code == 0, out
    summary = json.loads(out)
    lines = [json.loads(line) for line in lines_file.read_text().splitlines()]
    by_index = {line["index"]: line for line in lines}
    # The trace's prefix sharing, in tokens: request 2 repeats request 0 (3 blocks), 1 and 4
    # share its first 2 or 3 blocks; every prompt ends with one token that is never cached.
    assert [by_index[i]["cached_tokens"] for i in range(5)] == [
        0,
        2 * BLOCK,
        3 * BLOCK,
        0,
        3 * BLOCK,
    ]
    assert [by_index[i]["prompt_tokens"] for i in range(5)] == [len(r) * BLOCK + 1 for r in shared]
    assert all(0 < line["ttft_s"] <= line["latency_s"] for line in lines)
    assert all(line["completion_tokens"] == 3 and line["ok"] for line in lines)
    # Hit ratio from cached tokens == the server's own counters over the run.
    expected = (8 * BLOCK) / sum(len(r) * BLOCK + 1 for r in shared)
    assert summary["hit_ratio"] == pytest.approx(expected)
    assert summary["server"]["hit_ratio"] == pytest.approx(expected)
    assert summary["server"]["prefix_cache_hits"] == summary["cached_tokens"]
    assert summary["ttft_s"]["count"] == 5 and summary["errors"] == 0
    assert json.loads(summary_file.read_text()) == summary
    # What went on the wire: token ids, streaming with usage, the categories, no eos stop.
    body = toy.bodies[0]
    assert body["model"] == "toy-model" and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True} and body["ignore_eos"] is True
    assert sorted(b["vllm_xargs"]["kv_category"] for b in toy.bodies) == sorted(
        ["text_1", "text_1", "text_2", "text_1", "text_3"]
    )
    # Requests left at trace times: 0.05 s apart at speed 1, never early.
    assert all(line["sent_s"] >= line["scheduled_s"] - 1e-3 for line in lines)
    assert by_index[4]["scheduled_s"] == pytest.approx(0.2)


def test_the_concurrency_cap_holds_and_bad_requests_do_not_stop_the_run(
    toy: ToyServer, tmp_path: Path
) -> None:
    toy.token_delay_s = 0.02
    requests = [[100 + i, 200 + i] for i in range(12)] + [list(range(300, 310))]  # too long
    path = _trace_file(tmp_path, requests)
    code, out = bench(
        str(path), "--url", toy.url + "/v1/", "--block-tokens", str(BLOCK), "--speed", "0",
        "--concurrency", "3", "--max-tokens", "4", "--json",
    )  # fmt: skip
    assert code == 1, out  # a failed request: exit code 1, summary still printed
    summary = json.loads(out)
    assert toy.max_in_flight == 3
    assert (summary["requests"], summary["ok"], summary["errors"]) == (13, 12, 1)
    assert "HTTP 400: prompt of 41 tokens is longer than 25" in summary["top_errors"][0]["error"]
    assert summary["queue_wait_s"]["max"] > 0  # later requests waited for a slot
    assert all("vllm_xargs" not in b for b in toy.bodies)  # unlabelled trace


def test_compare_two_runs_and_a_server_without_counters(toy: ToyServer, tmp_path: Path) -> None:
    path = _trace_file(tmp_path, [[1, 2], [1, 2], [1, 3]])
    common = ["--url", toy.url, "--block-tokens", str(BLOCK), "--speed", "0"]
    assert bench(str(path), *common, "-o", str(tmp_path / "a.json"))[0] == 0
    toy.export_metrics = False
    code, out = bench(str(path), *common, "--salt", "1", "-o", str(tmp_path / "b.json"))
    assert code == 0, out
    assert "hit ratio n/a from the server's counters" in out
    b = json.loads((tmp_path / "b.json").read_text())
    assert b["server"] is None and b["hit_ratio"] == pytest.approx(
        3 * BLOCK / (3 * (2 * BLOCK + 1))
    )
    code, out = bench("--compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--json")
    assert code == 0, out
    rows = {r["key"]: r for r in json.loads(out)["rows"]}
    assert rows["hit_ratio"]["a"] == pytest.approx(rows["hit_ratio"]["b"])  # same sharing
    assert rows["server.hit_ratio"]["b"] is None
    code, out = bench("--compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"))
    assert code == 0 and "hit ratio (cached)" in out and "TTFT p99" in out


def test_an_oversized_stream_is_an_error_not_a_memory_leak(
    toy: ToyServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from controlplane.loadgen import client

    monkeypatch.setattr(client, "MAX_RESPONSE_BYTES", 64 << 10)
    toy.endless_line_bytes = 1 << 20  # one line of 1 MiB with no end
    path = _trace_file(tmp_path, [[1, 2], [3, 4]])
    code, out = bench(str(path), "--url", toy.url, "--block-tokens", str(BLOCK), "--json")
    assert code == 1, out
    summary = json.loads(out)
    assert summary["errors"] == 2
    assert summary["top_errors"][0]["error"] == "response over 65536 bytes"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "missing TRACE"),
        (["nope.jsonl"], "nope.jsonl"),
        (["TRACE", "--url", "http://127.0.0.1:1"], "cannot reach http://127.0.0.1:1/v1/models"),
        (["TRACE", "--url", "localhost:8000"], "--url 'localhost:8000'"),
        (["TRACE", "--speed", "-1"], "--speed"),
        (["TRACE", "--compare", "a.json", "b.json"], "no TRACE"),
        (["--compare", "TRACE", "TRACE"], "trace.jsonl is not a bench summary"),
        (["--compare", "nope.json", "TRACE"], "--compare nope.json"),
        (["TRACE", "--unpaired"], "--unpaired goes with --compare"),
    ],
)
def test_bad_usage_is_one_line_and_exit_code_2(
    tmp_path: Path, args: list[str], message: str
) -> None:
    path = _trace_file(tmp_path, [[1, 2]])
    code, out = bench(*(str(path) if a == "TRACE" else a for a in args))
    assert code == 2, out
    assert message in " ".join(out.split())  # the error line may wrap at the terminal
    assert "Traceback" not in out


def test_a_controller_that_does_not_answer_is_said_once_and_the_run_goes_on(
    toy: ToyServer, tmp_path: Path
) -> None:
    """``--controller`` at a port where nothing listens aborted the run before any load."""
    from controlplane.dev.embedded_redis import free_port

    path = _trace_file(tmp_path, [[1, 2], [1, 2], [1, 3]])
    down = f"http://127.0.0.1:{free_port()}"
    common = ["bench", "serve", str(path), "--url", toy.url, "--block-tokens", str(BLOCK)]
    run = [*common, "--speed", "0", "--controller", down]
    res = CliRunner().invoke(app, [*run, "--json"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    assert summary["requests"] == summary["ok"] == 3
    assert summary["kvwise"]["before"] is None and summary["kvwise"]["after"] is None
    assert summary["kvwise"]["error"].startswith(f"cannot reach {down}/v1/policy")
    assert res.stderr.count("the kvwise version report is unavailable") == 1
    assert res.stderr.startswith(f"warning: --controller: cannot reach {down}/v1/policy")
    res = CliRunner().invoke(app, run, env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert f"kvwise version report unavailable: cannot reach {down}" in res.stdout


def test_compare_pairs_only_runs_that_sent_the_same_requests(
    toy: ToyServer, tmp_path: Path
) -> None:
    """Runs over two traces and block sizes were paired by trace index, with an interval."""
    import gzip

    from controlplane.loadgen.report import PAIRED_CONFIG, UNPAIRED_CONFIG

    requests = [[1 + i % 3, 20 + i] for i in range(40)]
    path = _trace_file(tmp_path, requests)
    copy = tmp_path / "copy.jsonl.gz"  # the same requests under another name and format
    copy.write_bytes(gzip.compress(path.read_bytes()))
    (tmp_path / "other").mkdir()
    other = _trace_file(tmp_path / "other", [[5 + i % 2, 70 + i] for i in range(40)])
    common = ["--url", toy.url, "--speed", "0", "--block-tokens", str(BLOCK)]
    runs = {
        "a": [str(path), *common],
        "copy": [str(copy), *common, "--salt", "3", "--timeout", "60"],
        "other": [str(other), *common, "--concurrency", "8"],
    }
    for name, args in runs.items():
        assert bench(*args, "-o", str(tmp_path / f"{name}.json"))[0] == 0
    a = json.loads((tmp_path / "a.json").read_text())
    assert set(a["config"]) == {"trace", *PAIRED_CONFIG, *UNPAIRED_CONFIG}  # each classified

    def compare(b: str, *extra: str) -> tuple[int, str]:
        return bench("--compare", str(tmp_path / "a.json"), str(tmp_path / f"{b}.json"), *extra)

    code, out = compare("copy", "--json")
    assert code == 0, out
    shown = json.loads(out)
    assert shown["paired"] and shown["differences"] == {}
    assert any(r["interval"] for r in shown["rows"])
    code, out = compare("other")
    assert code == 2, out
    said = " ".join(out.split())
    assert "did not send the same requests" in said and "concurrency 64 vs 8" in said
    assert "trace_digest" in said and "--unpaired" in said and "TTFT" not in said
    code, out = compare("other", "--unpaired", "--json")
    assert code == 0, out
    shown = json.loads(out)
    assert not shown["paired"] and set(shown["differences"]) == {"trace_digest", "concurrency"}
    assert not any(r["interval"] for r in shown["rows"])
    code, out = compare("other", "--unpaired")
    assert code == 0 and "TTFT mean" in out and "concurrency 64 vs 8" in " ".join(out.split())


def test_errors_past_the_kinds_listed_are_counted_under_them(
    toy: ToyServer, tmp_path: Path
) -> None:
    """Seven prompts too long, each by another length: "7 errors", then five lines of one
    error each, the other two in no line."""
    requests = [list(range(100 * i, 100 * i + 7 + i)) for i in range(7)]  # 8 to 14 blocks
    path = _trace_file(tmp_path, requests)
    args = ("--url", toy.url, "--block-tokens", str(BLOCK), "--speed", "0", "--max-tokens", "1")
    code, out = bench(str(path), *args)
    assert code == 1
    listed = [line for line in out.splitlines() if " x HTTP 400: " in line]
    assert len(listed) == 5
    assert "2 x other errors (--requests FILE keeps each request's)" in out


def test_an_interrupted_run_says_what_it_did_and_writes_no_summary(
    toy: ToyServer, tmp_path: Path
) -> None:
    """Ctrl-C mid-run ended the command silently (exit code 130, nothing on stderr)."""
    path = _trace_file(tmp_path, [[i, i + 1000] for i in range(200)])  # 0.05 s apart: 10 s
    lines, summary = tmp_path / "a.jsonl", tmp_path / "a.json"
    args = ["--url", toy.url, "--block-tokens", str(BLOCK), "--max-tokens", "1"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "controlplane", "bench", "serve", str(path), *args,
         "-o", str(summary), "--requests", str(lines)],
        cwd=REPO, stderr=subprocess.PIPE, start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as at a terminal
    )  # fmt: skip
    wait_until(lambda: lines.exists() and lines.read_text().count("\n") >= 3, what="3 done")
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=10)
    assert proc.returncode == 130
    said = " ".join(err.decode().split())
    assert re.search(r"bench: interrupted after \d+/200 requests done; \S+ holds them", said)
    assert "no summary" in said and not summary.exists()

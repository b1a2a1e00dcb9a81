"""Review findings on ``kvwise replay --policy auto`` and ``kvwise trace synth``, as strict
xfails until fixed: option values and trace times that give a traceback or never end, and
an interrupted write that leaves a half-written file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from controlplane.cli.trace_cmd import synth
from controlplane.traces.synth import synthesize
from controlplane.traces.writer import write_bailian
from tests.conftest import REPO


def _kvwise(*args: str, timeout: float) -> subprocess.CompletedProcess[str] | None:
    """``kvwise ARGS`` in a session of its own; None (the session killed) past ``timeout``."""
    cmd = [sys.executable, "-m", "controlplane", *args]
    env = {**os.environ, "COLUMNS": "200"}
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


@pytest.fixture(scope="module")
def short_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("review") / "short.jsonl"
    write_bailian(synthesize("to-c", duration_s=30, qps=2, seed=1), path)
    return path


@pytest.mark.parametrize("option", [["--auto-margin", "5"], ["--auto-windows", "5000"]])
def test_auto_selection_options_out_of_range_are_usage_errors(
    short_trace: Path, option: list[str]
) -> None:
    res = _kvwise("replay", str(short_trace), "-p", "auto", "--capacity", "100", "-j", "1",
                  *option, "--json", timeout=60)  # fmt: skip
    assert res is not None
    assert "Traceback" not in res.stderr, res.stderr[-400:]
    assert res.returncode == 2 and option[0] in res.stderr


@pytest.mark.parametrize(
    ("second_ts", "window"), [(1.7e9, "300"), (10.0, "1e-300")], ids=["time-jump", "tiny-window"]
)
def test_auto_ends_promptly_whatever_the_times(
    tmp_path: Path, second_ts: float, window: str
) -> None:
    path = tmp_path / "jump.jsonl"
    lines = [
        {"chat_id": i, "parent_chat_id": -1, "timestamp": ts, "input_length": 32,
         "output_length": 1, "type": "text", "turn": 1, "hash_ids": [1, i + 2]}
        for i, ts in enumerate([0.0, second_ts])
    ]  # fmt: skip
    path.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))
    res = _kvwise("replay", str(path), "-p", "auto", "--capacity", "2", "-j", "1",
                  "--auto-window", window, "--json", timeout=10)  # fmt: skip
    assert res is not None, "two requests, still running after 10 s"
    assert "Traceback" not in res.stderr
    if res.returncode == 0:
        orjson.loads(res.stdout)
    else:
        assert res.returncode == 2 and "--auto-window" in res.stderr


class _InterruptedAt:
    """``orjson`` as the writer uses it, with a Ctrl-C on the ``at``-th line."""

    OPT_APPEND_NEWLINE = orjson.OPT_APPEND_NEWLINE
    OPT_SERIALIZE_NUMPY = orjson.OPT_SERIALIZE_NUMPY

    def __init__(self, at: int) -> None:
        self.left = at

    def dumps(self, value: object, option: int = 0) -> bytes:
        self.left -= 1
        if self.left == 0:
            raise KeyboardInterrupt
        return orjson.dumps(value, option=option)


def test_an_interrupted_synth_leaves_the_output_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    output = tmp_path / "toc.jsonl"
    output.write_text("the trace written yesterday\n")
    monkeypatch.setattr("controlplane.traces.writer.orjson", _InterruptedAt(5000))
    with pytest.raises(KeyboardInterrupt):
        synth(output=output, profile="to-c", duration=1200.0, qps=6.0, seed=1)
    assert output.read_text() == "the trace written yesterday\n", (
        f"{output.stat().st_size:,} bytes of a cut trace in its place"
    )

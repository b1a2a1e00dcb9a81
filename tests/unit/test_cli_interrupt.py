"""Ctrl-C during a replay or simulation that runs in several processes: the command ends
at once, says so, and leaves no worker behind. It went on for seconds to minutes (every
running job finished first) and then printed nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from controlplane.traces.synth import synthesize
from controlplane.traces.writer import write_bailian
from tests.conftest import REPO
from tests.waiting import wait_until


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("interrupt") / "toc.jsonl"
    write_bailian(synthesize("to-c", duration_s=1200, qps=6, seed=3), path)
    return path


def _busy_run(trace_file: Path, *command: str) -> subprocess.Popen[bytes]:
    """``kvwise COMMAND TRACE -j 2`` in a session of its own, once a run is done (its
    workers busy with the next ones)."""
    args = [sys.executable, "-m", "controlplane", *command, str(trace_file), "-j", "2"]
    proc = subprocess.Popen(
        args,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=_interrupts_as_at_a_terminal,
    )
    assert proc.stderr is not None
    first = proc.stderr.readline().decode()
    assert "runs done" in first, first
    return proc


def _interrupts_as_at_a_terminal() -> None:
    """A job started in the background (CI's) inherits SIGINT ignored, and Python then
    never raises KeyboardInterrupt: the command gets SIGINT as a shell at a terminal
    gives it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("command", [["replay"], ["simulate", "-p", "all"]])
def test_an_interrupt_ends_a_parallel_run_at_once(command: list[str], trace_file: Path) -> None:
    proc = _busy_run(trace_file, *command)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C sends: the whole group
    _, err = proc.communicate(timeout=10)
    assert proc.returncode == 130
    assert f"{command[0]}: interrupted after" in err.decode()
    wait_until(lambda: not _group_alive(proc.pid), timeout=5, what="no worker left")


def test_sigterm_ends_a_parallel_run_and_its_workers(trace_file: Path) -> None:
    """`timeout` or a job scheduler: the parent died and its workers ran on as orphans."""
    proc = _busy_run(trace_file, "replay")
    proc.terminate()  # the parent only, as `timeout` sends it
    _, err = proc.communicate(timeout=10)
    assert proc.returncode == 128 + signal.SIGTERM
    assert "replay: stopped after" in err.decode()
    wait_until(lambda: not _group_alive(proc.pid), timeout=5, what="no worker left")


def test_a_worker_killed_mid_run_fails_the_run_in_plain_words(trace_file: Path) -> None:
    """The OOM killer's SIGKILL of a worker: a traceback of BrokenProcessPool before."""
    proc = _busy_run(trace_file, "replay")
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    assert children
    for child in children:
        os.kill(int(child), signal.SIGKILL)
    _, err = proc.communicate(timeout=10)
    assert proc.returncode == 1
    assert err.decode().strip().splitlines()[-1] == (
        "error: a worker process died while it ran a job (killed: out of memory?); "
        "fewer --jobs need less memory"
    )


INTERRUPT_WHILE_LOADING = """
import os, signal, sys

class SigintOnLoad:
    def find_spec(self, name, path=None, target=None):
        if name == "controlplane.cli.replay_cmd":
            os.kill(os.getpid(), signal.SIGINT)
        return None

sys.meta_path.insert(0, SigintOnLoad())
from controlplane.cli import main
sys.argv = ["kvwise", "--version"]
main()
"""


def test_an_interrupt_while_the_commands_load_ends_in_one_line() -> None:
    """Ctrl-C in the seconds the command modules take to load printed a traceback of
    the imports: now one line and exit code 130 (the signal comes as a module loads)."""
    res = subprocess.run(
        [sys.executable, "-c", INTERRUPT_WHILE_LOADING],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=_interrupts_as_at_a_terminal,
    )
    assert res.returncode == 130, res.stderr
    assert res.stderr == "kvwise: interrupted\n"
    assert res.stdout == ""

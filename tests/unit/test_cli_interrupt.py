"""Ctrl-C during a replay or simulation that runs in several processes: the command ends
at once, says so, and leaves no worker behind. It went on for seconds to minutes (every
running job finished first) and then printed nothing. A replay prints the results of the
runs that had finished and names those that had not; ``trace synth`` and ``trace stats``
name the step they were at."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from controlplane.replay.pool import JobProgress, JobsInterrupted, run_jobs
from controlplane.traces.synth import synthesize
from controlplane.traces.writer import write_bailian
from tests.conftest import REPO
from tests.waiting import wait_until


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("interrupt") / "toc.jsonl"
    write_bailian(synthesize("to-c", duration_s=1200, qps=6, seed=3), path)
    return path


def _busy_run(
    trace_file: Path, *command: str, jobs: int = 2
) -> tuple[subprocess.Popen[bytes], str]:
    """``kvwise COMMAND TRACE -j JOBS`` in a session of its own, once a run is done (the
    next ones running), and the line that said so."""
    args = [sys.executable, "-m", "controlplane", *command, str(trace_file), "-j", str(jobs)]
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
    return proc, first


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
    proc, _ = _busy_run(trace_file, *command)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C sends: the whole group
    _, err = proc.communicate(timeout=10)
    assert proc.returncode == 130
    assert f"{command[0]}: interrupted after" in err.decode()
    wait_until(lambda: not _group_alive(proc.pid), timeout=5, what="no worker left")


def test_an_interrupted_replay_prints_the_runs_that_finished(trace_file: Path) -> None:
    """The runs done before the Ctrl-C were lost with the others: the user had waited for
    them. Their hit ratios are printed, the runs cut are named, and the exit code is 130."""
    proc, first = _busy_run(trace_file, "replay")
    said = re.match(r"replay: (\S+) at ([\d,]+) blocks? done ", first)
    assert said is not None, first
    policy, capacity = said[1], said[2]
    os.killpg(proc.pid, signal.SIGINT)
    out, err = (text.decode() for text in proc.communicate(timeout=30))
    assert proc.returncode == 130, err
    assert "Block hit ratio" in out
    row = [line for line in out.splitlines() if re.search(rf"[│|] {re.escape(policy)} +[│|]", line)]
    assert row and re.search(r"\d\.\d{4}", row[0]), out  # its hit ratio, not "-"
    cut = re.search(r"replay: interrupted after (\d+)/(\d+) runs done; not finished: (.+)", err)
    assert cut is not None, err
    assert 1 <= int(cut[1]) < int(cut[2])
    not_finished = {
        part.split(" at ")[0]: part.split(" at ")[1].removesuffix(" blocks").split(", ")
        for part in cut[3].split("; ")
    }  # "lru at 20,082, 40,165 blocks; wa at ..."
    assert capacity not in not_finished.get(policy, [])
    assert sum(len(sizes) for sizes in not_finished.values()) == int(cut[2]) - int(cut[1])
    wait_until(lambda: not _group_alive(proc.pid), timeout=5, what="no worker left")


@pytest.fixture
def interrupts() -> Iterator[None]:
    """Ctrl-C raises ``KeyboardInterrupt`` here, as at a terminal (CI's background job
    inherits SIGINT ignored)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def _quick_or_stuck(job: str, report: JobProgress | None) -> str:
    if job == "stuck":
        threading.Event().wait()  # until the pool ends its worker
    return job.upper()


@pytest.mark.usefixtures("interrupts")
def test_an_interrupt_carries_the_results_of_the_jobs_done() -> None:
    """In the pool itself: the Ctrl-C comes once "quick" is said finished, while "stuck"
    runs; the interrupt carries the result of the one and ends the other's worker."""

    def interrupt(job: str) -> None:
        os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(JobsInterrupted) as caught:
        run_jobs(["stuck", "quick"], _quick_or_stuck, workers=2, finished=interrupt)
    assert caught.value.finished == {"quick": "QUICK"}


def test_sigterm_ends_a_parallel_run_and_its_workers(trace_file: Path) -> None:
    """`timeout` or a job scheduler: the parent died and its workers ran on as orphans."""
    proc, _ = _busy_run(trace_file, "replay")
    proc.terminate()  # the parent only, as `timeout` sends it
    _, err = proc.communicate(timeout=10)
    assert proc.returncode == 128 + signal.SIGTERM
    assert "replay: stopped after" in err.decode()
    wait_until(lambda: not _group_alive(proc.pid), timeout=5, what="no worker left")


@pytest.mark.parametrize("command", [["replay"], ["simulate", "-p", "lru,wa"]])
def test_sigterm_ends_runs_in_one_process_saying_so(command: list[str], trace_file: Path) -> None:
    """With ``-j 1`` (a container of one core) SIGTERM killed the process silently: the
    progress lines, then nothing, where the same run in a pool says it stopped."""
    proc, _ = _busy_run(trace_file, *command, jobs=1)
    proc.terminate()
    _, err = proc.communicate(timeout=10)
    assert proc.returncode == 128 + signal.SIGTERM
    assert f"{command[0]}: stopped after " in err.decode()


def test_a_worker_killed_mid_run_fails_the_run_in_plain_words(trace_file: Path) -> None:
    """The OOM killer's SIGKILL of a worker: a traceback of BrokenProcessPool before."""
    proc, _ = _busy_run(trace_file, "replay")
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


def _run_script(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -c SCRIPT ARGS`` from the repository, Ctrl-C raising as at a terminal."""
    return subprocess.run(
        [sys.executable, "-c", script, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=_interrupts_as_at_a_terminal,
    )


def test_an_interrupt_while_the_commands_load_ends_in_one_line() -> None:
    """Ctrl-C in the seconds the command modules take to load printed a traceback of
    the imports: now one line and exit code 130 (the signal comes as a module loads)."""
    res = _run_script(INTERRUPT_WHILE_LOADING)
    assert res.returncode == 130, res.stderr
    assert res.stderr == "kvwise: interrupted\n"
    assert res.stdout == ""


@pytest.mark.usefixtures("interrupts")
def test_an_interrupt_leaves_no_pool_thread_running() -> None:
    """The pool's thread, left running after a Ctrl-C, closed its wake-up pipe while the
    exit hook wrote into it: "OSError: [Errno 9] Bad file descriptor" after the command's
    last line, at times (seen on replay and simulate)."""

    def interrupt(job: str) -> None:
        os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(JobsInterrupted):
        run_jobs(["stuck", "quick"], _quick_or_stuck, workers=2, finished=interrupt)
    pool_threads = [t for t in threading.enumerate() if type(t).__name__.endswith("ManagerThread")]
    assert pool_threads == []


INTERRUPT_IN_A_STEP = """
import os, signal, sys, time
import {module} as where

def interrupted(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGINT)  # as a Ctrl-C comes: between two bytecodes
    time.sleep(30)

where.{function} = interrupted
from controlplane.cli import main
sys.argv = ["kvwise", *sys.argv[1:]]
main()
"""


@pytest.mark.parametrize(
    ("command", "module", "function", "said"),
    [
        (
            ["trace", "synth", "--duration", "60", "-o", "{out}"],
            "controlplane.traces.writer",
            "write_bailian",
            "trace synth: interrupted while writing {out} after {s} s; {out} left as it was",
        ),
        (
            ["trace", "stats", "{trace}"],
            "controlplane.traces.workload_stats",
            "workload_samples",
            "trace stats: interrupted while counting its statistics after {s} s",
        ),
    ],
)
def test_an_interrupted_trace_command_names_the_step_it_cut(
    tmp_path: Path, trace_file: Path, command: list[str], module: str, function: str, said: str
) -> None:
    """``trace synth`` and ``trace stats`` ended a Ctrl-C with exit code 130 and nothing
    said: now one line names the step cut (and, for synth, what it left of the output)."""
    out = tmp_path / "t.jsonl"
    args = [a.format(out=out, trace=trace_file) for a in command]
    script = INTERRUPT_IN_A_STEP.format(module=module, function=function)
    res = _run_script(script, *args)
    assert res.returncode == 130, res.stderr
    last = res.stderr.strip().splitlines()[-1]
    pattern = re.escape(said.format(out=out, s="@")).replace("@", r"\d+\.\d")
    assert re.fullmatch(pattern, last), res.stderr
    assert "Traceback" not in res.stderr and not out.exists()

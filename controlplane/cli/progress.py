"""Progress of a replay or simulation matrix, or of a command's few steps, on stderr: a
live bar or status line on a terminal, plain lines elsewhere.

Owns ``requests_bar`` (the bar of requests done that replay and simulate draw) and
``MatrixProgress``, the sink the replay's and the simulator's ``run_matrix`` report to
(requests done per job, then each job once its result is in: a job said done has a result
an interrupt keeps). On a terminal a transient bar counts requests over every job and
names the jobs finished; when stderr is a file or a pipe, one line per finished job
(none with ``quiet``), a policy run once for every size (``sizeless``) said to be at any
size, as the results say. ``Steps`` says the step a command of a few long steps is at
(``trace synth``, ``trace stats``) and, after a Ctrl-C, which one it cut. It must never
write to stdout, which carries the results.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from types import TracebackType
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.status import Status
from rich.text import Text

from controlplane.cli.common import counted

if TYPE_CHECKING:
    from controlplane.replay.runner import ReplayJob


def requests_bar(heading: str, console: Console) -> Progress:
    """A transient bar of requests done out of the total on ``console`` (stderr's),
    headed ``heading`` (a rich format string that may name ``task.description``)."""
    return Progress(
        TextColumn(heading),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("requests"),
        TimeElapsedColumn(),
        transient=True,
        console=console,
    )


class MatrixProgress:
    """Counts requests replayed by each job of a matrix of ``jobs`` jobs."""

    def __init__(
        self,
        requests_per_job: int,
        jobs: int,
        *,
        quiet: bool = False,
        command: str = "replay",
        sizeless: Collection[str] = (),
    ) -> None:
        self.command = command
        """What runs the jobs (``replay`` or ``simulate``), as the lines and the bar say."""
        self.sizeless = frozenset(sizeless)
        """Policies run at one size that stands for every size (simulate's ``inf``)."""
        self.requests_per_job = requests_per_job
        self.jobs = jobs
        self.quiet = quiet
        self.console = Console(stderr=True)
        self.done: dict[ReplayJob, int] = {}
        self.finished = 0
        self._t0 = time.monotonic()
        self._bar: Progress | None = None
        self._task: TaskID | None = None

    def __enter__(self) -> MatrixProgress:
        self._t0 = time.monotonic()
        if self.console.is_terminal:
            heading = f"[bold]{self.command}[/] {{task.description}}"
            self._bar = requests_bar(heading, self.console)
            self._bar.start()
            total = self.requests_per_job * self.jobs
            self._task = self._bar.add_task(self._jobs_text(), total=total)
        return self

    def __exit__(
        self, t: type[BaseException] | None, v: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._bar is not None:
            self._bar.stop()
        if t is not None and issubclass(t, KeyboardInterrupt | SystemExit):
            how = "interrupted" if issubclass(t, KeyboardInterrupt) else "stopped"
            self.console.print(
                f"{self.command}: {how} after {self._jobs_text()}; no results",
                highlight=False,
            )

    def _jobs_text(self) -> str:
        return f"{self.finished}/{self.jobs} runs done"

    def update(self, job: ReplayJob, requests_done: int) -> None:
        """Record that ``job`` has replayed ``requests_done`` requests."""
        self.done[job] = requests_done
        self._show_bar()

    def finish(self, job: ReplayJob) -> None:
        """Record that ``job``'s result is in."""
        self.done[job] = self.requests_per_job
        self.finished += 1
        self._show_bar()
        if self._bar is None and not self.quiet:
            elapsed = time.monotonic() - self._t0
            size = "any size" if job.policy in self.sizeless else counted(job.capacity, "block")
            self.console.print(
                f"{self.command}: {job.policy} at {size} done "
                f"({self._jobs_text()}, {elapsed:.1f} s)",
                highlight=False,
                soft_wrap=True,
            )

    def _show_bar(self) -> None:
        if self._bar is not None and self._task is not None:
            self._bar.update(
                self._task, completed=sum(self.done.values()), description=self._jobs_text()
            )


class Steps:
    """The step a command is at, for ``command``: a transient status line on a terminal,
    else one line a step (none unless ``shown``: the command shows its own progress, or
    none); a Ctrl-C is said as ``COMMAND: interrupted while STEP after N s`` and goes on
    (exit code 130), with what the step left (``cut``)."""

    def __init__(self, command: str, *, shown: bool = True) -> None:
        self.command = command
        self.shown = shown
        self.console = Console(stderr=True)
        self.now = "starting"
        self.cut = ""
        self._t0 = time.monotonic()
        self._status: Status | None = None

    def __enter__(self) -> Steps:
        self._t0 = time.monotonic()
        if self.shown:
            self.show_on_terminal()
        return self

    def show_on_terminal(self) -> None:
        """Show the steps from now on, on a terminal only: at the start for a shown
        command, else (its first step has a status line of its own: reading a trace)
        once that step is done."""
        if self._status is None and self.console.is_terminal:
            self._status = self.console.status("", spinner="dots")
            self._status.start()

    def step(self, doing: str, *, detail: str = "", cut: str = "") -> None:
        """Say that the command is ``doing`` now (and ``detail``, on the line only);
        ``cut``: what a Ctrl-C then leaves."""
        self.now, self.cut = doing, cut
        line = Text(f"{self.command}: {doing}{f' ({detail})' if detail else ''}")
        if self._status is not None:
            self._status.update(line)
        elif self.shown:
            self.console.print(line, soft_wrap=True)

    def __exit__(
        self, t: type[BaseException] | None, v: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._status is not None:
            self._status.stop()
        if t is not None and issubclass(t, KeyboardInterrupt):
            elapsed = time.monotonic() - self._t0
            left = f"; {self.cut}" if self.cut else ""
            said = f"{self.command}: interrupted while {self.now} after {elapsed:.1f} s{left}"
            self.console.print(Text(said), soft_wrap=True)

"""Progress of a replay or simulation matrix on stderr: a live bar on a terminal, plain
lines elsewhere.

Owns ``requests_bar`` (the bar of requests done that replay and simulate draw) and
``MatrixProgress``, the sink the replay's and the simulator's ``run_matrix`` report to
(requests done per job, then each job once its result is in: a job said done has a result
an interrupt keeps). On a terminal a transient bar counts requests over every job and
names the jobs finished; when stderr is a file or a pipe, one line per finished job
(none with ``quiet``), a policy run once for every size (``sizeless``) said to be at any
size, as the results say. It must never write to stdout, which carries the results.
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

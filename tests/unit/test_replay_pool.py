"""The replay job pool's hooks: every progress report of a job reaches the caller before
the job is said finished, in forked workers too."""

from __future__ import annotations

import os
from pathlib import Path

from controlplane.replay.pool import JobProgress, cgroup_cpus, default_workers, run_jobs


def _reports(job: int, report: JobProgress | None) -> int:
    assert report is not None
    for done in range(3):
        report(done)
    return job


def test_a_job_is_said_finished_after_its_last_progress() -> None:
    # Many short jobs in four workers: a report still on its way (a queue's feeder thread)
    # was once delivered after the result, so "finished" came first.
    heard: list[tuple[str, int]] = []
    for _ in range(10):
        heard.clear()
        results = run_jobs(
            list(range(16)),
            _reports,
            workers=4,
            progress=lambda job, done: heard.append(("progress", job)),
            finished=lambda job: heard.append(("finished", job)),
        )
        assert results == list(range(16))
        for job in range(16):
            said = [kind for kind, j in heard if j == job]
            assert said == ["progress"] * 3 + ["finished"], (job, said)


def test_the_default_workers_stay_within_a_containers_cpu_quota(tmp_path: Path) -> None:
    """The affinity of a pod limited to 2 CPUs lists the node's every core, and replay and
    simulate forked one worker per core; the cgroup's quota (v2, else v1) bounds them."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert cgroup_cpus(tmp_path) is None and default_workers(tmp_path) == cores
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpus(tmp_path) is None
    (tmp_path / "cpu.max").write_text("150000 100000\n")  # 1.5 CPUs: two workers may use them
    assert cgroup_cpus(tmp_path) == 2
    assert default_workers(tmp_path) == min(2, cores or 1)
    (tmp_path / "cpu.max").write_text("50000 100000\n")
    assert cgroup_cpus(tmp_path) == 1 and default_workers(tmp_path) == 1
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_cpus(v1) is None
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("100000\n")
    assert cgroup_cpus(v1) == 1 and default_workers(v1) == 1

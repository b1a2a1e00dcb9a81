"""The replay job pool's hooks: every progress report of a job reaches the caller before
the job is said finished, in forked workers too."""

from __future__ import annotations

from controlplane.replay.pool import JobProgress, run_jobs


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

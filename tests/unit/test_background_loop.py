"""The one background-loop class: restartable lifecycle, failures counted and survived,
outages told once, and the Redis state named in the warning."""

from __future__ import annotations

import logging

import pytest
import redis

from agent.runtime.connection import RedisState, describe_redis_error, redis_state
from agent.runtime.loop import BackgroundLoop
from tests.waiting import wait_until


class Counting(BackgroundLoop):
    def __init__(self, errors: list[BaseException | None]) -> None:
        super().__init__("counting", interval_s=0.001, max_backoff_s=0.002)
        self.errors = errors
        self.steps = 0
        self.finished = 0

    def step(self) -> None:
        self.steps += 1
        if self.errors:
            error = self.errors.pop(0)
            if error is not None:
                raise error

    def finish(self) -> None:
        self.finished += 1


def test_a_loop_restarts_after_close() -> None:
    loop = Counting([])
    loop.start()
    wait_until(lambda: loop.steps > 0, what="a first step")
    assert loop.close(timeout=5)
    assert loop.finished == 1 and not loop.running
    done = loop.steps
    loop.start()  # the publisher's start once forgot to clear its stop flag
    wait_until(lambda: loop.steps > done, what="steps after the restart")
    assert loop.close(timeout=5)
    assert loop.finished == 2


def test_failures_are_counted_survived_and_reset(caplog: pytest.LogCaptureFixture) -> None:
    down = redis.ConnectionError("Connection refused")
    loop = Counting([down, down, ValueError("a bug"), None])
    with caplog.at_level(logging.INFO, logger="agent.runtime.loop"):
        loop.start()
        wait_until(lambda: loop.steps >= 4, what="four steps")
        assert loop.close(timeout=5)
    assert loop.failures == 0 and loop.last_error == ""
    messages = [r.getMessage() for r in caplog.records]
    # One warning for the outage, one traceback for the bug, one line on recovery.
    assert sum("redis unavailable" in m for m in messages) == 1
    assert sum("ValueError: a bug" in m for m in messages) == 1
    assert sum("working again after 3 failed" in m for m in messages) == 1


def test_redis_errors_name_the_state() -> None:
    oom = redis.exceptions.OutOfMemoryError("command not allowed when used memory > 'maxmemory'.")
    assert redis_state(oom) is RedisState.OUT_OF_MEMORY
    aborted = redis.exceptions.ExecAbortError(
        "Transaction discarded because of: OOM command not allowed when used memory"
    )
    assert redis_state(aborted) is RedisState.OUT_OF_MEMORY
    assert redis_state(redis.TimeoutError("timed out")) is RedisState.UNREACHABLE
    assert redis_state(redis.exceptions.ReadOnlyError("READONLY")) is RedisState.READ_ONLY
    assert redis_state(redis.ResponseError("WRONGTYPE")) is RedisState.ERROR
    assert describe_redis_error(oom).startswith("redis out of memory")

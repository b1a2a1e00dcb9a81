"""The one background-loop class: restartable lifecycle, failures counted and survived,
outages told once, and the Redis state named in the warning."""

from __future__ import annotations

import logging
import threading
import time

import pytest
import redis

from agent.runtime.connection import RedisState, describe_redis_error, redis_state
from agent.runtime.loop import BackgroundLoop
from tests.waiting import wait_until


class Counting(BackgroundLoop):
    def __init__(self, errors: list[BaseException | None], max_backoff_s: float = 0.002) -> None:
        super().__init__("counting", interval_s=0.001, max_backoff_s=max_backoff_s)
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


def test_a_flapping_outage_is_said_once_and_its_end_at_warning_level(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A Redis at its memory limit refuses some writes and takes others: the warning came
    at every refusal after a success (17 in 30 s), and the recovery only at info level,
    below what a worker shows."""
    full = redis.ResponseError("OOM command not allowed when used memory > 'maxmemory'")
    loop = Counting([full, None, full, None, full, None])
    with caplog.at_level(logging.WARNING, logger="agent.runtime.loop"):
        loop.start()
        wait_until(lambda: loop.steps >= 6, what="six steps")
        assert loop.close(timeout=5)
    messages = [r.getMessage() for r in caplog.records]
    assert sum("out of memory" in m for m in messages) == 1, messages
    assert sum("working again after 1 failed" in m for m in messages) == 1, messages


class Idling(BackgroundLoop):
    """Each step's outcome in turn: an error to raise, or what ``step`` returns."""

    def __init__(self, outcomes: list[BaseException | bool | None]) -> None:
        super().__init__("idling", interval_s=0.001, max_backoff_s=0.002)
        self.outcomes = outcomes

    def step(self) -> bool | None:
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome


def test_a_step_with_nothing_to_do_is_no_recovery(caplog: pytest.LogCaptureFixture) -> None:
    """A worker whose Redis never answered said "working again after 1 failed rounds":
    its last flush had nothing to send, and counted as a success."""
    down = redis.ConnectionError("Connection refused")
    loop = Idling([down, False, False, None])
    with caplog.at_level(logging.DEBUG, logger="agent.runtime.loop"):
        assert not loop.run_step()
        assert loop.run_step() and loop.run_step()  # nothing to send: no word of recovery
        assert loop.failures == 1 and "Connection refused" in loop.last_error
        assert not any("working again" in r.getMessage() for r in caplog.records)
        assert loop.run_step()
    assert loop.failures == 0 and loop.last_error == ""
    messages = [r.getMessage() for r in caplog.records if "working again" in r.getMessage()]
    assert messages == ["kvwise idling: working again after 1 failed round"], messages


def test_wake_ups_do_not_undo_the_backoff_while_rounds_fail() -> None:
    """A busy engine wakes the publisher at every full batch: during an outage that once
    made it retry at the engine's pace instead of backing off."""
    down = redis.ConnectionError("Connection refused")
    loop = Counting([down] * 1000, max_backoff_s=60.0)  # 0.1 s doubling: seconds soon
    loop.start()
    wait_until(lambda: loop.failures >= 5, what="five failed rounds")  # waits 1.6 s next
    tried = loop.steps
    for _ in range(20):
        loop.wake()
        time.sleep(0.01)  # an absence is awaited: 0.2 s of a 1.6 s backoff, woken 20 times
    stopped = loop.steps
    assert loop.close(timeout=5)
    assert stopped - tried <= 1  # at most the round already under way


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


class Blocking(BackgroundLoop):
    """A loop whose rounds wait for ``release`` (a blocked read of ingest's, say)."""

    def __init__(self) -> None:
        super().__init__("blocking", interval_s=0.001, max_backoff_s=0.002)
        self.release = threading.Event()
        self.steps = 0

    def step(self) -> None:
        self.steps += 1
        self.release.wait(5)


def test_a_start_while_the_old_thread_finishes_waits_for_it_then_runs() -> None:
    """``start`` was a no-op while the stopped thread was still in its round; that thread
    then saw its stop flag and ended: the loop stayed stopped (ingest, lease won back)."""
    loop = Blocking()
    loop.start()
    wait_until(lambda: loop.steps == 1, what="a round in progress")
    loop.stop()
    assert loop.start(wait_s=0.05) is False  # still finishing: nothing started
    threading.Timer(0.1, loop.release.set).start()
    assert loop.start(wait_s=5) is True
    done = loop.steps
    wait_until(lambda: loop.steps > done, what="rounds of the new thread")
    assert loop.running and not loop.stopping
    assert loop.close(timeout=5)


def test_a_wait_that_raises_is_logged_counted_and_the_thread_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A failure in ``pause`` (the subscriber's waits on pub/sub there) ended the thread:
    the loop stopped for good, and nothing but Python's last-resort hook said so."""

    class BadWait(Counting):
        def pause(self, seconds: float) -> None:
            if self.steps == 1:
                raise RuntimeError("pubsub connection not set")
            super().pause(seconds)

    loop = BadWait([])
    with caplog.at_level(logging.INFO, logger="agent.runtime.loop"):
        loop.start()
        wait_until(lambda: loop.steps >= 3, what="steps after the failed wait")
        assert loop.close(timeout=5)
    messages = [r.getMessage() for r in caplog.records]
    assert sum("RuntimeError: pubsub connection not set" in m for m in messages) == 1
    assert loop.unexpected_errors == 1
    assert loop.finished == 1


def test_a_bug_whose_message_changes_each_round_is_told_once_a_quiet_spell(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A traceback was logged whenever the message differed from the last round's, so an
    error naming the item at hand (``KeyError: 1234``, each round another) logged one per
    round, without end."""
    loop = Counting([KeyError(n) for n in range(8)])
    with caplog.at_level(logging.WARNING, logger="agent.runtime.loop"):
        loop.start()
        wait_until(lambda: loop.steps >= 9, what="the failing rounds and one more")
        assert loop.close(timeout=5)
    tracebacks = [r.getMessage() for r in caplog.records if r.exc_info]
    assert len(tracebacks) == 1, tracebacks
    assert "KeyError: 0" in tracebacks[0]


def test_every_unexpected_error_is_counted_and_the_loop_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A loop whose step raised every round logged one traceback a quiet spell and went
    on, and nothing counted them: an operator could not tell a publisher failing every
    round from a healthy one. Every such error counts, said or not; Redis's do not (an
    outage is the Redis state's to tell); a good round resets nothing."""
    down = redis.ConnectionError("Connection refused")
    loop = Counting([ValueError("a bug"), down, None, ValueError("a bug"), KeyError(1), None])
    with caplog.at_level(logging.WARNING, logger="agent.runtime.loop"):
        loop.start()
        wait_until(lambda: loop.steps >= 7, what="the failing rounds and one more")
        assert loop.close(timeout=5)
    assert loop.unexpected_errors == 3
    assert loop.failures == 0
    tracebacks = [r.getMessage() for r in caplog.records if r.exc_info]
    assert len(tracebacks) == 2, tracebacks  # the second ValueError within the quiet spell

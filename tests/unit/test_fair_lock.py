"""FairLock: turns are served in the order asked, and a waiter interrupted by a signal
gives its turn up instead of blocking every turn after it."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial

from controlplane.shadow.fair_lock import FairLock
from tests.waiting import wait_until


class _Interrupted(Exception):
    """What the test's SIGALRM handler raises, as Ctrl-C raises KeyboardInterrupt."""


def _asked(lock: FairLock) -> int:
    with lock._turns:
        return lock._asked


def _asked_is(lock: FairLock, turns: int) -> bool:
    return _asked(lock) == turns


def _take(lock: FairLock, taken: list[str], name: str) -> threading.Thread:
    def take() -> None:
        with lock:
            taken.append(name)

    thread = threading.Thread(target=take, daemon=True)
    thread.start()
    return thread


@contextmanager
def _held(lock: FairLock) -> Iterator[threading.Event]:
    """The lock held by another thread until the yielded event is set."""
    release, holding = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            holding.set()
            release.wait(30)

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    holding.wait(10)
    try:
        yield release
    finally:
        release.set()
        holder.join(10)


def test_waiters_are_served_in_the_order_they_asked() -> None:
    lock, taken = FairLock(), list[str]()
    with _held(lock):
        threads = []
        for turn, name in enumerate("abcd", start=2):
            threads.append(_take(lock, taken, name))
            wait_until(partial(_asked_is, lock, turn), timeout=10, what=f"{name} waiting")
    for thread in threads:
        thread.join(10)
    assert taken == list("abcd")


def test_a_waiter_interrupted_by_a_signal_does_not_block_the_turns_after_it() -> None:
    lock, taken = FairLock(), list[str]()

    def interrupt(signum: int, frame: object) -> None:
        raise _Interrupted

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        with _held(lock):
            follower = threading.Thread(target=lambda: _ask_third(lock, taken), daemon=True)
            follower.start()  # it asks once the main thread waits for its own turn
            signal.setitimer(signal.ITIMER_REAL, 0.5)
            try:
                with lock:
                    taken.append("second")
            except _Interrupted:
                pass
            wait_until(lambda: _asked(lock) == 3, timeout=10, what="the third turn asked")
        follower.join(10)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert taken == ["third"]
    with lock:  # and the lock is free again
        taken.append("again")
    assert taken == ["third", "again"]


def _ask_third(lock: FairLock, taken: list[str]) -> None:
    wait_until(lambda: _asked(lock) == 2, timeout=10, what="the main thread waiting")
    _take(lock, taken, "third").join(10)

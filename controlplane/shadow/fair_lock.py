"""A lock granted in the order it was asked for.

Owns ``FairLock``. A ``threading.Lock`` lets the thread that releases it take it straight
back before a waiting thread wakes, so a thread that does long work in short holds (the
shadow evaluator replays each worker's gather, or catches new miniatures up, one hold at
a time) can keep another waiting for all of it; handed out in turn, a waiter waits for
one hold at most. A waiter interrupted while it waits (Ctrl-C in the main thread) gives
its turn up, so the turns after it are still served. It is not reentrant. It must never
know what it guards.
"""

from __future__ import annotations

import threading
from types import TracebackType


class FairLock:
    """A lock whose waiters take it first come, first served (``with lock:`` only)."""

    def __init__(self) -> None:
        self._turns = threading.Condition(threading.Lock())
        self._asked = 0
        """Turns given out: the next one asking gets this."""
        self._serving = 0
        """The turn that holds the lock, or takes it next."""
        self._given_up: set[int] = set()
        """Turns whose waiter left before being served: skipped when reached."""

    def __enter__(self) -> None:
        with self._turns:
            turn = self._asked
            self._asked += 1
            try:
                while turn != self._serving:
                    self._turns.wait()
            except BaseException:
                if turn == self._serving:
                    self._pass_on()  # served as it left: the next turn takes the lock
                else:
                    self._given_up.add(turn)
                raise

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        with self._turns:
            self._pass_on()

    def _pass_on(self) -> None:
        """Serve the next turn still waited for (the condition's lock held)."""
        self._serving += 1
        while self._serving in self._given_up:
            self._given_up.discard(self._serving)
            self._serving += 1
        self._turns.notify_all()

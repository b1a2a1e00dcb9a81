"""How a long-running command stops on SIGINT and SIGTERM: a flag the handler sets.

Owns ``SignalFlag`` (a stop a signal handler can set without a lock) and
``stop_on_signals`` (the handlers in place for a ``with`` block, the old ones back after).
It must never print or decide what a command does once stopped.
"""

from __future__ import annotations

import math
import signal
import threading
import time
from types import FrameType
from typing import Any


class SignalFlag:
    """A stop that a signal handler can set: setting it takes no lock. A handler runs on
    the main thread between two bytecodes, and that thread may hold any lock then (the
    lock inside ``threading.Event.wait``, or the one ``Thread.start`` takes): a handler
    that waited on one would wait for ever. ``wait`` polls instead, every 0.1 s."""

    POLL_S = 0.1

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: float | None = None) -> bool:
        end = math.inf if timeout is None else time.monotonic() + timeout
        while not self._set and (left := end - time.monotonic()) > 0:
            time.sleep(min(left, self.POLL_S))
        return self._set


class stop_on_signals:
    """SIGINT and SIGTERM set ``stop`` (main thread only); the old handlers come back."""

    def __init__(self, stop: SignalFlag) -> None:
        self.stop = stop
        self.saved: dict[int, Any] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.stop.set()

    def __enter__(self) -> None:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self.saved[sig] = signal.signal(sig, self._handle)

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self.saved.items():
            signal.signal(sig, handler)

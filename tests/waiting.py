"""The one way tests wait for something: poll a condition until it holds or fail saying what
was awaited. Tests wait for a state, never for a fixed time."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """The awaited condition did not hold in time (an assertion: the test fails)."""


def wait_until(
    condition: Callable[[], T],
    *,
    timeout: float = 10.0,
    what: str = "",
    every: float = 0.02,
) -> T:
    """Call ``condition`` every ``every`` s until it returns something true; return that.

    Raises ``WaitTimeout`` naming ``what`` (or the condition) after ``timeout`` s. An
    exception from ``condition`` propagates at once: a failing check is not a slow one.
    """
    deadline = time.monotonic() + timeout
    pause = threading.Event()  # never set: a wait that reads as one
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise WaitTimeout(f"timed out after {timeout} s waiting for {what or condition}")
        pause.wait(every)

"""The one background-loop class behind every kvwise thread that talks to Redis: the agent's
publisher, subscriber and heartbeat, and the controller's ingest.

Owns a daemon thread's lifecycle (``start``, ``stop``, ``close``; restartable after
``close``, and after ``stop`` once the old thread has ended), its pacing (a round every
``interval_s``, at once on ``wake``, and exponential backoff up to ``max_backoff_s`` while
rounds fail) and how failures are told: one warning when rounds start failing (naming the
Redis state: unreachable, out of memory, ...), one line when they succeed again, and a
traceback only for an unexpected error, once per type within ``QUIET_S``, each one counted
in ``unexpected_errors`` (the agent's heartbeat carries its loops'). A failed round (or a
failed wait between rounds) never ends the thread. Subclasses say what one round
does (``step``) and may change how to wait (``pause``), how long (``next_wait``) and what
to do once the loop ends (``finish``).
``AgentLoop`` is the agent's threads' common start: their settings, client and keys, and a
client that reconnects after a read-only refusal (a failover behind one address). It must
never run on an engine thread.
"""

from __future__ import annotations

import logging
import threading
import time
from abc import ABC, abstractmethod
from typing import Protocol

import redis
from redis.backoff import ExponentialBackoff

from agent.runtime.connection import (
    RedisClient,
    describe_redis_error,
    reconnect_after_read_only,
)
from agent.settings import AgentSettings
from agent.wire import Keys

log = logging.getLogger(__name__)

BACKOFF_BASE_S = 0.1
"""First wait after a failed round; it doubles per further failure up to ``max_backoff_s``."""
QUIET_S = 60.0
"""An outage with the same error within this long of the last one said is not said again
(a Redis at its memory limit refuses some writes and takes others: rounds flap)."""


class RedisObserver(Protocol):
    """Told of every Redis failure and success of a loop (it then logs outages itself)."""

    def failed(self, exc: BaseException) -> object: ...

    def answered(self) -> None: ...


class BackgroundLoop(ABC):
    """A daemon thread calling ``step`` until stopped; see the module docstring."""

    def __init__(
        self,
        name: str,
        *,
        interval_s: float,
        max_backoff_s: float,
        observer: RedisObserver | None = None,
    ) -> None:
        self.name = name
        self.observer = observer
        self.interval_s = interval_s
        self._backoff = ExponentialBackoff(cap=max_backoff_s, base=BACKOFF_BASE_S)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.failures = 0
        """Consecutive failed rounds (0: the last round succeeded)."""
        self.last_error = ""
        """Why the last round failed ("" once one succeeds)."""
        self.unexpected_errors = 0
        """Rounds (and waits between rounds) failed by an error not Redis's, a bug most
        likely, since the loop was made: a total, never reset."""
        self._said: tuple[str, float] | None = None  # the outage last said, and when
        self._saying = False  # this outage was said: its end is said too

    # --- what a subclass says --------------------------------------------------------------
    @abstractmethod
    def step(self) -> bool | None:
        """One step of work; raise (``redis.RedisError`` or anything) to count a failure.
        Return False when it had nothing to do and reached no server: such a step says
        nothing of an outage, so a failing loop keeps its count (and its backoff)."""

    def outage_note(self) -> str:
        """What happens while rounds fail, for the warning (e.g. "dropping events")."""
        return "retrying with backoff"

    def next_wait(self) -> float:
        """Seconds to wait before the next round."""
        if self.failures:
            return max(self.interval_s, self._backoff.compute(self.failures))
        return self.interval_s

    def pause(self, seconds: float) -> None:
        """Wait up to ``seconds``; returns early on ``wake`` or ``stop``."""
        self._wake.wait(seconds)
        self._wake.clear()

    def finish(self) -> None:  # noqa: B027 (a hook: doing nothing is the default)
        """Runs on the thread once the loop has ended (e.g. a last flush)."""

    def redis_failed(self, exc: redis.RedisError) -> None:  # noqa: B027 (a hook, as finish)
        """Told of each Redis error that failed a round, before it is counted."""

    def failed_unexpectedly(self) -> None:  # noqa: B027 (a hook, as finish)
        """Told of each round (or wait) failed by an error not Redis's, as it is counted in
        ``unexpected_errors``."""

    # --- lifecycle -------------------------------------------------------------------------
    def start(self, *, wait_s: float = 1.0) -> bool:
        """Start the thread (again, after ``close``); a no-op while it runs. A thread still
        finishing its last round after ``stop`` is waited for up to ``wait_s`` before a new
        one starts; False if it is still finishing (nothing started: call again later)."""
        thread = self._thread
        if thread is not None and thread.is_alive():
            if not self._stop.is_set():
                return True
            thread.join(wait_s)
            if thread.is_alive():
                return False
        self._stop.clear()
        self._wake.clear()
        self._thread = threading.Thread(target=self._main, name=f"kvwise-{self.name}", daemon=True)
        self._thread.start()
        return True

    def stop(self) -> None:
        """Ask the thread to end after its current round (returns at once)."""
        self._stop.set()
        self._wake.set()

    def close(self, timeout: float = 5.0) -> bool:
        """``stop`` and wait up to ``timeout`` s; False if the thread is still in a round
        (it is a daemon: a hung Redis cannot hold the process)."""
        self.stop()
        thread = self._thread
        if thread is None:
            return True
        thread.join(timeout)
        if thread.is_alive():
            return False
        self._thread = None
        return True

    def wake(self) -> None:
        """Cut the current wait short: the next round starts now. Ignored while rounds
        fail, so a busy engine's wake-ups cannot undo the backoff against a Redis that is
        down or recovering."""
        if not self.failures:
            self._wake.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # --- the loop --------------------------------------------------------------------------
    def run_step(self) -> bool:
        """Run one step, account for its outcome; True if it succeeded (or had nothing to
        do)."""
        try:
            reached = self.step()
        except redis.RedisError as exc:
            self.redis_failed(exc)
            if self.observer is not None:
                self.observer.failed(exc)
            self._failed(describe_redis_error(exc), unexpected=False)
            return False
        except Exception as exc:  # a bug in one step must not end the thread
            self._failed(f"{type(exc).__name__}: {exc}", unexpected=True)
            return False
        if reached is False:
            return True
        if self.failures:
            level = logging.WARNING if self._saying else logging.DEBUG
            rounds = "round" if self.failures == 1 else "rounds"
            log.log(
                level,
                "kvwise %s: working again after %d failed %s",
                self.name,
                self.failures,
                rounds,
            )
        self._saying = False
        self.failures = 0
        self.last_error = ""
        return True

    def _failed(self, error: str, *, unexpected: bool) -> None:
        if unexpected:
            self.unexpected_errors += 1
            self.failed_unexpectedly()
            # Told by its type: a message may name the item at hand, another each round.
            if error != self.last_error and self._to_say(error.partition(":")[0]):
                log.exception(
                    "kvwise %s: round failed (%s); %s", self.name, error, self.outage_note()
                )
        elif self.failures == 0 and self.observer is None and self._to_say(error):
            log.warning("kvwise %s: %s; %s", self.name, error, self.outage_note())
            self._saying = True
        self.failures += 1
        self.last_error = error

    def _to_say(self, what: str) -> bool:
        """Whether ``what`` (an outage's error, an unexpected error's type), failing a round
        now, is to be said: not if it was the last said, within ``QUIET_S``."""
        now = time.monotonic()
        said, self._said = self._said, (what, now)
        return said is None or said[0] != what or now - said[1] >= QUIET_S

    def _main(self) -> None:
        while not self._stop.is_set():
            self.run_step()
            if self._stop.is_set():
                break
            self._wait()
        self.finish()

    def _wait(self) -> None:
        """``pause`` for ``next_wait``; a failure there (a subclass's wait may read the
        network) counts as a failed round, is told as one, and the plain wait stands in,
        so the thread goes on at its pace."""
        try:
            self.pause(self.next_wait())
        except Exception as exc:
            self._failed(f"{type(exc).__name__}: {exc}", unexpected=True)
            BackgroundLoop.pause(self, self.interval_s)


class AgentLoop(BackgroundLoop):
    """A loop of the agent's: its ``settings``, Redis ``client`` and ``keys``; failed rounds
    back off up to ``settings.reconnect_max_s``."""

    def __init__(
        self, name: str, settings: AgentSettings, client: RedisClient, *, interval_s: float
    ) -> None:
        super().__init__(name, interval_s=interval_s, max_backoff_s=settings.reconnect_max_s)
        self.settings = settings
        self.client = client
        self.keys = Keys(settings.key_prefix)

    def redis_failed(self, exc: redis.RedisError) -> None:
        reconnect_after_read_only(self.client, exc)

"""The publisher thread: recorded events -> columnar batches -> ``XADD`` per worker stream.

Owns the background sender, the batch sequence numbers and the sent/dropped counts of the
network side. It drains the recorder every ``flush_interval_s`` (or as soon as a batch is
full), resolves ``batch_events``-row chunks against the access history (which it owns:
only this thread touches it), and sends the batches in one pipeline with
``XADD MAXLEN ~ stream_maxlen``. When Redis is down or slow the batches in hand are
dropped and counted (their sequence numbers are spent, so the controller sees the gap;
the history was still updated), and the next round waits with exponential backoff; the
engine thread never waits on it.
It must never be called from the engine thread except ``wake``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import redis

from agent.history import AccessHistory, Events
from agent.recorder import EventRecorder
from agent.runtime.connection import reconnect_backoff
from agent.settings import AgentSettings
from agent.wire import EventBatch, Keys, encode_batch

log = logging.getLogger(__name__)


class EventPublisher:
    """Sends what ``recorder`` holds to ``Keys.events_stream(worker)`` from a daemon thread."""

    def __init__(
        self,
        settings: AgentSettings,
        client: redis.Redis,
        recorder: EventRecorder,
        *,
        worker: str,
        epoch: str,
        categories: Callable[[], tuple[str, ...]],
        history: AccessHistory,
        unknown_category: int,
    ) -> None:
        self.settings = settings
        self.client = client
        self.recorder = recorder
        self.worker = worker
        self.epoch = epoch
        self.stream = Keys(settings.key_prefix).events_stream(worker)
        self._categories = categories
        self.history = history
        self.unknown_category = unknown_category
        self._backoff = reconnect_backoff(settings)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.seq = 0
        """Sequence number of the last batch cut (sent or dropped)."""
        self.sent = 0
        """Events acknowledged by Redis."""
        self.dropped = 0
        """Events lost because their send failed."""
        self.filtered = 0
        """Recorded releases of blocks the cache held: not events (see agent.history)."""
        self.failures = 0
        """Consecutive failed sends (0 = connected)."""
        self.last_error = ""

    def wake(self) -> None:
        """Ask for a flush now (the recorder calls this when a batch is full)."""
        self._wake.set()

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(
            target=self._run, name=f"kvwise-publisher-{self.worker}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Ask the thread to make a last flush of everything recorded so far and end."""
        self._stop.set()
        self._wake.set()

    def close(self, timeout: float = 10.0) -> bool:
        """``stop`` and wait up to ``timeout`` s; False if the thread is still sending
        (it is a daemon: a hung Redis cannot hold the process)."""
        self.stop()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                return False
            self._thread = None
        return True

    def _run(self) -> None:
        while not self._stop.is_set():
            wait = self.settings.flush_interval_s
            if self.failures:
                wait = max(wait, self._backoff.compute(self.failures))
            self._wake.wait(wait)
            self._wake.clear()
            if self._stop.is_set():
                break
            self.flush()
        self.flush()

    def collect(self) -> list[Events]:
        """Drain the recorder and resolve what it held, in chunks of at most
        ``batch_events`` (each chunk is one batch). Publisher thread only: it owns the
        history."""
        raw = self.recorder.drain()
        step = self.recorder.batch_events
        chunks = []
        for lo in range(0, len(raw), step):
            events = self.history.resolve(raw.rows(lo, lo + step), self.unknown_category)
            self.filtered += min(step, len(raw) - lo) - len(events)
            if len(events):
                chunks.append(events)
        return chunks

    def flush(self) -> int:
        """Send everything recorded so far; return the events sent. Runs on the publisher
        thread (or after it stopped)."""
        chunks = self.collect()
        if not chunks:
            return 0
        names = self._categories()
        n = sum(len(c) for c in chunks)
        pipe = self.client.pipeline(transaction=False)
        for events in chunks:
            self.seq += 1
            batch = _batch(events, self.worker, self.seq, self.epoch, names)
            pipe.xadd(
                self.stream,
                encode_batch(batch),  # type: ignore[arg-type]
                maxlen=self.settings.stream_maxlen,
                approximate=True,
            )
        try:
            pipe.execute()
        except redis.RedisError as exc:
            self._failed(n, exc)
            return 0
        finally:
            pipe.reset()
        if self.failures:
            log.info(
                "kvwise publisher: Redis reachable again after %d failed sends; %d events "
                "dropped so far",
                self.failures,
                self.dropped,
            )
            self.failures = 0
        self.sent += n
        return n

    def _failed(self, n: int, exc: redis.RedisError) -> None:
        self.dropped += n
        self.last_error = f"{type(exc).__name__}: {exc}"
        if self.failures == 0:
            log.warning(
                "kvwise publisher: cannot send to %s (%s); dropping events until it recovers",
                self.stream,
                self.last_error,
            )
        self.failures += 1


def _batch(cols: Events, worker: str, seq: int, epoch: str, names: tuple[str, ...]) -> EventBatch:
    return EventBatch(
        worker=worker,
        seq=seq,
        epoch=epoch,
        categories=names,
        ts=cols.ts,
        block=cols.block,
        category=cols.category,
        offset=cols.offset,
        kind=cols.kind,
        prev_ts=cols.prev_ts,
        prev_category=cols.prev_category,
    )

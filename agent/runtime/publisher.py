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
from collections.abc import Callable

from agent.history import AccessHistory
from agent.recorder import EventRecorder
from agent.runtime.connection import RedisClient
from agent.runtime.loop import AgentLoop
from agent.settings import AgentSettings
from agent.wire import EventBatch, Events, encode_batch

log = logging.getLogger(__name__)


class EventPublisher(AgentLoop):
    """Sends what ``recorder`` holds to ``Keys.events_stream(worker)`` from a daemon thread."""

    def __init__(
        self,
        settings: AgentSettings,
        client: RedisClient,
        recorder: EventRecorder,
        *,
        worker: str,
        epoch: str,
        categories: Callable[[], tuple[str, ...]],
        history: AccessHistory,
        unknown_category: int,
    ) -> None:
        super().__init__(
            f"publisher-{worker}", settings, client, interval_s=settings.flush_interval_s
        )
        self.recorder = recorder
        self.worker = worker
        self.epoch = epoch
        self.stream = self.keys.events_stream(worker)
        self._categories = categories
        self.history = history
        self.unknown_category = unknown_category
        self.seq = 0
        """Sequence number of the last batch cut (sent or dropped)."""
        self.sent = 0
        """Events acknowledged by Redis."""
        self.dropped = 0
        """Events lost because their send failed."""
        self.filtered = 0
        """Recorded releases of blocks the cache held: not events (see agent.history)."""

    def step(self) -> bool:
        """Send what is recorded; False when there was nothing to send."""
        return self.flush() > 0

    def finish(self) -> None:
        """A last flush of everything recorded before ``stop``."""
        self.run_step()

    def outage_note(self) -> str:
        return f"dropping events for {self.stream} until it recovers"

    def collect(self) -> list[Events]:
        """Drain the recorder and resolve what it held, in chunks of at most
        ``batch_events`` (each chunk is one batch). Publisher thread only: it owns the
        history."""
        raw = self.recorder.drain()
        step = self.recorder.batch_events
        chunks: list[Events] = []
        filtered = 0
        try:
            for lo in range(0, len(raw), step):
                events = self.history.resolve(raw.rows(lo, lo + step), self.unknown_category)
                filtered += min(step, len(raw) - lo) - len(events)
                if len(events):
                    chunks.append(events)
        except Exception:  # drained, never to be sent: counted, as a failed send's are
            self.dropped += len(raw) - filtered
            raise
        finally:
            self.filtered += filtered
        return chunks

    def flush(self) -> int:
        """Send everything recorded so far; return the events sent. Runs on the publisher
        thread (or after it stopped). A failed send drops and counts its events, then
        raises the ``redis.RedisError``."""
        chunks = self.collect()
        if not chunks:
            return 0
        sizes = [len(c) for c in chunks]
        try:
            results = self._send(self._batches(chunks))
        except BaseException:  # nothing is known to have arrived
            self.dropped += sum(sizes)
            raise
        sent, refusal = tally(sizes, results)
        self.sent += sent
        self.dropped += sum(sizes) - sent
        if refusal is not None:
            raise refusal
        return sent

    def _batches(self, chunks: list[Events]) -> list[dict[str, bytes]]:
        """Each chunk encoded as a batch with the next sequence number: spent before the
        send, so a batch that never arrives is a gap the controller counts."""
        names = self._categories()
        encoded: list[dict[str, bytes]] = []
        for events in chunks:
            self.seq += 1
            batch = EventBatch.of(events, worker=self.worker, seq=self.seq, epoch=self.epoch,
                                  categories=names)  # fmt: skip
            encoded.append(encode_batch(batch))
        return encoded

    def _send(self, batches: list[dict[str, bytes]]) -> list[object]:
        """One pipeline of one XADD per batch, each batch's reply or refusal. The pipeline
        is made here, where a failure is a failed send: a cluster client connects when
        first used, and one unreachable then lost the events it drained uncounted."""
        pipe = self.client.pipeline(transaction=False)
        try:
            for fields in batches:
                pipe.xadd(
                    self.stream,
                    fields,  # type: ignore[arg-type]
                    maxlen=self.settings.stream_maxlen,
                    approximate=True,
                )
            return list(pipe.execute(raise_on_error=False))
        finally:
            pipe.reset()


def tally(sizes: list[int], replies: list[object]) -> tuple[int, Exception | None]:
    """The events of a pipeline of batches that arrived, each batch judged by its own
    reply (Redis may refuse one XADD and take the others), and the first refusal."""
    refusals = [reply for reply in replies if isinstance(reply, Exception)]
    sent = sum(
        n for n, reply in zip(sizes, replies, strict=True) if not isinstance(reply, Exception)
    )
    return sent, refusals[0] if refusals else None

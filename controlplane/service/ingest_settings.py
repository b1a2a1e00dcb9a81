"""How one replica's ingest reads the event streams: ``IngestSettings``, taken from the
controller's settings (``from_settings``), where each is defaulted and documented.

Owns the ingest's tunables as one frozen value (group and consumer, read sizes and waits,
the entry limits, the reclaim idle time, the trim grace, the ledger's tracking bound, the
most streams read). Plain values: it must never read the environment (the controller's
settings do) nor Redis.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from agent.wire import BatchLimits
from controlplane.service.ledger import MAX_OUT_OF_ORDER

if TYPE_CHECKING:
    from controlplane.service.settings import ControllerSettings


@dataclass(frozen=True)
class IngestSettings:
    """How one replica's ingest reads the event streams: ``from_settings`` takes them from
    the controller's settings, where each is defaulted and documented."""

    group: str
    """The consumer group all replicas read in."""
    consumer: str
    """This replica's consumer in the group."""
    count: int
    """Entries per stream per read."""
    block_ms: int
    """Wait after a pass that found nothing."""
    reclaim_idle_ms: int
    """Entries another consumer left pending this long are taken over."""
    limits: BatchLimits
    """What one entry may hold; an entry over a limit is dead-lettered."""
    max_read_bytes: int
    """Bytes one read may bring in, about; it also bounds how many streams one read
    covers (``max_read_bytes // limits.max_entry_bytes``, taken round robin)."""
    trim_grace_ms: int = 0
    """While a recording is announced, acknowledged entries younger than this stay in the
    stream for it."""
    max_out_of_order: int = MAX_OUT_OF_ORDER
    """Sequence numbers a worker's ledger tracks above its first gap."""
    max_workers: int = 1024
    """Streams read, at most: one found past them is left unread (``refused``)."""

    @classmethod
    def from_settings(cls, settings: ControllerSettings, consumer: str) -> IngestSettings:
        """The ingest of ``settings`` for this replica's ``consumer``."""
        return cls(
            group=settings.consumer_group,
            consumer=consumer,
            count=settings.ingest_count,
            block_ms=settings.ingest_block_ms,
            reclaim_idle_ms=settings.reclaim_idle_ms,
            limits=BatchLimits(
                max_events=settings.ingest_max_events,
                max_categories=settings.max_categories_per_worker,
            ),
            max_read_bytes=settings.ingest_max_read_bytes,
            trim_grace_ms=round(settings.stream_trim_grace_s * 1000),
            max_workers=settings.max_workers,
        )

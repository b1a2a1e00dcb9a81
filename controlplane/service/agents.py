"""What the controller says about each agent: its heartbeat plus what ingest did with its
events (from the worker's ledger, so any replica, leader or not, answers the same) and
whether several agent processes beat under its id (from the id's instances hash, likewise).

Owns ``AgentView``, ``AgentListing`` and reading them from Redis: the heartbeat keys (SCAN,
page by page), the first ``max_agents`` of them in a fixed order (the workers ingested, then
by key) read (``MAX_HEARTBEAT_BYTES`` of each at most), and the counts of those workers'
ledgers (``LEDGER_FIELDS`` only, within the bounds ``ledger_reads`` reads any ledger in)
and their instances hashes (``agent_instances``: the processes beating under the id, within
its bounds), in three round trips. The heartbeat keys past ``max_agents`` are
counted, not read: any process may write them. A heartbeat this release cannot read (too
large, not a string, an agent of another wire schema, a corrupt value) is counted, skipped
and said once per agent key while that key lives; a ledger it cannot read (not a hash,
more fields than a ledger holds, a count too long or not a number) leaves its worker listed
with its counts unknown (``counts_known``), counted and said once per worker while it is
listed; an instances hash it cannot read (not a hash), or a field of one (too long, not an
``AgentInstance``), reads as nothing, and fields past its bound are left unread, each said
once per worker while it is listed and until its hash reads well again. It must never
write.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar, Final

from pydantic import ConfigDict, TypeAdapter

from agent.runtime.connection import RedisClient
from agent.wire import MAX_HEARTBEAT_BYTES, AgentStatus, Keys, WireError
from controlplane.service.agent_instances import (
    MAX_INSTANCES_READ,
    WorkerInstances,
    read_instances,
)
from controlplane.service.ledger_reads import LedgerFields
from controlplane.told_once import ToldOnce

log = logging.getLogger(__name__)

SCAN_PAGE = 500
"""Heartbeat keys asked of one SCAN call, and names held beside those kept."""


def _ledger_count(name: str) -> int:
    """An ``AgentView`` field that holds the count ``name`` of its worker's ledger
    (``LEDGER_COUNTS``); 0 where the ledger has none or was unreadable."""
    return field(default=0, metadata={"ledger": name})


def _heartbeat_descriptions(schema: dict[str, Any]) -> None:
    """The heartbeat's fields described in ``AgentView``'s schema as in ``AgentStatus``'s
    (a field's docstring is read from the class that declares it only)."""
    heartbeat = TypeAdapter(AgentStatus).json_schema()["properties"]
    for name, prop in schema.get("properties", {}).items():
        described = heartbeat.get(name, {}).get("description")
        if described is not None:
            prop.setdefault("description", described)


@dataclass(frozen=True)
class AgentView(AgentStatus):
    """An agent's heartbeat and the controller's counts of its events."""

    __pydantic_config__: ClassVar[ConfigDict] = ConfigDict(
        use_attribute_docstrings=True, json_schema_extra=_heartbeat_descriptions
    )

    events_ingested: int = _ledger_count("events")
    """Events of this worker applied to the statistics window."""
    clock_rejected: int = _ledger_count("clock_rejected")
    """Events dropped: their time was outside ``clock_tolerance_s`` of the controller's."""
    events_refused: int = _ledger_count("refused")
    """Events in entries dead-lettered for a limit or a failure to apply."""
    dead_letters: int = _ledger_count("dead_letters")
    """Entries of this worker dead-lettered."""
    gap_batches: int = _ledger_count("missing")
    """Batches missing from its sequence (lost before ingest)."""
    id_conflict: int = _ledger_count("id_conflict")
    """Agent processes (starts) found alive under this worker id at the same time, for over
    30 s: two replicas given one ``KVWISE_WORKER_ID`` read 2, this heartbeat being either
    one's; 0 when none are, a restart included. The larger of two findings: ingest's, of
    the processes writing events at once as of its last batch of the worker (their events
    counted as this one worker's: ``events_ingested`` then exceeds this heartbeat's
    ``events_sent``), and ``heartbeat_id_conflict``, which sees replicas that send none."""
    heartbeat_id_conflict: int = 0
    """Agent processes beating under this id at once, by its instances hash: each still
    beating (its last beat within two of its periods of the newest there) and beside
    another for over 30 s; 0 when none (a restart: the old one's beats stop as the new
    one's begin) and for agents that predate the hash."""
    engine_seconds: float = 0.0
    """Estimated engine-thread time of kvwise's calls since the agent started (its sampled
    ``engine_*`` counts: ``EngineTimeSnapshot``)."""
    engine_seconds_per_call: float = 0.0
    """Mean engine-thread time of one of kvwise's calls, over the timed ones."""
    engine_seconds_per_block: float = 0.0
    """Engine-thread time of the timed calls per block they handled."""
    counts_known: bool = True
    """False: the worker's ledger could not be read (not a hash, more fields than a ledger
    holds, a count too long or not a number); the counts above read 0."""
    ingest_refused: bool | None = None
    """Its stream was found past ``KVWISE_MAX_WORKERS`` streams: the leader leaves it
    unread (and the shadow leaves the worker out) until one ingested expires. None: not
    known here (a replica that does not lead knows nothing of ingest's refusals)."""


@dataclass(frozen=True)
class AgentListing:
    """The agents read, and the heartbeat keys left out of them."""

    agents: list[AgentView]
    """The live agents read, by id."""
    not_listed: int = 0
    """Heartbeat keys found past ``max_agents``, not read (a key SCAN returns twice while
    Redis resizes its table may count twice)."""
    refused: int = 0
    """Heartbeats read but unreadable: too large, not a string, another schema, corrupt."""
    ledgers_refused: int = 0
    """Agents listed whose ledger was unreadable (``AgentView.counts_known``)."""
    instances: Mapping[str, WorkerInstances] = field(default_factory=dict, repr=False)
    """What each listed worker's instances hash says (its stale fields, for the leader to
    remove); a worker whose hash was refused is absent."""


LEDGER_COUNTS: Final = {
    f.metadata["ledger"]: f.name for f in fields(AgentView) if "ledger" in f.metadata
}
"""Each count of a worker's ledger a listing reads, and the ``AgentView`` field it fills."""
LEDGER_FIELDS: Final = tuple(LEDGER_COUNTS)
"""The fields of a worker's ledger (``WorkerLedger.to_hash``) a listing reads: its counts.
The sequence tracking beside them (``epochs``, up to thousands of numbers) is ingest's."""


class AgentReader:
    """Reads ``AgentListing``s; remembers which unreadable heartbeats it has reported."""

    def __init__(self, client: RedisClient, keys: Keys, max_agents: int) -> None:
        self.r = client
        self.keys = keys
        self.max_agents = max_agents
        self._told: ToldOnce[bytes] = ToldOnce()
        self._told_ledgers: ToldOnce[str] = ToldOnce()
        self._told_instances: ToldOnce[str] = ToldOnce()
        self._ledgers = LedgerFields(client, keys, LEDGER_FIELDS)

    def read(self, preferred: Collection[str] = ()) -> AgentListing:
        """The first ``max_agents`` live agents, the workers ``preferred`` (those ingested)
        before the others, each group by key."""
        keys, not_listed = self.first_keys({self.keys.agent(w).encode() for w in preferred})
        statuses = self.statuses(keys)
        live = [s for s in statuses if isinstance(s, AgentStatus)]
        refused = sum(s is False for s in statuses)
        instances = self._instances(live)
        views = self._views(live, instances)
        return AgentListing(
            sorted(views, key=lambda a: a.id),
            not_listed,
            refused,
            ledgers_refused=sum(not v.counts_known for v in views),
            instances=instances,
        )

    def _views(
        self, live: list[AgentStatus], instances: Mapping[str, WorkerInstances]
    ) -> list[AgentView]:
        """``live`` with their ledgers' counts (``LEDGER_FIELDS`` only) and the processes
        their instances hashes find beating at once."""
        workers = [s.id for s in live]
        raws = self._ledgers.read(workers)
        self._told_ledgers.keep_only(workers)  # a worker gone is forgotten
        shared = {w: i.conflict for w, i in instances.items()}
        return [self._view(s, raw, shared.get(s.id, 0)) for s, raw in zip(live, raws, strict=True)]

    def _view(
        self, status: AgentStatus, raw: dict[bytes, bytes] | ValueError, shared: int
    ) -> AgentView:
        """``status`` with its ledger's counts (unknown, said once, if unreadable) and the
        processes ``shared`` its instances hash finds beating at once."""
        try:
            if isinstance(raw, ValueError):
                raise raw
            counts = {view: int(raw.get(f.encode(), b"0")) for f, view in LEDGER_COUNTS.items()}
        except ValueError as exc:
            if self._told_ledgers.first(status.id):
                log.warning("counts of %r unknown: its ledger is unreadable: %s", status.id, exc)
            return _view(status, {"id_conflict": shared}, shared, counts_known=False)
        counts["id_conflict"] = max(counts["id_conflict"], shared)
        return _view(status, counts, shared)

    def _instances(self, live: list[AgentStatus]) -> dict[str, WorkerInstances]:
        """What the instances hash of each worker ``live`` says; one refused, or with fields
        refused or unread, said once (a refused one left out)."""
        workers = [s.id for s in live]
        self._told_instances.keep_only(workers)
        read = dict(zip(workers, read_instances(self.r, self.keys, live), strict=True))
        for worker, got in read.items():
            trouble = _instances_trouble(got)
            if not trouble:
                self._told_instances.forget(worker)  # told again if it comes back
            elif self._told_instances.first(worker):
                log.warning("instances hash of %r: %s", worker, trouble)
        return {w: got for w, got in read.items() if isinstance(got, WorkerInstances)}

    def first_keys(
        self, preferred: Collection[bytes] = (), excluded: Collection[bytes] = (), limit: int = -1
    ) -> tuple[list[bytes], int]:
        """The first ``limit`` (default ``max_agents``) heartbeat keys not ``excluded`` in
        reading order, and how many others SCAN found: at most ``limit`` and a page of names
        are held at once."""
        limit = self.max_agents if limit < 0 else limit
        first: list[bytes] = []
        others = 0
        scan = self.r.scan_iter(match=self.keys.agents_match, count=SCAN_PAGE)
        for page in _pages(scan, SCAN_PAGE):
            kept = set(first).union(k for k in page if k not in excluded)
            merged = sorted(kept, key=lambda k: (k not in preferred, k))
            first, others = merged[:limit], others + len(merged[limit:])
        return first, others

    def statuses(self, keys: list[bytes]) -> list[AgentStatus | bool]:
        """The heartbeats under ``keys`` (``MAX_HEARTBEAT_BYTES`` of each at most), as
        ``_status`` says them; the unreadable keys told before and not among ``keys`` are
        forgotten (agent churn)."""
        self._told.keep_only(keys)
        pipe = self.r.pipeline(transaction=False)
        for key in keys:  # one key per command: heartbeats sit on many shards
            pipe.getrange(key, 0, MAX_HEARTBEAT_BYTES)  # a byte past the limit: too large
        raws = pipe.execute(raise_on_error=False)  # a key of another type fails alone
        for raw in raws:
            if isinstance(raw, Exception) and not str(raw).startswith("WRONGTYPE"):
                raise raw  # Redis's trouble (read-only, out of memory): the health's
        return [self._status(k, raw) for k, raw in zip(keys, raws, strict=True)]

    def _status(self, key: bytes, raw: bytes | Exception) -> AgentStatus | bool:
        """The heartbeat under ``key``; True: expired between SCAN and GETRANGE (GETRANGE
        answers a missing key with nothing); False: unreadable, said once per key."""
        if isinstance(raw, bytes) and not raw:
            return True
        try:
            if isinstance(raw, Exception):
                raise WireError("heartbeat: not a string value (WRONGTYPE)")
            if len(raw) > MAX_HEARTBEAT_BYTES:
                raise WireError(f"heartbeat: more than {MAX_HEARTBEAT_BYTES} bytes")
            return AgentStatus.from_json(raw)
        except WireError as exc:
            if self._told.first(key):
                log.warning("ignoring the heartbeat under %r: %s", key, exc.reason)
            return False


def _pages(items: Iterable[bytes], size: int) -> Iterable[list[bytes]]:
    """``items`` in lists of ``size`` at most."""
    page: list[bytes] = []
    for item in items:
        page.append(item)
        if len(page) == size:
            yield page
            page = []
    if page:
        yield page


def _instances_trouble(got: WorkerInstances | ValueError) -> str:
    """What is wrong with a worker's instances hash as read ("": nothing)."""
    if isinstance(got, ValueError):
        return f"refused ({got}): read as no processes"
    told = [f"{n} fields past {MAX_INSTANCES_READ} left unread" for n in [got.unread] if n]
    told += [f"ignoring {reason}" for reason in got.bad]
    return "; ".join(told)


def _view(
    status: AgentStatus, counts: Mapping[str, int], shared: int, *, counts_known: bool = True
) -> AgentView:
    """``status`` with its ledger's ``counts`` (by ``AgentView`` field; one missing: 0) and
    the processes ``shared`` its instances hash finds beating at once."""
    cost = status.engine_time
    return AgentView(
        **asdict(status) | dict(counts),
        heartbeat_id_conflict=shared,
        engine_seconds=cost.seconds,
        engine_seconds_per_call=cost.seconds_per_call,
        engine_seconds_per_block=cost.seconds_per_block,
        counts_known=counts_known,
    )

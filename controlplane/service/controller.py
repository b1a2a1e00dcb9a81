"""The controller process: wiring of lease, ingest, the statistics window, refit jobs,
checkpoints and the store.

Owns the controller's lifecycle and its background work: an APScheduler scheduler
(``coalesce``, ``max_instances=1``; its own chatter kept below warning) runs the lease tick,
the refit and the shadow refresh (which also tends the instances hashes: several agents
under one id); the ingest thread, between passes, the window checkpoint
and the ageing out of unused categories (so a checkpoint never holds a batch its ledger does
not); the leader alone runs the ingest thread, refits (one at a time), checkpoints and
publishes (fenced: only while the lease key still holds its name). A new leader loads the
last checkpoint before it ingests, so a restart keeps the fit. A standby replica serves
reads and takes over within one lease time. Redis trouble is told once per change of state
(``RedisHealth``), and a failed call reaches the API as the ``redis.RedisError`` it was; a
refit that publishes nothing says why once per change of reason. A stop waits for the jobs
and ingest, then a leader checkpoints and releases the lease (one attempt each); where Redis
stops answering meanwhile (a ping every ``STOP_GRACE_S``), every Redis call still waiting is
given up, nothing more is written, and its last line says what it could not leave.

This module owns the ``Controller`` and the order of its work; the refit itself is
``refit``'s (``Refitter``), the parts built from the settings ``controller_parts``', the
categories as operators read them ``categories``', the gauges a scrape sets ``gauges``'.
It must never parse HTTP (``controlplane.api.app``) or encode wire data itself
(``agent.wire``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import socket
import threading
import time
import uuid

import redis
from apscheduler.schedulers.background import BackgroundScheduler

from agent.runtime.connection import (
    RedisClient,
    RedisState,
    describe_redis_error,
    redact,
    redis_state,
)
from agent.wire import EventBatch, Keys
from controlplane.fit import FitResult
from controlplane.service.agent_instances import InstanceConflicts
from controlplane.service.agents import AgentListing, AgentReader, AgentView
from controlplane.service.categories import CategoryDetail, CategorySummary, detail, summaries
from controlplane.service.checkpoint import CheckpointError, CheckpointStore
from controlplane.service.controller_parts import (
    PROBE_TIMEOUT_S,
    checkpoint_store,
    live_window,
    redis_client,
)
from controlplane.service.gauges import show_agents, show_policy
from controlplane.service.health import RedisHealth, guarded
from controlplane.service.housekeeping import Housekeeper, HousekeepingSettings
from controlplane.service.ingest import Ingestor
from controlplane.service.ingest_settings import IngestSettings
from controlplane.service.lease import LeaderLease
from controlplane.service.metrics import ControllerMetrics
from controlplane.service.policy_memory import PolicyMemory
from controlplane.service.refit import RefitOutcome, RefitStatus, Refitter
from controlplane.service.settings import ControllerSettings
from controlplane.service.shadowing import ShadowLink
from controlplane.service.store import PolicyStore
from controlplane.service.store_terms import (
    StoreState,
)
from controlplane.shadow.selection import SelectionView
from controlplane.shadow.view import ShadowView

log = logging.getLogger(__name__)

SHADOW_REFRESH_S = 5.0
"""Seconds between reads of the workers' capacities and the document in force (shadow),
and between settings of the shadow's gauges that a scrape serves."""
STOP_GRACE_S = 3.0
"""Seconds between the pings of a stop that still waits (the first this long after it
began): while Redis answers one within ``PROBE_TIMEOUT_S``, the stop waits for its work as
long as it takes; the first it does not answer gives up its Redis calls."""


@dataclasses.dataclass
class _Stop:
    """Where a controller's stop stands (``Controller.begin_stop``)."""

    begun: threading.Event = dataclasses.field(default_factory=threading.Event)
    """Set as the stop begins: no lease tick starts ingest again."""
    give_up: threading.Event = dataclasses.field(default_factory=threading.Event)
    """Set once Redis does not answer the stop's ping: the calls of the controller's
    clients (not the probes' or ``final_r``) fail at once, and none is retried."""
    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    silent: str = ""
    """Why the stop gave up: what the ping that Redis did not answer got."""
    led: bool = False
    """Whether the replica led as its stop began (a lease tick given up drops the lease)."""
    jobs: threading.Thread | None = None
    """The scheduler's shutdown, waiting for the jobs that run."""


class Controller:
    def __init__(self, settings: ControllerSettings) -> None:
        self.settings = settings
        self.keys = Keys(settings.key_prefix)
        self._stop = _Stop()
        self.r, self.probe_r, self.final_r = self._redis_clients()
        self.metrics = ControllerMetrics()
        self.health = RedisHealth(redact(settings.redis_url), self.metrics)
        self.health.follow(self.r, self.probe_r)
        self.name = settings.consumer_name or f"{socket.gethostname()}-{os.getpid()}"
        # The name survives a restart (a pod's name, pid 1 in a container): checkpoints
        # and the lease are told apart by this process's own id. The lease holds both, so
        # two live processes of one name (a misconfiguration) never both lead, and a
        # restarted one waits out its predecessor's lease.
        self.process_id = uuid.uuid4().hex
        self.memory = PolicyMemory(settings.restore_wait_s)
        self.store = PolicyStore(
            self.r,
            self.keys,
            settings.history_size,
            supersede=settings.supersede,
            max_overrides=settings.max_overrides,
            max_categories=settings.max_categories,
            health=self.health,
            memory=self.memory,
            on_refused=lambda part: self.metrics.state_refused.labels(part=part).inc(),
        )
        self.lease = LeaderLease(
            self.r,
            self.keys.leader,
            f"{self.name}/{self.process_id[:8]}",
            settings.lease_ttl_s,
            observer=self.health,
        )
        self.window = window = live_window(settings)
        # Read at each scrape: right from the first batch on.
        self.metrics.window_categories.set_function(lambda: window.categories)
        self.checkpoints = checkpoint_store(self.r, self.keys, settings, window)
        self.final_checkpoints = checkpoint_store(self.final_r, self.keys, settings, window)
        self.agent_reader = AgentReader(self.r, self.keys, settings.max_workers)
        self.instance_conflicts = InstanceConflicts(self.r, self.keys, settings.max_workers)
        """The leader's care of the instances hashes (the shadow job's): stale fields
        removed, several agents under one id said."""
        self.shadow = ShadowLink(settings.shadow_only(), self.metrics, settings.max_workers)
        self.refitter = Refitter(
            settings, self.store, window, self.shadow, self.metrics, self.memory, self.lease
        )
        """Refits and family selections, one at a time, on the leader."""
        self._last_checkpoint = time.monotonic()
        self._checkpoint_read = False
        """Whether this replica, since it last took the lease, has read the checkpoint."""
        self._role_said = False  # its role logged once known
        self.ingestor = self._make_ingestor()
        self.scheduler = BackgroundScheduler(
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None}
        )
        if settings.log_level != "debug":
            # Its "skipped: maximum number of running instances" comes with every slow tick
            # while Redis is unreachable, which RedisHealth has already said once.
            logging.getLogger("apscheduler").setLevel(logging.ERROR)

    def _redis_clients(self) -> tuple[RedisClient, RedisClient, RedisClient]:
        """The main client (its calls given up once a stop finds Redis unanswering), the
        health probe's, and the one for the stop's last writes (one try each)."""
        settings = self.settings
        return (
            redis_client(settings, give_up=self._stop.give_up),
            redis_client(settings, timeout_s=PROBE_TIMEOUT_S, retries=0),
            redis_client(settings, retries=0),
        )

    def _make_ingestor(self) -> Ingestor:
        s = self.settings
        # A blocked read may wait ingest_block_ms on the server: its own client, longer timeout.
        client = redis_client(s, timeout_s=s.ingest_block_ms / 1000 + 5, give_up=self._stop.give_up)
        self.health.follow(client)
        sweep = HousekeepingSettings.from_settings(s)
        return Ingestor(
            client,
            self.keys,
            self._apply,
            IngestSettings.from_settings(s, self.name),
            metrics=self.metrics,
            housekeeper=Housekeeper(
                client, self.keys, group=s.consumer_group, consumer=self.name, settings=sweep
            ),
            observer=self.health,
            between_passes=self._checkpoint_if_due,
            leads=self.lease.confirm,
        )

    # --- lifecycle -----------------------------------------------------------------------
    def start(self) -> None:
        # One probe that waits PROBE_TIMEOUT_S, not retried: a Redis that takes the
        # connection but never answers (stalled, or TLS on one side only) is said once,
        # here, and the lease waits for its scheduled tick. The first tick's retried calls
        # took over a minute there, during which the API served nothing, /healthz included,
        # and a kubelet restarted the pod before it ever said why.
        first = self.health.probe(self.probe_r, self.keys.probe(self.name))
        if first.state is not RedisState.UNREACHABLE:
            self._tick_lease()  # probes Redis again: trouble is said once, here
        s = self.settings
        jobs = (
            (self._tick_lease, s.lease_ttl_s / 3, "lease"),
            (self.refitter.scheduled, s.refit_interval_s, "refit"),
            (self._refresh_shadow, SHADOW_REFRESH_S, "shadow"),
        )
        for job, seconds, name in jobs:
            self.scheduler.add_job(job, "interval", seconds=seconds, id=name)
        self.scheduler.start()

    def begin_stop(self) -> None:
        """Begin the stop and return at once (the server calls it as its own stop begins, so
        that API requests waiting on a Redis that hangs are given up with the rest): no job
        or ingest pass starts any more, and while the stop still waits, Redis is pinged
        every ``STOP_GRACE_S``; the first ping it does not answer gives up every Redis call
        still waiting (each ends within the attempt it has in flight, ``CALL_TIMEOUT_S``)."""
        stop = self._stop
        with stop.lock:
            if stop.begun.is_set():
                return
            stop.begun.set()
            stop.led = self.lease.is_leader
        self.ingestor.stop()  # its pass ends and commits; a lease tick starts it no more
        stop.jobs = threading.Thread(target=self._stop_jobs, name="kvwise-stop-jobs", daemon=True)
        stop.jobs.start()
        watch = threading.Thread(target=self._watch_stop, name="kvwise-stop-watch", daemon=True)
        watch.start()

    def stop(self) -> None:
        """Stop the jobs and ingest; a leader checkpoints its window and releases the lease,
        one attempt each (``final_r``). Where Redis does not answer, the stop gives up
        (``begin_stop``) and writes nothing. Logs one line saying what it did and left."""
        self.begin_stop()
        try:
            if self._stop.jobs is not None:
                self._stop.jobs.join()
            ingest_ended = self._stop_ingest()
            self._leave(ingest_ended)
        finally:
            self._stop.done.set()

    def _leave(self, ingest_ended: bool) -> None:
        """What a stop leaves in Redis, said in one line."""
        if self._stop.give_up.is_set() and self._stop.led:
            log.warning(
                "%s stopped: %s: no checkpoint (what the window took since the last one is "
                "lost, as after a crash), lease left to expire (within %g s)",
                self.name,
                self._stop.silent,
                self.settings.lease_ttl_s,
            )
            return
        if not self.lease.is_leader:
            self.lease.release()
            log.info("%s stopped: a standby, no lease or checkpoint to leave", self.name)
            return
        saved, answered = self._final_checkpoint(ingest_ended)
        released = "lease left to expire"
        if answered:  # else a second call would wait out its timeout too
            released = "lease released" if self.lease.release(self.final_r) else released
        log.info("%s stopped: %s, %s", self.name, saved, released)

    def _watch_stop(self) -> None:
        """Until the stop is done: every ``STOP_GRACE_S``, a ping; the first one Redis does
        not answer gives its calls up (``begin_stop``)."""
        began = time.monotonic()
        while not self._stop.done.wait(STOP_GRACE_S):
            silent = self._redis_silent()
            if silent is None:
                continue  # slow work, and Redis answers: the stop waits, as it always did
            self._stop.silent = silent
            self._stop.give_up.set()
            log.warning(
                "%s stopping: still at work after %.0f s, and Redis does not answer (a ping "
                "got %s): its calls are given up",
                self.name,
                time.monotonic() - began,
                silent,
            )
            return

    def _stop_jobs(self) -> None:
        if self.scheduler.running:
            self.scheduler.shutdown(wait=True)

    def _redis_silent(self) -> str | None:
        """None if Redis answers a ping within ``PROBE_TIMEOUT_S``; else why not, in one
        line. A Redis that answers with an error (loading, say) answers."""
        try:
            self.probe_r.ping()
        except redis.RedisError as exc:
            if redis_state(exc) is RedisState.UNREACHABLE:
                return describe_redis_error(exc)
        return None

    def _final_checkpoint(self, ingest_ended: bool) -> tuple[str, bool]:
        """The stop's checkpoint (one attempt, ``CALL_TIMEOUT_S``): what it left, and
        whether Redis answered. Between passes only: a checkpoint beside a pass would hold
        batches its ledgers do not (applied, not yet committed), counted twice after a
        crash."""
        if not ingest_ended:
            return "no checkpoint (ingest was still in a pass)", True
        if not self._checkpoint_read:
            return "no checkpoint (the last one was never read: it stays)", True
        try:
            size = self._save_window(self.final_checkpoints)
        except CheckpointError as exc:
            return f"checkpoint not written ({exc})", True
        except redis.RedisError as exc:
            answered = redis_state(exc) is not RedisState.UNREACHABLE
            return f"checkpoint not written ({describe_redis_error(exc)})", answered
        return f"checkpoint written ({size:,} bytes)", True

    def _tick_lease(self) -> None:
        self.health.probe(self.r, self.keys.probe(self.name))
        was = self.lease.is_leader
        now = self.lease.tick()
        self.metrics.leader.set(1 if now else 0)
        if now:
            self._lead(newly=not was)
            self._role_said = True
        elif was and self._stop.begun.is_set():
            return  # a tick the stop gave up: the stop ends ingest and says what it left
        elif was:
            log.warning("%s lost the leader lease", self.name)
            self._stop_ingest()
            self._role_said = True
        elif not self._role_said:
            self._role_said = self._said_standby()
        self.memory.track(self.store)

    def _lead(self, *, newly: bool) -> None:
        """A leader's tick: on taking the lease, load the last checkpoint; on every tick,
        publish a policy if no version is current (the store's state as last read, when
        Redis restarted empty; else the built-in defaults) and start ingest if it is not
        running (a tick that failed half way, or an old ingest thread still finishing when
        the lease came back, must not leave a leader that never ingests)."""
        self.memory.ensure(self.store, lambda: self._read_agents().agents)
        if newly:
            log.info("%s is the leader", self.name)
            self._checkpoint_read = False
        if not self._checkpoint_read:
            # Ingest waits until the last checkpoint is read (or known absent or unusable):
            # a window started empty would overwrite it at its first checkpoint.
            self._checkpoint_read = self._load_checkpoint(first_try=newly)
            if not self._checkpoint_read:
                return
        if self._stop.begun.is_set():
            return  # the stop waits for ingest to end: never start it again
        self.ingestor.start(wait_s=0)  # never hold the lease tick: the next one tries again

    def _said_standby(self) -> bool:
        """Log that another replica leads; False (nothing logged) while Redis does not say
        which one does: unreachable, or the lease between holders."""
        try:
            holder = self.lease.holder_now()
        except redis.RedisError:
            return False
        if holder is None or holder == self.lease.holder:
            return False
        log.info("%s is a standby: %s leads; this one serves reads", self.name, holder)
        return True

    @property
    def store_state(self) -> StoreState | None:
        """The store's state as this replica last read or published it (None: neither)."""
        return self.memory.state

    def _stop_ingest(self) -> bool:
        """Stop ingest; False if its thread is still in a pass."""
        return self.ingestor.close(timeout=self.settings.ingest_block_ms / 1000 + 10)

    # --- the window --------------------------------------------------------------------------
    def _apply(self, batch: EventBatch) -> int:
        now = time.time()
        rejected = self.window.apply(batch, now)
        self.shadow.apply(self.window.timely(batch, now) if rejected else batch)
        return rejected

    def _refresh_shadow(self) -> None:
        """The shadow job: on the leader, the workers' capacities and the document in force
        as read now, and the instances hashes read with them tended (``InstanceConflicts``);
        on every replica, the shadow's gauges set from its view (a scrape serves them as set
        here: it never waits for the shadow's replays)."""
        if self.lease.is_leader:
            with contextlib.suppress(redis.RedisError):  # said by the health; next tick tries
                listing, current = self._read_agents(), self.store.current()
                ingested = [a for a in listing.agents if not a.ingest_refused]
                self.shadow.refresh(ingested, current, idle_s=SHADOW_REFRESH_S)
                self.instance_conflicts.tend(listing.instances)  # a write Redis may refuse
        self.shadow.export()

    def _load_checkpoint(self, *, first_try: bool) -> bool:
        """Restore the window from the last checkpoint; False while Redis does not answer
        (the next tick tries again), True once it is read, absent or unusable."""
        try:
            loaded = self.health.guard(self.checkpoints.load)()
        except redis.RedisError as exc:
            level = logging.WARNING if first_try else logging.DEBUG
            log.log(level, "checkpoint not read (%s): ingest waits for it", exc)
            return False
        except CheckpointError as exc:
            self.metrics.checkpoints.labels(outcome="refused").inc()
            log.warning(
                "no checkpoint loaded (%s; key %s): %s",
                exc,
                self.keys.checkpoint,
                self._window_goes_on(),
            )
            return True
        if loaded is None:
            log.info("no checkpoint yet: %s", self._window_goes_on())
            return True
        if loaded.process == self.process_id:
            return True  # this process's own (the lease came back): its memory is as new
        try:
            self.window.restore(loaded.state)
        except Exception as exc:  # a checkpoint that does not fit is ignored, never fatal
            self.metrics.checkpoints.labels(outcome="refused").inc()
            log.warning(
                "checkpoint %s ignored (%s): %s", self.keys.checkpoint, exc, self._window_goes_on()
            )
            return True
        self.ingestor.forget_uncommitted()
        log.info(
            "loaded the window checkpoint of %.0f s ago: %s categories, %s bytes",
            time.time() - loaded.taken_at,
            f"{len(loaded.state.names):,}",
            f"{loaded.nbytes:,}",
        )
        return True

    def _window_goes_on(self) -> str:
        """What the window holds when no checkpoint is loaded (a replica that led before
        keeps what it gathered)."""
        held = self.window.categories
        return (
            f"the window goes on with its {held:,} categories"
            if held
            else "the window starts empty"
        )

    def _checkpoint_if_due(self) -> None:
        """On the ingest thread, between passes: every ``checkpoint_interval_s``, while
        this replica leads (its last pass after a lost lease must not overwrite the new
        leader's checkpoint)."""
        due = time.monotonic() - self._last_checkpoint >= self.settings.checkpoint_interval_s
        if due and self.lease.is_leader:
            self._last_checkpoint = time.monotonic()
            self.checkpoint()

    def checkpoint(self) -> int | None:
        """Age unused categories out, then save the window; returns the bytes written (None:
        not written, counted, and said by the health or here)."""
        try:
            return self._save_window(self.checkpoints)
        except (redis.RedisError, CheckpointError):
            return None

    def _save_window(self, store: CheckpointStore) -> int:
        """``checkpoint`` through ``store``, its failure raised (and counted)."""
        aged = self.window.age_out()
        if aged:
            log.info("%s unused categories aged out of the window", f"{aged:,}")
        try:
            size = self.health.guard(store.save)(
                self.window.state(), writer=self.name, process=self.process_id
            )
        except (redis.RedisError, CheckpointError) as exc:
            self.metrics.checkpoints.labels(outcome="failed").inc()
            if isinstance(exc, CheckpointError):
                log.warning("checkpoint not written: %s", exc)
            raise
        self.metrics.checkpoints.labels(outcome="written").inc()
        self.metrics.checkpoint_bytes.set(size)
        return size

    # --- refit ---------------------------------------------------------------------------
    @property
    def last_fit(self) -> FitResult | None:
        """The last refit's fit (None: none yet)."""
        return self.refitter.last_fit

    def select_family(self) -> SelectionView | None:
        """See ``Refitter.select_family``."""
        return self.refitter.select_family()

    def refit(self, *, manual: bool) -> RefitOutcome:
        """See ``Refitter.refit``."""
        return self.refitter.refit(manual=manual)

    @guarded
    def refit_status(self) -> RefitStatus:
        """See ``Refitter.status``."""
        return self.refitter.status()

    # --- reads for the API -----------------------------------------------------------------
    def shadow_view(self) -> ShadowView:
        """The shadow evaluation's curves per worker group and the guard's last verdict."""
        return self.shadow.view()

    @guarded
    def agents(self) -> list[AgentView]:
        """Live agents (by heartbeat) with the controller's counts of their events."""
        return self._read_agents().agents

    @guarded
    def agent_listing(self) -> AgentListing:
        """``agents`` and the heartbeat keys left out of them."""
        return self._read_agents()

    def _read_agents(self) -> AgentListing:
        """The live agents (at most ``max_workers``, those ingested first); on the leader
        each marked with whether ingest leaves its stream unread (a standby cannot say)."""
        listing = self.agent_reader.read(preferred=self.ingestor.ingested_workers())
        if not self.lease.is_leader:
            return listing
        refused = self.ingestor.refused_workers()
        return dataclasses.replace(
            listing,
            agents=[dataclasses.replace(a, ingest_refused=a.id in refused) for a in listing.agents],
        )

    @guarded
    def categories(self) -> list[CategorySummary]:
        return summaries(self.store.current(), self.last_fit)

    @guarded
    def category(self, name: str) -> CategoryDetail | None:
        return detail(name, self.store.current(), self.last_fit)

    def ready(self) -> tuple[bool, str]:
        """Readiness and, when not ready, why (Redis's state named: out of memory, ...)."""
        report = self.health.probe(self.probe_r, self.keys.probe(self.name))
        if not report.ok:
            return False, report.reason
        try:
            version = self.store.current_version()
            if version is None:
                return False, "no policy version published yet"
            if not self.store.has_version(version):
                return False, f"current names version {version}, not stored"
            # A refused one (see store.get) leaves it ready: the next publication replaces
            # it, and a replica out of its Service would cut operators off the API that
            # publishes one (GET /v1/policy says why; kvwise_policy_state_refused counts it).
        except redis.RedisError:
            return False, self.health.report.reason
        return True, ""

    def refresh_gauges(self) -> None:
        """Read what the gauges show from Redis; a Redis that does not answer a ping within
        ``PROBE_TIMEOUT_S`` leaves them as they were (its state gauge says why). The
        shadow's gauges are the shadow job's (``_refresh_shadow``), not a scrape's."""
        m = self.metrics
        try:
            self.probe_r.ping()
        except redis.RedisError as exc:
            self.health.failed(exc)
            return
        try:
            cur = self.store.current()
            listing = self.agent_listing()
            m.pending.set(self.ingestor.pending() if self.lease.is_leader else 0)
        except (redis.RedisError, OSError):
            return
        except Exception as exc:  # a read of another thread's list: never fail a scrape
            log.debug("gauges not refreshed: %s", exc)
            return
        show_policy(m, cur)
        show_agents(m, listing)

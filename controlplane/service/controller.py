"""The controller process: wiring of lease, ingest, the statistics window, refit jobs,
checkpoints and the store.

Owns the controller's lifecycle and its background work: an APScheduler scheduler
(``coalesce``, ``max_instances=1``; its own chatter kept below warning) runs the lease tick,
the refit and the shadow refresh; the ingest thread, between passes, the window checkpoint
and the ageing out of unused categories (so a checkpoint never holds a batch its ledger does
not); the leader alone runs the ingest thread, refits (one at a time), checkpoints and
publishes (fenced: only while the lease key still holds its name). A new leader loads the
last checkpoint before it ingests, so a restart keeps the fit. A standby replica serves
reads and takes over within one lease time. Redis trouble is told once per change of state
(``RedisHealth``), and a failed call reaches the API as the ``redis.RedisError`` it was; a
refit that publishes nothing says why once per change of reason. It must never parse HTTP
(``controlplane.api.app``) or encode wire data itself (``agent.wire``).
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
from dataclasses import dataclass, replace

import redis
from apscheduler.schedulers.background import BackgroundScheduler

from agent.policy_document import DEFAULT_FAMILY, MODEL_PARAMS, CategoryParams, PolicyDocument
from agent.runtime.connection import RedisClient, connect, describe_redis_error, redact
from agent.wire import EventBatch, Keys
from controlplane.fit import FitResult, fit_all
from controlplane.fit.gof import ReuseCurve
from controlplane.fit.per_category import max_relative_change
from controlplane.fit.reuse_window import ReuseStats
from controlplane.service.agents import AgentListing, AgentReader, AgentView
from controlplane.service.checkpoint import CheckpointBounds, CheckpointError, CheckpointStore
from controlplane.service.health import RedisHealth, guarded
from controlplane.service.housekeeping import Housekeeper, HousekeepingSettings
from controlplane.service.ingest import Ingestor, IngestSettings
from controlplane.service.lease import LeaderLease
from controlplane.service.metrics import ControllerMetrics, RefitOutcomeLabel
from controlplane.service.policy_memory import PolicyMemory
from controlplane.service.settings import ControllerSettings
from controlplane.service.shadowing import ShadowLink
from controlplane.service.store import (
    REFITS_HELD,
    LeaseLost,
    PolicyLost,
    PolicyStore,
    RefitsHeld,
    StoreState,
)
from controlplane.service.window import LiveWindow, WindowLimits
from controlplane.shadow.selection import SelectionView
from controlplane.shadow.view import ShadowView
from controlplane.told_once import ToldOnce

log = logging.getLogger(__name__)

CALL_RETRIES = 3
"""Retries of one Redis call (capped exponential backoff) before the controller sees it."""
PROBE_TIMEOUT_S = 1.0
"""Longest wait of a probe (one call, no retry): a stalled Redis costs readiness and a
scrape this long, within a kubelet's timeout, not the retried calls' tens of seconds."""
SHADOW_REFRESH_S = 5.0
"""Seconds between reads of the workers' capacities and the document in force (shadow),
and between settings of the shadow's gauges that a scrape serves."""


@dataclass(frozen=True)
class RefitOutcome:
    """What one refit did: published a version, or why not."""

    published: bool
    version: int | None
    reason: str
    seconds: float


@dataclass(frozen=True)
class RefitStatus:
    """Why the workers have the version they have: the last refit's outcome on this
    replica (None on a standby, or before the first) and whether a rollback holds
    automatic refits back."""

    held: bool
    last: RefitOutcome | None
    last_at: float | None
    """Unix time of the last refit."""


@dataclass(frozen=True)
class CategorySummary:
    """One category as operators see it: the last fit beside the published parameters."""

    name: str
    samples: int
    fitted: CategoryParams | None
    published: CategoryParams | None
    published_version: int | None
    """The version in force, which holds ``published`` (None: it holds no such category)."""
    fit_quality: float | None


@dataclass(frozen=True)
class CategoryDetail(CategorySummary):
    """A summary with the empirical and fitted reuse-time CDF (None: no fit data)."""

    cdf: ReuseCurve | None


def redis_client(
    settings: ControllerSettings, *, timeout_s: float = 5.0, retries: int = CALL_RETRIES
) -> RedisClient:
    """The controller's client for ``settings.redis_url`` (``RedisUrlError`` if malformed)."""
    return connect(
        settings.redis_url,
        timeout_s=timeout_s,
        retries=retries,
        cluster=settings.redis_cluster,
        health_check_s=15,
    )


def live_window(settings: ControllerSettings) -> LiveWindow:
    """An empty statistics window as ``settings`` size and bound it."""
    return LiveWindow(
        ReuseStats(
            window_s=settings.window_s,
            near_concurrent_s=settings.near_concurrent_s,
            n_buckets=settings.window_buckets,
        ),
        WindowLimits(
            clock_tolerance_s=settings.clock_tolerance_s,
            max_categories=settings.max_categories,
            max_categories_per_worker=settings.max_categories_per_worker,
        ),
    )


def checkpoint_store(
    client: RedisClient, keys: Keys, settings: ControllerSettings, window: LiveWindow
) -> CheckpointStore:
    """The checkpoint of ``window``, bounded as ``settings`` bound the window and its size."""
    return CheckpointStore(
        client,
        keys.checkpoint,
        max_bytes=settings.max_checkpoint_bytes,
        bounds=CheckpointBounds.of(window.stats, settings.max_categories),
    )


class Controller:
    def __init__(self, settings: ControllerSettings) -> None:
        self.settings = settings
        self.keys = Keys(settings.key_prefix)
        self.r = redis_client(settings)
        self.probe_r = redis_client(settings, timeout_s=PROBE_TIMEOUT_S, retries=0)
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
        self.agent_reader = AgentReader(self.r, self.keys, settings.max_workers)
        self.shadow = ShadowLink(settings.shadow_only(), self.metrics, settings.max_workers)
        self.last_fit: FitResult | None = None
        self._last_refit: tuple[RefitOutcome, float] | None = None
        self._last_refusal = ""
        self._refit_failures_told: ToldOnce[type[Exception]] = ToldOnce()
        self._refit_revision = -1  # the window's revision at the last refit that ran through
        self._refit_said = ""  # what the last refit that ran through said
        self._refit_lock = threading.RLock()  # one refit at a time: scheduled or manual
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

    def _make_ingestor(self) -> Ingestor:
        s = self.settings
        # A blocked read may wait ingest_block_ms on the server: its own client, longer timeout.
        client = redis_client(s, timeout_s=s.ingest_block_ms / 1000 + 5)
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
        self._tick_lease()  # probes Redis first: trouble is said once, here
        s = self.settings
        jobs = (
            (self._tick_lease, s.lease_ttl_s / 3, "lease"),
            (self._scheduled_refit, s.refit_interval_s, "refit"),
            (self._refresh_shadow, SHADOW_REFRESH_S, "shadow"),
        )
        for job, seconds, name in jobs:
            self.scheduler.add_job(job, "interval", seconds=seconds, id=name)
        self.scheduler.start()

    def stop(self) -> None:
        """Stop the jobs; a leader checkpoints its window and releases the lease. Logs one
        line saying what it did."""
        if self.scheduler.running:
            self.scheduler.shutdown(wait=True)
        if not self.lease.is_leader:
            self.lease.release()
            log.info("%s stopped: a standby, no lease or checkpoint to leave", self.name)
            return
        # Between passes only: a checkpoint beside a pass would hold batches its ledgers
        # do not (applied, not yet committed), counted twice after a crash.
        if not self._stop_ingest():
            saved = "no checkpoint (ingest was still in a pass)"
        elif not self._checkpoint_read:
            saved = "no checkpoint (the last one was never read: it stays)"
        elif (size := self.checkpoint()) is None:
            saved = "checkpoint not written"
        else:
            saved = f"checkpoint written ({size:,} bytes)"
        released = "lease released" if self.lease.release() else "lease left to expire"
        log.info("%s stopped: %s, %s", self.name, saved, released)

    def _tick_lease(self) -> None:
        self.health.probe(self.r, self.keys.probe(self.name))
        was = self.lease.is_leader
        now = self.lease.tick()
        self.metrics.leader.set(1 if now else 0)
        if now:
            self._lead(newly=not was)
            self._role_said = True
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
        as read now; on every replica, the shadow's gauges set from its view (a scrape
        serves them as set here: it never waits for the shadow's replays)."""
        if self.lease.is_leader:
            with contextlib.suppress(redis.RedisError):  # said by the health; next tick tries
                agents, current = self._read_agents().agents, self.store.current()
                ingested = [a for a in agents if not a.ingest_refused]
                self.shadow.refresh(ingested, current, idle_s=SHADOW_REFRESH_S)
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
        """Age unused categories out, then save the window; returns the bytes written."""
        aged = self.window.age_out()
        if aged:
            log.info("%s unused categories aged out of the window", f"{aged:,}")
        try:
            size = self.health.guard(self.checkpoints.save)(
                self.window.state(), writer=self.name, process=self.process_id
            )
        except (redis.RedisError, CheckpointError) as exc:
            self.metrics.checkpoints.labels(outcome="failed").inc()
            if isinstance(exc, CheckpointError):
                log.warning("checkpoint not written: %s", exc)
            return None
        self.metrics.checkpoints.labels(outcome="written").inc()
        self.metrics.checkpoint_bytes.set(size)
        return size

    # --- refit ---------------------------------------------------------------------------
    def _scheduled_refit(self) -> None:
        if not self.lease.is_leader:
            return
        try:
            with self._refit_lock:
                self.select_family()
                outcome = self.refit(manual=False)
        except redis.RedisError as exc:
            self.metrics.refits.labels(outcome="error").inc()
            self._said_unpublished("error", describe_redis_error(exc), logging.WARNING)
            return
        except Exception as exc:  # never out to the scheduler: its log is kept below warning
            self.metrics.refits.labels(outcome="error").inc()
            self._said_failed(exc)
            return
        if outcome.published:
            self._last_refusal = ""
            return
        kind = outcome.reason.split(":")[0]
        level = logging.WARNING if kind == "refused" else logging.INFO
        self._said_unpublished(kind, outcome.reason, level)

    def _said_failed(self, exc: Exception) -> None:
        """Log a scheduled refit that raised: with its traceback the first time its kind
        comes, at debug after (every tick may raise it again); the next tick tries again."""
        self._last_refusal = "error"
        if self._refit_failures_told.first(type(exc)):
            log.exception("refit failed (%s); the next refit tries again", type(exc).__name__)
        else:
            log.debug("refit failed again (%s: %s)", type(exc).__name__, exc)

    def _said_unpublished(self, kind: str, reason: str, level: int) -> None:
        """Log why a scheduled refit published nothing: once per kind in a row."""
        if kind != self._last_refusal:
            log.log(level, "refit published nothing: %s", reason)
            self._last_refusal = kind
        else:
            log.debug("refit published nothing: %s", reason)

    def select_family(self) -> SelectionView | None:
        """Judge the last full shadow window (``controlplane.shadow.selection``); when the
        selector switches, publish its family (an operator's pin still wins in the
        document), log it once with the figures and count it."""
        verdict = self.shadow.select(self.store.evictor().in_force or DEFAULT_FAMILY)
        if verdict is None or not verdict.switches:
            return verdict
        note = f"evictor family: {verdict.reason}"
        try:
            doc = self.store.select_evictor(verdict.chosen, note, fence=self.lease.confirm)
        except (LeaseLost, PolicyLost):
            return verdict  # the new leader, or the restored state, is judged again
        self.shadow.set_policy(doc)
        self.metrics.family_switches.labels(family=verdict.chosen).inc()
        self.metrics.policy_version.set(doc.version)
        log.info("evictor family selected (version %d): %s", doc.version, verdict.reason)
        return verdict

    def refit(self, *, manual: bool) -> RefitOutcome:
        """Snapshot, fit, guard, publish. Manual refits also release a rollback hold; a
        scheduled one with no access new since the last refit publishes nothing (with
        no traffic, only the censored ages grow: a new version each tick would reload
        every worker for no evidence). One runs at a time, and publishes only while this
        replica still holds the lease."""
        with self._refit_lock:
            return self._refit_once(manual=manual)

    def _refit_once(self, *, manual: bool) -> RefitOutcome:
        revision = self.window.revision
        if not manual and revision == self._refit_revision:
            said = f"unchanged: no new accesses since the last refit ({self._refit_said})"
            outcome = self._outcome("unchanged", None, said, 0.0)
        else:
            released = manual and self.store.held()
            outcome = self._refit(manual=manual)
            if self.last_fit is not None and self.last_fit.not_converged.count:
                words = self.last_fit.not_converged.words()
                outcome = replace(outcome, reason=f"{outcome.reason}; {words}")
            self._refit_revision = revision  # not on an exception: the next tick tries again
            self._refit_said = outcome.reason
            if released:
                reason = f"{outcome.reason}; the rollback hold is released"
                outcome = replace(outcome, reason=reason)
        self._last_refit = (outcome, time.time())
        return outcome

    def _refit(self, *, manual: bool) -> RefitOutcome:
        t0 = time.perf_counter()
        result = fit_all(self.window.snapshot(time.time()), self.settings)
        seconds = time.perf_counter() - t0
        self.metrics.refit_seconds.observe(seconds)
        self.metrics.fits_not_converged.set(result.not_converged.count)
        self.last_fit = result
        if manual:
            self.store.release_hold()
            self.memory.track(self.store)  # the hold's release known at once, as a publication is
        elif self.store.held():
            return self._outcome("held", None, REFITS_HELD, seconds)
        fitted = result.fitted
        if not fitted:
            return self._outcome(
                "skipped",
                None,
                f"skipped: {result.accesses:,} accesses seen, fewer than min_samples "
                f"({self.settings.min_samples:,})",
                seconds,
            )
        base, in_force = self.store.base(), self.store.current()
        change = max_relative_change(base.categories, fitted)
        # Unchanged only beside a document in force: one unreadable (refused, missing) is
        # published over, or the agents would keep the last they read for good.
        same = change < self.settings.change_threshold and set(fitted) <= set(base.categories)
        if same and in_force is not None:
            return self._outcome(
                "unchanged",
                None,
                f"unchanged: largest relative change {change:.3f} < change_threshold "
                f"{self.settings.change_threshold}",
                seconds,
            )
        verdict = self.shadow.guard(self.store.preview_fit(fitted, result.pooled), in_force)
        if verdict.outcome == "refused":
            return self._outcome("refused", None, verdict.reason, seconds)
        note = f"refit of {result.accesses:,} accesses ({_change_words(base.categories, fitted)})"
        if verdict.outcome != "off":
            note += f"; guard {verdict.reason}"
        if result.not_converged.count:
            note += f"; {result.not_converged.words()}"
        try:
            doc = self.store.publish_fit(
                fitted, result.pooled, note, fence=self.lease.confirm, unless_held=True
            )
        except LeaseLost as exc:
            return self._outcome("lost_lease", None, str(exc), seconds)
        except RefitsHeld as exc:  # a rollback with hold landed since the check above
            return self._outcome("held", None, str(exc), seconds)
        except PolicyLost as exc:
            return self._outcome("skipped", None, f"skipped: {exc}", seconds)
        self.shadow.set_policy(doc)
        self.metrics.policy_version.set(doc.version)
        return self._outcome("published", doc.version, f"published version {doc.version}", seconds)

    def _outcome(
        self, label: RefitOutcomeLabel, version: int | None, reason: str, s: float
    ) -> RefitOutcome:
        self.metrics.refits.labels(outcome=label).inc()
        return RefitOutcome(label == "published", version, reason, s)

    @guarded
    def refit_status(self) -> RefitStatus:
        """The last refit's outcome here (none on a standby: what it did while it led is
        old news) and whether refits are held (a Redis read)."""
        last, at = (self._last_refit if self.lease.is_leader else None) or (None, None)
        return RefitStatus(self.store.held(), last, at)

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
        current = self.store.current()
        fit = self.last_fit
        names = set(current.categories if current else ()) | set(fit.categories if fit else ())
        return [self._category_summary(n, current, fit) for n in sorted(names)]

    @guarded
    def category(self, name: str) -> CategoryDetail | None:
        current = self.store.current()
        fit = self.last_fit
        if (current is None or name not in current.categories) and (
            fit is None or name not in fit.categories
        ):
            return None
        curve = fit.cdf_points(name) if fit is not None else None
        return CategoryDetail(**vars(self._category_summary(name, current, fit)), cdf=curve)

    @staticmethod
    def _category_summary(
        name: str, current: PolicyDocument | None, fit: FitResult | None
    ) -> CategorySummary:
        published = current.categories.get(name) if current else None
        fitted = fit.categories.get(name) if fit else None
        return CategorySummary(
            name=name,
            samples=fitted.samples if fitted else (published.samples if published else 0),
            fitted=fitted,
            published=published,
            published_version=current.version if current and published else None,
            fit_quality=fitted.fit_quality if fitted else None,
        )

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
        # Categories no longer published leave the gauges instead of lingering as stale series.
        m.param.clear()
        m.samples.clear()
        if cur is not None:
            m.policy_version.set(cur.version)
            for name, p in cur.categories.items():
                for field in MODEL_PARAMS:
                    m.param.labels(category=name, param=field).set(getattr(p, field))
                m.samples.labels(category=name).set(p.samples)
        # Agents whose heartbeat expired leave the gauges instead of lingering as stale series.
        for gauge in (m.agent_evictor, m.agent_loop_unexpected_errors, *m.per_agent.values()):
            gauge.clear()
        m.agents_not_listed.set(listing.not_listed)
        m.heartbeats_refused.set(listing.refused)
        for a in listing.agents:
            if a.evictor:
                m.agent_evictor.labels(agent=a.id, family=a.evictor).set(1)
            for field, gauge in m.per_agent.items():
                gauge.labels(agent=a.id).set(getattr(a, field))
            for loop, errors in a.loop_unexpected_errors.items():
                m.agent_loop_unexpected_errors.labels(agent=a.id, loop=loop).set(errors)


def _change_words(old: dict[str, CategoryParams], new: dict[str, CategoryParams]) -> str:
    """What a refit changes, for its note: new categories, and the largest relative change
    of those fitted before (an unbounded change reads "inf" otherwise)."""
    added = len(set(new) - set(old))
    kept = {name: params for name, params in new.items() if name in old}
    words = [f"{added} new categor{'y' if added == 1 else 'ies'}"] if added else []
    if kept or not added:
        words.append(f"largest relative change {max_relative_change(old, kept):.3g}")
    return ", ".join(words)

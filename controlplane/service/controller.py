"""The controller process: wiring of lease, ingest, stats, refit jobs and the store.

Owns the controller's lifecycle and its background work: an APScheduler scheduler
(``coalesce``, ``max_instances=1``) runs the lease tick and the refit; the leader alone
runs the ingest thread and publishes. A standby replica serves reads and takes over
within one lease time. It must never parse HTTP (``controlplane.api.app``) or encode wire
data itself (``agent.wire``).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from dataclasses import dataclass

import redis
from apscheduler.schedulers.background import BackgroundScheduler
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from agent.policy_document import CategoryParams, PolicyDocument
from agent.wire import AgentStatus, EventBatch, Keys, WireError
from controlplane.fit import FitResult, fit_all
from controlplane.fit.gof import ReuseCurve
from controlplane.fit.reuse_window import ReuseStats
from controlplane.service.ingest import Ingestor
from controlplane.service.lease import LeaderLease
from controlplane.service.metrics import ControllerMetrics
from controlplane.service.settings import ControllerSettings
from controlplane.service.store import PolicyStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RefitOutcome:
    """What one refit did: published a version, or why not."""

    published: bool
    version: int | None
    reason: str
    seconds: float


@dataclass(frozen=True)
class CategorySummary:
    """One category as operators see it: the last fit beside the published parameters."""

    name: str
    samples: int
    fitted: CategoryParams | None
    published: CategoryParams | None
    published_version: int | None
    fit_quality: float | None


@dataclass(frozen=True)
class CategoryDetail(CategorySummary):
    """A summary with the empirical and fitted reuse-time CDF (None: no fit data)."""

    cdf: ReuseCurve | None


def redis_client(url: str, *, timeout_s: float = 5.0) -> redis.Redis:
    """A client with explicit retries: three tries with capped exponential backoff."""
    return redis.Redis.from_url(
        url,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), 3),
        retry_on_error=[redis.ConnectionError, redis.TimeoutError],
        health_check_interval=15,
    )


class Controller:
    def __init__(self, settings: ControllerSettings) -> None:
        self.settings = settings
        self.keys = Keys(settings.key_prefix)
        self.r = redis_client(settings.redis_url)
        self.metrics = ControllerMetrics()
        self.name = settings.consumer_name or f"{socket.gethostname()}-{os.getpid()}"
        self.store = PolicyStore(self.r, self.keys, settings.history_size)
        self.lease = LeaderLease(self.r, self.keys.leader, self.name, settings.lease_ttl_s)
        self.stats = ReuseStats(
            window_s=settings.window_s,
            near_concurrent_s=settings.near_concurrent_s,
            n_buckets=settings.window_buckets,
        )
        self._stats_lock = threading.Lock()
        self.last_fit: FitResult | None = None
        # Ingest blocks on XREADGROUP: its own client, with a timeout longer than the block.
        block_s = settings.ingest_block_ms / 1000
        self.ingestor = Ingestor(
            redis_client(settings.redis_url, timeout_s=block_s + 5),
            self.keys,
            self._apply,
            group=settings.consumer_group,
            consumer=self.name,
            count=settings.ingest_count,
            block_ms=settings.ingest_block_ms,
            reclaim_idle_ms=settings.reclaim_idle_ms,
            metrics=self.metrics,
        )
        self._ingest_stop = threading.Event()
        self._ingest_thread: threading.Thread | None = None
        self.scheduler = BackgroundScheduler(
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None}
        )

    # --- lifecycle -----------------------------------------------------------------------
    def start(self) -> None:
        self._tick_lease()
        self.scheduler.add_job(
            self._tick_lease, "interval", seconds=self.settings.lease_ttl_s / 3, id="lease"
        )
        self.scheduler.add_job(
            self._scheduled_refit, "interval", seconds=self.settings.refit_interval_s, id="refit"
        )
        self.scheduler.start()

    def stop(self) -> None:
        if self.scheduler.running:
            self.scheduler.shutdown(wait=True)
        self._stop_ingest()
        self.lease.release()

    def _tick_lease(self) -> None:
        was = self.lease.is_leader
        now = self.lease.tick()
        self.metrics.leader.set(1 if now else 0)
        if now and not was:
            log.info("%s is the leader", self.name)
            self._ensure_initial_policy()
            self._start_ingest()
        elif was and not now:
            log.warning("%s lost the leader lease", self.name)
            self._stop_ingest()

    def _ensure_initial_policy(self) -> None:
        try:
            if self.store.current_version() is None:
                self.store.publish_fit({}, None, "initial: built-in defaults until a fit")
        except redis.RedisError:
            log.exception("could not publish the initial policy")

    def _start_ingest(self) -> None:
        if self._ingest_thread is not None and self._ingest_thread.is_alive():
            return
        self._ingest_stop = threading.Event()
        self._ingest_thread = threading.Thread(
            target=self.ingestor.run, args=(self._ingest_stop,), name="kvwise-ingest", daemon=True
        )
        self._ingest_thread.start()

    def _stop_ingest(self) -> None:
        self._ingest_stop.set()
        if self._ingest_thread is not None:
            self._ingest_thread.join(timeout=self.settings.ingest_block_ms / 1000 + 10)
            self._ingest_thread = None

    # --- ingest -> stats ---------------------------------------------------------------
    def _apply(self, batch: EventBatch) -> None:
        with self._stats_lock:
            self.stats.ingest_batch(batch)

    # --- refit ---------------------------------------------------------------------------
    def _scheduled_refit(self) -> None:
        if not self.lease.is_leader:
            return
        try:
            outcome = self.refit(manual=False)
            log.info("refit: %s", outcome.reason)
        except redis.RedisError:
            self.metrics.refits.labels(outcome="error").inc()
            log.exception("refit failed: Redis unavailable")

    def refit(self, *, manual: bool) -> RefitOutcome:
        """Snapshot, fit, guard, publish. Manual refits also release a rollback hold."""
        t0 = time.perf_counter()
        with self._stats_lock:
            snapshot = self.stats.snapshot(time.time())
        result = fit_all(snapshot, self.settings)
        seconds = time.perf_counter() - t0
        self.metrics.refit_seconds.observe(seconds)
        self.last_fit = result
        if manual:
            self.store.release_hold()
        elif self.store.held():
            return self._outcome(
                "held", None, "held after a rollback; POST /v1/policy/refit", seconds
            )
        fitted = {k: p for k, p in result.categories.items() if p.source != "default"}
        if result.accesses < self.settings.min_samples or not fitted:
            return self._outcome(
                "skipped",
                None,
                f"{result.accesses} accesses seen, fewer than min_samples "
                f"({self.settings.min_samples})",
                seconds,
            )
        base = self.store.base()
        change = _max_relative_change(base.categories, fitted)
        if change < self.settings.change_threshold and set(fitted) <= set(base.categories):
            return self._outcome(
                "unchanged",
                None,
                f"largest relative change {change:.3f} < change_threshold "
                f"{self.settings.change_threshold}",
                seconds,
            )
        doc = self.store.publish_fit(fitted, result.pooled, f"refit of {result.accesses} accesses")
        self.metrics.policy_version.set(doc.version)
        return self._outcome("published", doc.version, f"published version {doc.version}", seconds)

    def _outcome(self, label: str, version: int | None, reason: str, s: float) -> RefitOutcome:
        self.metrics.refits.labels(outcome=label).inc()
        return RefitOutcome(label == "published", version, reason, s)

    # --- reads for the API -----------------------------------------------------------------
    def agents(self) -> list[AgentStatus]:
        out = []
        keys = list(self.r.scan_iter(match=self.keys.agents_match, count=500))
        for raw in self.r.mget(keys) if keys else []:
            if raw is None:
                continue  # expired between SCAN and MGET
            try:
                out.append(AgentStatus.from_json(raw))
            except WireError:
                log.warning("ignoring a malformed heartbeat")
        return sorted(out, key=lambda a: a.id)

    def categories(self) -> list[CategorySummary]:
        current = self.store.current()
        fit = self.last_fit
        names = set(current.categories if current else ()) | set(fit.categories if fit else ())
        return [self._category_summary(n, current, fit) for n in sorted(names)]

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
            published_version=current.version if current else None,
            fit_quality=fitted.fit_quality if fitted else None,
        )

    def ready(self) -> tuple[bool, str]:
        try:
            self.r.ping()
            if self.store.current_version() is None:
                return False, "no policy version published yet"
        except redis.RedisError as exc:
            return False, f"redis unavailable: {exc}"
        return True, ""

    def refresh_gauges(self) -> None:
        m = self.metrics
        try:
            cur = self.store.current()
            agents = self.agents()
            m.pending.set(self.ingestor.pending() if self.lease.is_leader else 0)
        except redis.RedisError:
            return
        if cur is not None:
            m.policy_version.set(cur.version)
            for name, p in cur.categories.items():
                for field in ("rate", "p_reuse", "life_s"):
                    m.param.labels(category=name, param=field).set(getattr(p, field))
                m.samples.labels(category=name).set(p.samples)
        # Agents whose heartbeat expired leave the gauges instead of lingering as stale series.
        for gauge in (m.agent_version, m.agent_staged_version, m.agent_hit_ratio, m.agent_dropped):
            gauge.clear()
        for a in agents:
            m.agent_version.labels(agent=a.id).set(a.applied_version)
            m.agent_staged_version.labels(agent=a.id).set(a.staged_version)
            m.agent_hit_ratio.labels(agent=a.id).set(a.hit_ratio)
            m.agent_dropped.labels(agent=a.id).set(a.events_dropped)


def _max_relative_change(old: dict[str, CategoryParams], new: dict[str, CategoryParams]) -> float:
    worst = 0.0
    for name, p in new.items():
        q = old.get(name)
        if q is None:
            return float("inf")
        for field in ("rate", "p_reuse", "life_s"):
            a, b = getattr(q, field), getattr(p, field)
            worst = max(worst, abs(a - b) / max(abs(a), 1e-12))
    return worst

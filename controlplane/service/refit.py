"""The refit: the window's snapshot fitted, judged by the guard and published, and the
evictor family selected from the shadow, on the leader.

Owns ``Refitter``: one refit at a time (scheduled or manual, under one lock); a scheduled
one with no access new since the last publishes nothing (``unchanged``), nor one held back
by a rollback (``held``), one short of ``min_samples`` (``skipped``), one whose parameters
moved less than ``change_threshold``, or one the guard refused; a manual one releases the
hold. Each ends as a ``RefitOutcome`` (counted by outcome) and a scheduled one that
publishes nothing, or raises, is said once per reason in a row. Publications are fenced by
the lease. Also ``RefitStatus``, what ``GET /v1/policy/refit`` answers. It must never
schedule itself (the controller's scheduler runs ``scheduled``), ingest, or write Redis
but through the store.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field, replace

import redis

from agent.policy_document import DEFAULT_FAMILY, CategoryParams
from agent.runtime.connection import describe_redis_error
from controlplane.fit import FitResult, fit_all
from controlplane.fit.per_category import max_relative_change
from controlplane.service.lease import LeaderLease
from controlplane.service.metrics import ControllerMetrics, RefitOutcomeLabel
from controlplane.service.policy_memory import PolicyMemory
from controlplane.service.settings import ControllerSettings
from controlplane.service.shadowing import ShadowLink
from controlplane.service.store import PolicyStore
from controlplane.service.store_terms import REFITS_HELD, LeaseLost, PolicyLost, RefitsHeld
from controlplane.service.window import LiveWindow
from controlplane.shadow.selection import SelectionView
from controlplane.told_once import ToldOnce

log = logging.getLogger(__name__)


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


@dataclass(eq=False)
class Refitter:
    """Refits and family selections of one controller (see the module's docstring)."""

    settings: ControllerSettings
    store: PolicyStore
    window: LiveWindow
    shadow: ShadowLink
    metrics: ControllerMetrics
    memory: PolicyMemory
    lease: LeaderLease
    """Publications are fenced by it (``confirm``); only its leader refits on schedule."""
    last_fit: FitResult | None = field(default=None, init=False)
    _last_refit: tuple[RefitOutcome, float] | None = field(default=None, init=False)
    _last_refusal: str = field(default="", init=False)
    _refit_failures_told: ToldOnce[type[Exception]] = field(default_factory=ToldOnce, init=False)
    _refit_revision: int = field(default=-1, init=False)
    """The window's revision at the last refit that ran through."""
    _refit_said: str = field(default="", init=False)
    """What the last refit that ran through said."""
    _refit_lock: threading.RLock = field(default_factory=threading.RLock, init=False)
    """One refit at a time: scheduled or manual."""

    def scheduled(self) -> None:
        """The scheduler's refit job: on the leader, select the family and refit; what
        publishes nothing, or fails, is said once per reason in a row, never raised."""
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
                f"unchanged: largest relative change "
                f"{shown_below(change, self.settings.change_threshold)} < change_threshold "
                f"{self.settings.change_threshold:g}",
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

    def status(self) -> RefitStatus:
        """The last refit's outcome here (none on a standby: what it did while it led is
        old news) and whether refits are held (a Redis read)."""
        last, at = (self._last_refit if self.lease.is_leader else None) or (None, None)
        return RefitStatus(self.store.held(), last, at)


def shown_below(value: float, bound: float) -> str:
    """``value`` (below ``bound``) to three significant digits, or as many more as it
    takes to read as below it: "0.050 < change_threshold 0.05" read as a contradiction."""
    for digits in range(3, 17):
        text = f"{value:.{digits}g}"
        if float(text) < bound:
            return text
    return repr(value)


def _change_words(old: dict[str, CategoryParams], new: dict[str, CategoryParams]) -> str:
    """What a refit changes, for its note: new categories, and the largest relative change
    of those fitted before (an unbounded change reads "inf" otherwise)."""
    added = len(set(new) - set(old))
    kept = {name: params for name, params in new.items() if name in old}
    words = [f"{added} new categor{'y' if added == 1 else 'ies'}"] if added else []
    if kept or not added:
        words.append(f"largest relative change {max_relative_change(old, kept):.3g}")
    return ", ".join(words)

"""What a replica remembers of the policy store, and how a leader puts it back into a Redis
that lost it.

Owns ``PolicyMemory``: the store's state as this replica last read it (each lease tick,
read whole only when the version in force or the hold changed) or itself published (the
store tells it at once), the highest version number it has seen published, and the
restore: a leader that finds no version in force waits ``restore_wait_s`` (the workers'
heartbeats come back meanwhile) and republishes what it remembers under a number after
every one it saw published and every one a worker reports holding, so a number once
published never names another document. With nothing remembered (a new install, or a
controller and its Redis restarted together) it publishes the built-in defaults at once,
numbered after every version a heartbeat in Redis reports holding (a worker whose
heartbeat is not back yet compares the document when the number returns). While a
remembered state waits to be restored, the store refuses every other change
(``PolicyLost``): one would publish over it. A ``current`` pointer the store refuses
(damaged) beside a readable kept version is written back at the leader's next tick (the
state in force published again): agents cannot follow it meanwhile. It must never fit,
ingest or decide who leads.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

import redis

from controlplane.service.agents import AgentView
from controlplane.service.store import PolicyStore
from controlplane.service.store_terms import StoreState

log = logging.getLogger(__name__)


class PolicyMemory:
    """The store's state as this replica knows it, and its restore after a loss."""

    def __init__(self, restore_wait_s: float) -> None:
        self.restore_wait_s = restore_wait_s
        self._state: StoreState | None = None
        self._highest_version = 0
        self._lock = threading.Lock()  # one writer of the two at a time
        self._lost_since: float | None = None  # when the leader found the policy gone

    @property
    def state(self) -> StoreState | None:
        """The store's state as this replica last read or published it (None: neither)."""
        return self._state

    @property
    def highest_version(self) -> int:
        """The highest version number this replica has seen published (0: none)."""
        return self._highest_version

    def remember(self, state: StoreState) -> None:
        """What this replica itself published (the store tells it after each publication),
        known at once: a Redis that restarts before the next lease tick loses none of it."""
        with self._lock:
            if self._state is None or state.version >= self._state.version:
                self._state = state  # a publication told late never replaces a newer one
            self._highest_version = max(self._highest_version, state.version)

    def track(self, store: PolicyStore) -> None:
        """Every replica, each lease tick: keep the store's state as last read, so that
        whichever leads can put it back. Under the lock that ``remember`` takes: a
        publication here while the state is read is known after the read, never under it."""
        try:
            with self._lock:
                version, known = store.current_version(), self._state
                if version is None:
                    return  # nothing to read, or the state was lost: keep what was known
                self._highest_version = max(self._highest_version, version)
                if known is None or known.version != version or known.held != store.held():
                    self._state = store.state()
        except redis.RedisError:
            pass  # said by the health; the next tick reads again
        except Exception as exc:  # a state that does not read must never stop the lease
            log.warning("policy state not read (%s): kept as last read", exc)

    def ensure(self, store: PolicyStore, agents: Callable[[], Iterable[AgentView]]) -> None:
        """A leader's tick: a version in force (its ``current`` pointer written back if it
        is refused, read as the newest readable kept version), or the remembered state
        restored (after the wait), or the built-in defaults when nothing is remembered."""
        try:
            if store.current_version() is not None:
                self._lost_since = None
                if store.pointer_refused:
                    store.rewrite_pointer()
                return
            if self._state is None:
                note = "initial: built-in defaults until a fit"
                store.publish_fit({}, None, note, after=self._highest_known(agents))
            else:
                self._restore(store, self._state, agents)
        except redis.RedisError:
            pass  # said by the health; the next leader tick tries again
        except Exception as exc:  # a state that does not restore: the defaults, next tick
            log.warning("policy state not restored (%s): the built-in defaults instead", exc)
            self._state = None

    def _highest_known(self, agents: Callable[[], Iterable[AgentView]]) -> int:
        """The highest version seen published here or reported held by a worker."""
        held = [max(a.applied_version, a.staged_version) for a in agents()]
        return max([self._highest_version, *held])

    def _restore(
        self, store: PolicyStore, known: StoreState, agents: Callable[[], Iterable[AgentView]]
    ) -> None:
        now = time.monotonic()
        if self._lost_since is None:
            self._lost_since = now
            log.warning(
                "Redis has lost kvwise's policy state (restarted empty?): restoring %s in "
                "%.0f s, once the workers have reported the versions they hold",
                known.describe(),
                self.restore_wait_s,
            )
        if now - self._lost_since < self.restore_wait_s:
            return
        after = self._highest_known(agents)
        self._lost_since = None
        doc = store.restore(known, after=after)
        if doc is not None:
            log.warning(
                "Redis had lost kvwise's policy state: v%d restores %s, as this replica last "
                "knew it (numbered after v%d, the highest version published or held)",
                doc.version,
                known.describe(),
                after,
            )

"""The policy subscriber thread: learn of new policy versions, fetch, validate, stage.

Owns the agent's view of the controller's ``current`` pointer. Pub/sub on
``Keys.policy_channel`` is a hint that makes a change arrive at once; polling
``Keys.policy_current`` every ``poll_interval_s`` is the guarantee. A version whose document
validates is staged (``staged_version``); the engine thread takes it at its next call into
the agent (``take``), so a swap never happens mid-step and an idle engine keeps it staged
until it works again. A document that fails validation is rejected, counted, reported and
never fetched again (versions are immutable); the policy in force stays. Without a
controller nothing is staged and the last good policy (or the built-in one) stays. It must
never be called from the engine thread except ``take``.
"""

from __future__ import annotations

import logging
import threading
import time

import redis
from redis.client import PubSub

from agent.policy_document import PolicyDocument
from agent.settings import AgentSettings
from agent.wire import Keys, WireError, decode_policy

log = logging.getLogger(__name__)

_PUBSUB_WAIT_S = 0.25
"""Longest wait for a pub/sub message, so ``close`` returns promptly."""


class PolicySubscriber:
    """Follows ``current``: stages every version it points to that validates."""

    def __init__(self, settings: AgentSettings, client: redis.Redis, *, applied: int = 0) -> None:
        self.settings = settings
        self.client = client
        self.keys = Keys(settings.key_prefix)
        self.known_version = applied
        """Version applied or staged last (what ``current`` is compared with)."""
        self.staged_version = applied
        """Version in force once the engine takes what is staged: the last one staged, or
        the one kept after a refusal (what the heartbeat reports as ``staged_version``)."""
        self.rejected = 0
        self.last_rejection = ""
        self.failures = 0
        """Consecutive failed polls (0 = connected)."""
        self._rejected_version: int | None = None
        self._pending: PolicyDocument | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def take(self) -> PolicyDocument | None:
        """The staged document, once (engine thread, between steps); None if none."""
        if self._pending is None:  # the common case: no lock
            return None
        with self._lock:
            doc, self._pending = self._pending, None
        return doc

    def check(self) -> PolicyDocument | None:
        """One poll: read ``current`` and stage its document if it is new and valid.
        Returns the staged document, if any. Raises ``redis.RedisError``."""
        raw_current = self.client.get(self.keys.policy_current)
        if raw_current is None:
            return None
        try:
            version = int(raw_current)
        except ValueError:
            self._reject(None, f"current is not a version number: {raw_current[:40]!r}")
            return None
        # Follow the pointer whichever way it moved: a rollback or a reset controller may
        # point at a lower version, and only ``current`` is authoritative.
        if version in (self.known_version, self._rejected_version):
            return None
        raw = self.client.get(self.keys.policy_doc(version))
        if raw is None:
            log.debug("kvwise subscriber: current points at v%d, which has no document", version)
            return None
        try:
            doc = decode_policy(raw)
            if doc.version != version:
                raise WireError(f"policy: document says version {doc.version}, key says {version}")
        except WireError as exc:
            self._reject(version, exc.reason)
            return None
        with self._lock:
            self._pending = doc
            self.known_version = version
            self.staged_version = version
        log.info("kvwise subscriber: staged policy v%d (%s)", version, doc.note or "no note")
        return doc

    def reject(self, version: int, reason: str, *, keep: int) -> None:
        """Reject a staged ``version`` after the fact (the evictor refused it); ``keep``
        is the version still in force."""
        with self._lock:
            self.known_version = keep
            self.staged_version = keep
        self._reject(version, reason)

    def _reject(self, version: int | None, reason: str) -> None:
        with self._lock:
            self.rejected += 1
            self._rejected_version = version
            self.last_rejection = f"v{version}: {reason}" if version is not None else reason
        log.warning(
            "kvwise subscriber: rejected policy %s; keeping v%d",
            self.last_rejection,
            self.known_version,
        )

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="kvwise-subscriber", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def close(self, timeout: float = 5.0) -> bool:
        """``stop`` and wait up to ``timeout`` s; False if a poll is still waiting on Redis."""
        self.stop()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                return False
            self._thread = None
        return True

    def _run(self) -> None:
        pubsub: PubSub | None = None
        next_poll = 0.0
        try:
            while not self._stop.is_set():
                if time.monotonic() >= next_poll:
                    if pubsub is None:
                        pubsub = self._subscribe()
                    self._poll()
                    next_poll = time.monotonic() + self.settings.poll_interval_s
                wait = min(max(next_poll - time.monotonic(), 0.0), _PUBSUB_WAIT_S)
                if pubsub is None:
                    self._stop.wait(wait)
                    continue
                try:
                    msg = pubsub.get_message(ignore_subscribe_messages=True, timeout=wait)
                except (redis.RedisError, OSError, ValueError):
                    # A dead pub/sub connection: polling carries on; resubscribe next poll.
                    pubsub.close()
                    pubsub = None
                    continue
                if msg is not None and msg.get("type") == "message":
                    self._poll()
        finally:
            if pubsub is not None:
                pubsub.close()

    def _subscribe(self) -> PubSub | None:
        pubsub: PubSub = self.client.pubsub(  # type: ignore[no-untyped-call]
            ignore_subscribe_messages=True
        )
        try:
            pubsub.subscribe(self.keys.policy_channel)
        except redis.RedisError:
            pubsub.close()
            return None
        return pubsub

    def _poll(self) -> None:
        try:
            self.check()
        except redis.RedisError as exc:
            if self.failures == 0:
                log.warning(
                    "kvwise subscriber: cannot reach Redis (%s); keeping v%d",
                    exc,
                    self.known_version,
                )
            self.failures += 1
            return
        if self.failures:
            log.info(
                "kvwise subscriber: Redis reachable again after %d failed polls", self.failures
            )
            self.failures = 0

"""The policy subscriber thread: learn of new policy versions, fetch, validate, stage.

Owns the agent's view of the controller's ``current`` pointer. Pub/sub on
``Keys.policy_channel`` is a hint that makes a change arrive at once; polling
``Keys.policy_current`` every ``poll_interval_s`` is the guarantee. A version whose document
validates is staged (``staged_version``); the engine thread takes it at its next call into
the agent (``take``), so a swap never happens mid-step and an idle engine keeps it staged
until it works again. A document that fails validation is rejected, counted, reported and
never fetched again (versions are immutable); the policy in force stays. Without a
controller nothing is staged and the last good policy (or the built-in one) stays. Once
``current`` has gone (a Redis restarted empty), the version it names next is fetched even if
its number is the one known or one refused: a restored store may name another document with
it, and the agent must never keep its own while reporting that number. It must never be
called from the engine thread except ``take``.
"""

from __future__ import annotations

import logging
import threading
import time

import redis
from redis.client import PubSub

from agent.policy_document import PolicyDocument
from agent.runtime.connection import RedisClient
from agent.runtime.loop import AgentLoop
from agent.settings import AgentSettings
from agent.wire import WIRE_SCHEMA_VERSION, WireError, decode_policy

log = logging.getLogger(__name__)

_PUBSUB_WAIT_S = 0.25
"""Longest wait for a pub/sub message, so ``close`` returns promptly."""
MAX_NOTICES_SKIPPED = 10_000
"""Notices already received that one poll answers, at most (a burst: one round trip)."""
MAX_POINTER_BYTES = 32
"""Bytes of ``current`` read, at most: a version number is far shorter."""
MAX_REJECTION_CHARS = 400
"""Characters of a rejection's reason kept (logged and sent in every heartbeat): an
evictor's error may be of any length."""


class PolicySubscriber(AgentLoop):
    """Follows ``current``: stages every version it points to that validates."""

    def __init__(self, settings: AgentSettings, client: RedisClient, *, applied: int = 0) -> None:
        super().__init__("subscriber", settings, client, interval_s=settings.poll_interval_s)
        self.known_version = applied
        """Version applied or staged last (what ``current`` is compared with)."""
        self.staged_version = applied
        """Version in force once the engine takes what is staged: the last one staged, or
        the one kept after a refusal (what the heartbeat reports as ``staged_version``)."""
        self._known: PolicyDocument | None = None
        """The document of ``known_version``, when this subscriber staged it."""
        self._current_lost = False
        """``current`` went missing since ``known_version``: compare what it names next."""
        self.rejected = 0
        self.last_rejection = ""
        self._refused: bytes | None = None
        """What ``current`` held when a document was last refused (reported once)."""
        self._missing = False
        """That refusal was of a missing document: fetch it again at each poll."""
        self._pending: PolicyDocument | None = None
        self._lock = threading.Lock()
        self._pubsub: PubSub | None = None
        self._schema1_told = False

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
        # Bounded like the documents: a version number is a few digits, and a bogus value
        # of any size costs one short read per poll. Empty: no key (or an empty value).
        try:
            raw_current = self.client.getrange(self.keys.policy_current, 0, MAX_POINTER_BYTES - 1)
        except redis.ResponseError as exc:
            key = self.keys.policy_current
            self._refuse_another_type(exc, key, key.encode(), None, "a version number")
            return None
        if not raw_current:
            self._current_lost = self.known_version > 0
            # A store that comes back may hold another document under a refused number.
            self._refused = None
            self._notice_schema1_controller()
            return None
        pointer = raw_current if isinstance(raw_current, bytes) else raw_current.encode()
        try:
            version = int(pointer)
        except ValueError:
            self._refuse(pointer, None, f"current is not a version number: {pointer[:40]!r}")
            return None
        pointer = str(version).encode()  # as ``reject`` spells it (``07`` is ``7``)
        # Follow the pointer whichever way it moved: a rollback or a reset controller may
        # point at a lower version, and only ``current`` is authoritative. A refused
        # document is never fetched again (versions are immutable); a missing one is.
        same = version == self.known_version
        if (same and not self._current_lost) or (pointer == self._refused and not self._missing):
            return None
        raw = self._fetch(pointer, version)
        if raw is None:
            return None
        s = self.settings
        try:
            doc = decode_policy(
                raw, max_bytes=s.max_policy_bytes, max_categories=s.max_policy_categories
            )
            if doc.version != version:
                raise WireError(f"policy: document says version {doc.version}, key says {version}")
        except WireError as exc:
            self._refuse(pointer, version, exc.reason)
            return None
        if same and not self._another_under_the_known_number(doc):
            return None
        with self._lock:
            self._pending, self._known = doc, doc
            self.known_version = version
            self.staged_version = version
            self._refused, self._missing, self._current_lost = None, False, False
        log.info("kvwise subscriber: staged policy v%d (%s)", version, doc.note or "no note")
        return doc

    def _fetch(self, pointer: bytes, version: int) -> bytes | None:
        """The document of ``version``, or None once refused (missing, too large, not a
        string). One read of at most ``max_policy_bytes`` + 1 bytes: a document that grows
        while it is read is never brought in whole."""
        key, limit = self.keys.policy_doc(version), self.settings.max_policy_bytes
        try:
            raw = self.client.getrange(key, 0, limit)  # a byte more than the limit: too large
            # Its whole size, for the reason (asked only then; at least what was read).
            size = max(len(raw), self.client.strlen(key) if len(raw) > limit else 0)
        except redis.ResponseError as exc:
            self._refuse_another_type(exc, key, pointer, version, "a document")
            return None
        if size > limit:
            self._refuse(pointer, version, f"policy: document of {size} bytes > limit "
                         f"{limit} (not read)")  # fmt: skip
            return None
        if not raw:  # GETRANGE answers a missing key (or an empty value) with nothing
            self._refuse(pointer, version, "current points at a missing document", missing=True)
            return None
        return raw if isinstance(raw, bytes) else raw.encode()

    def _refuse_another_type(
        self,
        exc: redis.ResponseError,
        key: str,
        pointer: bytes,
        version: int | None,
        expected: str,
    ) -> None:
        """Refuse ``key`` if ``exc`` says it holds another type than a string (named);
        re-raise any other error."""
        if not str(exc).startswith("WRONGTYPE"):
            raise exc
        self._refuse(pointer, version, f"{key} is a {self._type_of(key)}, not {expected}")

    def _type_of(self, key: str) -> str:
        """The Redis type ``key`` holds (``none`` if absent)."""
        held = self.client.type(key)
        return held.decode() if isinstance(held, bytes) else str(held)

    def _another_under_the_known_number(self, doc: PolicyDocument) -> bool:
        """Whether ``doc``, under the number known, after ``current`` was lost, is another
        document than the one known (said once); the question is then settled."""
        self._current_lost = False
        if doc == self._known:
            return False
        log.warning(
            "kvwise subscriber: v%d came back as another document (Redis lost its state?): "
            "staging it (%s)",
            doc.version,
            doc.note or "no note",
        )
        return True

    def _notice_schema1_controller(self) -> None:
        """Say once if an older controller (untagged keys) is publishing: otherwise this
        agent would wait for a policy in silence. Its key is asked for its type only (a
        bounded answer, whatever the key holds); another type than a string is no such
        controller: said once, with the type, and not asked again."""
        if self._schema1_told:
            return
        key = self.keys.schema1_policy_current
        held = self._type_of(key)
        if held == "none":
            return
        self._schema1_told = True
        if held != "string":
            log.warning(
                "kvwise subscriber: %s is a %s, not a schema-1 controller's current: ignored",
                key,
                held,
            )
            return
        log.error(
            "kvwise subscriber: a controller of an older release (wire schema 1) publishes "
            "under %s; this agent speaks schema %d: run the same kvwise release on both",
            key,
            WIRE_SCHEMA_VERSION,
        )

    def reject(self, version: int, reason: str, *, keep: int) -> None:
        """Reject a staged ``version`` after the fact (the evictor refused it); ``keep``
        is the version still in force. A newer version staged meanwhile stays staged."""
        with self._lock:
            if self.known_version == version:
                self.known_version, self._known = keep, None
            if self.staged_version == version:
                self.staged_version = keep
        self._refuse(str(version).encode(), version, reason)

    def _refuse(
        self, pointer: bytes, version: int | None, reason: str, *, missing: bool = False
    ) -> None:
        """Count and report a refusal once per document (not once per poll)."""
        with self._lock:
            again = pointer == self._refused
            self._refused, self._missing = pointer, missing
            if again:
                return
            self.rejected += 1
            said = f"v{version}: {reason}" if version is not None else reason
            self.last_rejection = said[:MAX_REJECTION_CHARS]
        log.warning(
            "kvwise subscriber: rejected policy %s; keeping v%d",
            self.last_rejection,
            self.known_version,
        )

    # --- the loop ------------------------------------------------------------------------
    def step(self) -> None:
        """Subscribe if not yet, then poll ``current`` once."""
        if self._pubsub is None:
            self._pubsub = self._subscribe()
        self.check()

    def outage_note(self) -> str:
        return f"keeping v{self.known_version}"

    def pause(self, seconds: float) -> None:
        """Wait for a pub/sub notice (then poll at once) or ``seconds``, whichever first."""
        deadline = time.monotonic() + seconds
        while not self.stopping:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            if self._pubsub is None:
                super().pause(left)
                return
            try:
                msg = self._pubsub.get_message(
                    ignore_subscribe_messages=True, timeout=min(left, _PUBSUB_WAIT_S)
                )
                if msg is not None and msg.get("type") == "message":
                    self._skip_received_notices(self._pubsub)
                    return
            except (redis.RedisError, OSError, ValueError):
                # A dead pub/sub connection: polling carries on; resubscribe next round.
                self._close_pubsub()

    @staticmethod
    def _skip_received_notices(pubsub: PubSub) -> None:
        """Read the notices already received (``MAX_NOTICES_SKIPPED`` at most): the one
        poll that follows answers them all, so a burst costs one round trip, not one per
        notice."""
        for _ in range(MAX_NOTICES_SKIPPED):
            if pubsub.get_message(ignore_subscribe_messages=True, timeout=0) is None:
                return

    def finish(self) -> None:
        self._close_pubsub()

    def _close_pubsub(self) -> None:
        if self._pubsub is not None:
            self._pubsub.close()
            self._pubsub = None

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

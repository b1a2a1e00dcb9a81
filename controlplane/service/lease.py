"""Leader lease in Redis: only one controller replica refits and publishes at a time.

Owns acquiring, renewing and releasing one key. Acquire and renew are one compare-and-set
script (take the key when it is absent, extend it when it holds this replica's name), so a
replica never extends a lease it lost, and a retried call whose first reply was lost still
finds the lease its own; release is another, so it never drops a lease it lost; and the
read (``confirm``) that fences a leader's publication. A standby
replica keeps trying and takes over within one lease time of the leader's death. It must
never decide anything else.
"""

from __future__ import annotations

import threading

import redis

from agent.runtime.connection import RedisClient
from agent.runtime.loop import RedisObserver

_ACQUIRE_OR_RENEW = """
local holder = redis.call('GET', KEYS[1])
if holder == false then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
if holder == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


class LeaderLease:
    def __init__(
        self,
        client: RedisClient,
        key: str,
        holder: str,
        ttl_s: float,
        *,
        observer: RedisObserver | None = None,
    ) -> None:
        """The lease is ``key`` in ``client``'s Redis, holding ``holder`` (this replica's
        name, unique to its process) for ``ttl_s`` from each renewal (whole milliseconds, at
        least 1); ``observer`` is told whether each ``tick`` reached Redis."""
        self.r = client
        self.observer = observer
        self.key = key
        self.holder = holder
        self.ttl_ms = max(1, int(ttl_s * 1000))
        self._acquire_or_renew = client.register_script(_ACQUIRE_OR_RENEW)
        self._release = client.register_script(_RELEASE)
        self._lock = threading.Lock()
        self._leader = False

    @property
    def is_leader(self) -> bool:
        return self._leader

    def tick(self) -> bool:
        """Acquire or renew; call at least three times per lease time. Returns leadership."""
        with self._lock:
            try:
                held = self._acquire_or_renew(keys=[self.key], args=[self.holder, self.ttl_ms])
                self._leader = bool(held)
            except redis.RedisError as exc:
                # Unreachable Redis: assume the lease may be lost; a standby may take it.
                self._leader = False
                if self.observer is not None:
                    self.observer.failed(exc)
                return False
            if self.observer is not None:
                self.observer.answered()
            return self._leader

    def confirm(self) -> bool:
        """Whether the key holds this replica's name now (one read): the fence a leader's
        publication passes right before its transaction, so a refit that ran across a
        lost lease does not publish over the new leader's."""
        return self.holder_now() == self.holder

    def holder_now(self) -> str | None:
        raw = self.r.get(self.key)
        if raw is None:
            return None
        return raw.decode() if isinstance(raw, bytes) else str(raw)

    def release(self, client: RedisClient | None = None) -> bool:
        """Give the lease up (through ``client``, else the lease's own); False only where
        this replica led and Redis did not take the release (the key then expires after
        its TTL)."""
        with self._lock:
            released = True
            if self._leader:
                try:
                    self._release(keys=[self.key], args=[self.holder], client=client)
                except redis.RedisError:
                    released = False
            self._leader = False
            return released

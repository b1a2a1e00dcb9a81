"""Leader lease in Redis: only one controller replica refits and publishes at a time.

Owns acquiring, renewing and releasing one key (``SET NX PX``; renew and release are
compare-and-set scripts, so a replica never extends or drops a lease it lost). A standby
replica keeps trying and takes over within one lease time of the leader's death. It must
never decide anything else.
"""

from __future__ import annotations

import contextlib
import threading

import redis

_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
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
    def __init__(self, client: redis.Redis, key: str, holder: str, ttl_s: float) -> None:
        self.r = client
        self.key = key
        self.holder = holder
        self.ttl_ms = max(1, int(ttl_s * 1000))
        self._renew = client.register_script(_RENEW)
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
                if self._leader and self._renew(keys=[self.key], args=[self.holder, self.ttl_ms]):
                    return True
                self._leader = bool(self.r.set(self.key, self.holder, nx=True, px=self.ttl_ms))
            except redis.RedisError:
                # Unreachable Redis: assume the lease may be lost; a standby may take it.
                self._leader = False
            return self._leader

    def holder_now(self) -> str | None:
        raw = self.r.get(self.key)
        if raw is None:
            return None
        return raw.decode() if isinstance(raw, bytes) else str(raw)

    def release(self) -> None:
        with self._lock:
            if self._leader:
                with contextlib.suppress(redis.RedisError):
                    self._release(keys=[self.key], args=[self.holder])
            self._leader = False

"""Leader lease against a real Redis: exactly one holder; takeover after the holder dies."""

from __future__ import annotations

import time

import pytest
import redis

from controlplane.service.lease import LeaderLease

pytestmark = pytest.mark.integration


def test_exactly_one_leader_and_takeover_within_the_lease_time(
    redis_url: str, key_prefix: str
) -> None:
    r = redis.Redis.from_url(redis_url)
    key = key_prefix + "leader"
    a = LeaderLease(r, key, "a", ttl_s=0.6)
    b = LeaderLease(r, key, "b", ttl_s=0.6)
    assert a.tick() is True
    assert b.tick() is False
    assert a.tick() is True  # renewing keeps it
    assert a.holder_now() == "a"
    # "a" dies: stops renewing. "b" must take over within one lease time.
    died = time.monotonic()
    while not b.tick():
        assert time.monotonic() - died < 0.6 + 0.5, "standby did not take over in time"
        time.sleep(0.05)
    assert b.holder_now() == "b"
    # The old leader learns it lost the lease on its next tick and cannot renew it back.
    assert a.tick() is False
    assert b.is_leader and not a.is_leader


def test_release_hands_over_at_once(redis_url: str, key_prefix: str) -> None:
    r = redis.Redis.from_url(redis_url)
    key = key_prefix + "leader"
    a = LeaderLease(r, key, "a", ttl_s=30)
    b = LeaderLease(r, key, "b", ttl_s=30)
    assert a.tick()
    a.release()
    assert b.tick()
    # Releasing a lease one does not hold leaves the holder alone.
    a.release()
    assert b.holder_now() == "b"

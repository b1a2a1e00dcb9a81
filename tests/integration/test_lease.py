"""Leader lease against a real Redis: exactly one holder; takeover after the holder dies."""

from __future__ import annotations

import pytest
import redis

from controlplane.service.lease import LeaderLease
from tests.waiting import wait_until

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
    wait_until(b.tick, timeout=0.6 + 0.5, what="the standby to take over", every=0.05)
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


def test_a_lease_set_whose_reply_was_lost_is_still_ours(redis_url: str, key_prefix: str) -> None:
    """Acquire was a plain SET NX that the client retries on a timeout: when the first SET
    took and its reply was lost, the retry failed and the replica thought it did not lead
    while the key held its name, so nobody led for up to a lease time."""
    r = redis.Redis.from_url(redis_url)
    key = key_prefix + "leader"
    r.set(key, "a", px=30_000)  # the first SET of "a" took; its reply never came
    a = LeaderLease(r, key, "a", ttl_s=30)
    assert a.tick() is True
    assert a.holder_now() == "a" and 0 < r.pttl(key) <= 30_000


def test_two_live_processes_of_one_name_never_both_lead(redis_url: str, key_prefix: str) -> None:
    """Acquire-or-renew accepts a key that already holds our holder value: were that the
    bare consumer name, a second process of the same name would lead beside the first."""
    from controlplane.service.controller import Controller
    from controlplane.service.settings import ControllerSettings

    settings = ControllerSettings(
        redis_url=redis_url, key_prefix=key_prefix, consumer_name="same", lease_ttl_s=30
    )
    first, second = Controller(settings), Controller(settings)
    assert first.lease.tick() and not second.lease.tick()
    assert first.lease.holder_now() == first.lease.holder != second.lease.holder
    assert first.lease.holder.startswith("same/")

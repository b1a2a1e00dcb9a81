"""The instances hash's records (``AgentInstance``) and their judgement: processes beating
side by side for over the grace are counted, a restart never is, stale records are named
for removal, whatever the order of the hash."""

from __future__ import annotations

import pytest

from agent.wire import MAX_INSTANCE_BYTES, AgentInstance, WireError
from controlplane.service.agent_instances import GRACE_S, STALE_SLACK_S, judge

NOW = 1_765_000_000.0
"""The newest beat of the hashes below (an agent's clock)."""


def beating(since_s: float, last_beat_s: float = 0.0, interval_s: float = 5.0) -> AgentInstance:
    """A process started ``since_s`` before ``NOW`` whose last beat was ``last_beat_s``
    before it."""
    return AgentInstance(NOW - since_s, NOW - last_beat_s, interval_s)


def test_a_record_reads_back_as_written() -> None:
    record = AgentInstance(1_765_000_000.125, 1_765_000_042.5, 5.0)
    raw = record.to_field().encode()
    assert len(raw) <= MAX_INSTANCE_BYTES
    assert AgentInstance.from_field(raw) == record


@pytest.mark.parametrize(
    "raw",
    [
        b"banana",
        b"1 2",
        b"1 2 3 4",
        b"nan 2 3",
        b"1 inf 3",
        b"5 1 3",  # started after its last beat
        b"1 2 0",  # no period
        b"1 2 -5",
        b"1 2 \xff",
        b"9" * (MAX_INSTANCE_BYTES + 1),
    ],
)
def test_a_record_of_another_form_is_refused(raw: bytes) -> None:
    with pytest.raises(WireError, match="agent instance"):
        AgentInstance.from_field(raw)


def test_one_process_is_no_conflict() -> None:
    assert judge({b"a": beating(3600)}) == (0, ())
    assert judge({}) == (0, ())


def test_two_processes_beating_together_past_the_grace_count_two() -> None:
    together = {b"a": beating(3600), b"b": beating(GRACE_S + 1, last_beat_s=0.5)}
    assert judge(together) == (2, ())


def test_two_processes_together_for_the_grace_or_less_are_not_yet_a_conflict() -> None:
    assert judge({b"a": beating(3600), b"b": beating(GRACE_S)}) == (0, ())


def test_a_restart_is_not_a_conflict_and_the_old_record_is_stale() -> None:
    """The old process stopped as the new one started (its last beat a little after the
    new one's first: a closing beat), then two periods and the slack passed."""
    old = beating(3600, last_beat_s=GRACE_S - 5)
    new = beating(GRACE_S)
    assert judge({b"old": old, b"new": new}) == (0, (b"old",))


def test_an_old_record_is_stale_only_past_two_of_its_own_periods() -> None:
    limit = 2 * 5.0 + STALE_SLACK_S
    assert judge({b"a": beating(60), b"b": beating(60, last_beat_s=limit - 0.1)}) == (2, ())
    assert judge({b"a": beating(60), b"b": beating(60, last_beat_s=limit + 0.1)}) == (0, (b"b",))
    slow = beating(600, last_beat_s=limit + 10, interval_s=30.0)  # beats every 30 s
    assert judge({b"a": beating(600), b"slow": slow}) == (2, ())


def test_three_processes_count_three_and_a_stopped_fourth_is_stale() -> None:
    live = {e: beating(120) for e in (b"a", b"b", b"c")}
    assert judge(live | {b"d": beating(900, last_beat_s=300)}) == (3, (b"d",))


def test_a_process_beside_one_pair_only_briefly_is_not_counted() -> None:
    """Two long-lived processes, and a third started 10 s ago (a restart of one of them,
    whose old record is still fresh): the pair counts, the newcomer not yet."""
    hash_ = {b"a": beating(600), b"b": beating(600), b"c": beating(10)}
    assert judge(hash_) == (2, ())


def test_the_heartbeat_is_the_newest_beat_where_no_record_read_is_live() -> None:
    """A hash of crashed starts whose live process's record was past the fields read: the
    id's heartbeat (written by a live process) makes them stale, not alive together."""
    crashed = {e: beating(90, last_beat_s=50 + i) for i, e in enumerate((b"a", b"b"))}
    assert judge(crashed) == (2, ())  # the two overlapped, by each other alone
    assert judge(crashed, heartbeat_at=NOW) == (0, (b"a", b"b"))

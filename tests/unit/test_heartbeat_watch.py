"""The heartbeat watch: two agents beating under one worker id are flagged from the starts
successive reads show (A, B, A again), a restart (A, then B) never is, and at the
controller's own read cadence the back-and-forth is seen although each read shows only the
agent that beat last.

The cadence tests model the heartbeat key (synthetic beat times: each agent beats every
``heartbeat_interval_s`` plus a millisecond for its write) and read it at the times the
controller's shadow job runs, as APScheduler's trigger gives them."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from apscheduler.triggers.interval import IntervalTrigger

from agent.wire import AgentStatus
from controlplane.service.controller import SHADOW_JITTER_S, SHADOW_REFRESH_S
from controlplane.service.heartbeat_watch import (
    GRACE_S,
    HOLD_S,
    STARTS_KEPT,
    Flag,
    HeartbeatWatch,
)


class Clock:
    """The watch's clock, moved by the test."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def beat(started_at: float, worker: str = "w1") -> AgentStatus:
    return AgentStatus(id=worker, engine="sim", capacity=10, started_at=started_at)


def reads(watch: HeartbeatWatch, clock: Clock, starts: str, every_s: float) -> dict[str, Flag]:
    """One read per letter of ``starts`` (each letter one agent start), ``every_s`` apart;
    the flags of the last."""
    flags: dict[str, Flag] = {}
    for letter in starts:
        clock.now += every_s
        flags = watch.observe([beat(float(ord(letter)))])
    return flags


def test_a_restart_is_not_flagged() -> None:
    clock = Clock()
    watch = HeartbeatWatch(clock)
    assert reads(watch, clock, "A" * 20 + "B" * 200 + "C" * 20, every_s=5) == {}


def test_the_old_agents_last_beat_after_the_new_ones_first_is_a_restart() -> None:
    """A closing agent writes a last beat, which may land after its successor's first:
    the starts interleave for seconds, not for ``GRACE_S``."""
    clock = Clock()
    watch = HeartbeatWatch(clock)
    assert reads(watch, clock, "AAAABABBBBBBBBBBBBBB", every_s=GRACE_S / 4) == {}


def test_two_agents_taking_turns_are_flagged_though_reads_show_one_many_times_running() -> None:
    clock = Clock()
    watch = HeartbeatWatch(clock)
    flags = reads(watch, clock, "AAAABBBBBBBBBBBB", every_s=5)  # 60 s of B: still a restart
    assert flags == {}
    flags = reads(watch, clock, "A", every_s=5)  # A again: it beat on long after B started
    assert flags == {"w1": Flag(agents=2, holds_s=HOLD_S - 5)}


def test_one_sighting_of_the_other_agent_is_enough_once_the_first_beats_on() -> None:
    """An agent that beats just after the other is seen rarely: B seen once amid A's,
    then A for ``GRACE_S`` more, is two agents (B did not replace A)."""
    clock = Clock()
    watch = HeartbeatWatch(clock)
    assert reads(watch, clock, "AAAB" + "A" * 5, every_s=5) == {}  # 25 s: maybe A's last beat
    assert reads(watch, clock, "A", every_s=5)["w1"].agents == 2


def test_the_flag_holds_while_both_are_seen_and_falls_once_one_is_not_for_the_hold() -> None:
    clock = Clock()
    watch = HeartbeatWatch(clock)
    reads(watch, clock, "ABBBBBBBBA", every_s=5)
    assert reads(watch, clock, "A" * int(HOLD_S / 5 - 1), every_s=5)["w1"].agents == 2
    assert reads(watch, clock, "AA", every_s=5) == {}  # B unseen for the hold: gone


def test_three_agents_count_three_and_other_workers_are_apart() -> None:
    clock = Clock()
    watch = HeartbeatWatch(clock)
    for letter in "ABCABCABCABCABC":
        clock.now += 5
        flags = watch.observe([beat(float(ord(letter))), beat(1.0, worker="w2")])
    assert flags == {"w1": Flag(agents=3, holds_s=HOLD_S - 10)}


def test_memory_is_bounded_per_worker_and_workers_gone_are_forgotten() -> None:
    clock = Clock()
    watch = HeartbeatWatch(clock)
    for i in range(1_000):  # a crash loop: a new start every read
        clock.now += 5
        assert watch.observe([beat(float(i))]) == {}
    assert len(watch.workers["w1"].starts) == STARTS_KEPT
    watch.observe([beat(1.0, worker="w2")])
    assert list(watch.workers) == ["w2"]


# --- the controller's cadence ------------------------------------------------------------
BEAT_S = 5.0
"""The agents' default heartbeat period (``heartbeat_interval_s``)."""
WRITE_S = 0.001
"""What one beat's write adds to an agent's period (the loop waits the interval after it)."""


@pytest.fixture
def seeded() -> Iterator[None]:
    """APScheduler's jitter draws from ``random``: seeded here, restored after."""
    state = random.getstate()
    random.seed(20261207)
    yield
    random.setstate(state)


START = datetime(2026, 1, 1, tzinfo=UTC)


def job_trigger(seconds: float, jitter: float | None = None) -> IntervalTrigger:
    """A job's trigger as the controller's scheduler makes it, started at ``START``."""
    return IntervalTrigger(seconds=seconds, jitter=jitter, start_date=START)


def read_times(trigger: IntervalTrigger, span_s: float) -> list[float]:
    """The times (s from its start date) ``trigger`` fires at within ``span_s``."""
    start = trigger.start_date
    fire = trigger.get_next_fire_time(None, start)
    out: list[float] = []
    while fire is not None and (t := (fire - start).total_seconds()) < span_s:
        out.append(t)
        fire = trigger.get_next_fire_time(fire, fire)
    return out


def last_writer(t: float, offsets: list[float]) -> int:
    """Which agent (by its first beat's time) wrote the heartbeat key last before ``t``."""
    period = BEAT_S + WRITE_S
    last = [o + math.floor((t - o) / period) * period for o in offsets]
    return max(range(len(offsets)), key=lambda i: last[i])


def first_flag_s(trigger: IntervalTrigger, offsets: list[float], span_s: float) -> float:
    """When reads by ``trigger`` of the key two agents beat into first flag it (inf: not
    within ``span_s``)."""
    clock = Clock()
    watch = HeartbeatWatch(clock)
    for t in read_times(trigger, span_s):
        clock.now = t
        if watch.observe([beat(float(last_writer(t, offsets)))]):
            return t
    return math.inf


@pytest.mark.parametrize("second", [0.25, 1.0, 2.5, 4.75])
def test_the_shadow_jobs_reads_see_two_agents_take_turns_within_minutes(
    seeded: None, second: float
) -> None:
    """Two agents beating every 5 s, the second ``second`` s after the first (each read
    then shows the first with a chance of ``second / 5``): the shadow job's reads (5 s on
    average, at random times) flag them within 5 minutes."""
    trigger = job_trigger(SHADOW_REFRESH_S / 2, SHADOW_JITTER_S)
    assert first_flag_s(trigger, [0.0, second], span_s=300) < 300


def test_reads_in_step_with_the_beats_never_see_the_other_agent(seeded: None) -> None:
    """Why the job's reads have no fixed phase: every 5 s sharp, as the agents beat, each
    read shows the same agent for hours."""
    in_step = job_trigger(BEAT_S)
    assert first_flag_s(in_step, [0.0, 2.5], span_s=3 * 3600) == math.inf


def test_a_restart_is_not_flagged_at_the_jobs_cadence(seeded: None) -> None:
    """One agent, then its successor: never flagged, whatever the reads' times."""
    trigger = job_trigger(SHADOW_REFRESH_S / 2, SHADOW_JITTER_S)
    clock = Clock()
    watch = HeartbeatWatch(clock)
    for t in read_times(trigger, 3600):
        clock.now = t
        assert watch.observe([beat(1.0 if t < 1800 else 2.0)]) == {}

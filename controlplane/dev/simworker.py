"""A simulated inference worker: replays a trace in real time through a live ``Agent``.

Owns the real-time schedule (trace time divided by ``speed``, optionally looped with the
time shifted each round) and the mapping of the replay semantics of
``controlplane.replay.engine`` onto the agent's engine hooks: the longest cached prefix is
the request's hits, cached blocks are touched, every block is freed tail first, the cache
evicts down to capacity, and a staged policy is applied between requests. Events carry the
schedule's time in unix seconds, so fitted rates are in wall-clock seconds. It must never
parse arguments or print (``controlplane.cli.worker_cmd`` does).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from itertools import compress
from typing import Protocol

from agent.runtime.agent import Agent
from agent.wire import AgentStatus
from controlplane.traces.model import Trace


@dataclass(frozen=True)
class WorkerProgress:
    """Where a simulated worker stands; also its final result."""

    agent: AgentStatus
    """The agent's own counters, as its heartbeat reports them."""
    policy: str
    requests: int
    """Requests replayed, over all loops."""
    trace_requests: int
    loops: int
    """Completed passes over the trace."""
    lag_s: float
    """How far the replay runs behind its schedule (wall clock)."""
    seconds: float

    def to_json(self) -> dict[str, object]:
        """The agent's counters and the replay's, in one flat object; the worker's id is
        its ``worker`` field alone (the heartbeat's ``id`` is not repeated)."""
        counters = {k: v for k, v in asdict(self.agent).items() if k != "id"}
        replay = {k: v for k, v in asdict(self).items() if k != "agent"}
        return {"worker": self.agent.id, **counters, **replay}


ProgressFn = Callable[[WorkerProgress], None]


class StopSignal(Protocol):
    """What stops a replay: ``threading.Event`` is one."""

    def is_set(self) -> bool: ...

    def wait(self, timeout: float | None = None) -> bool: ...


class TraceWorker:
    """Replays ``trace`` through ``agent`` until the end (or forever with ``loop``) or until
    ``stop`` is set."""

    def __init__(
        self,
        agent: Agent,
        trace: Trace,
        *,
        speed: float = 1.0,
        loop: bool = False,
        stop: StopSignal | None = None,
        policy_name: str = "",
    ) -> None:
        if speed <= 0:
            raise ValueError(f"speed must be > 0, got {speed}")
        if trace.n_requests == 0:
            raise ValueError("the trace has no requests")
        self.agent = agent
        self.trace = trace
        self.speed = speed
        self.loop = loop
        self.stop = stop or threading.Event()
        self.policy_name = policy_name or type(agent.policy).__name__
        # Per-request Python values once: the loop below runs per request.
        self._hashes = trace.hashes[trace.blocks]
        self._offsets = trace.offsets.tolist()
        self._cats = [trace.category_names[c] for c in trace.categories.tolist()]
        ts = trace.timestamps
        self._rel = (ts - ts[0]).tolist()
        span = float(ts[-1] - ts[0])
        # The next round starts one mean inter-arrival gap after the last request.
        self._period = span + (span / (trace.n_requests - 1) if trace.n_requests > 1 else 1.0)
        self.requests = 0
        self.loops = 0
        self.lag_s = 0.0
        self._t_start = time.monotonic()

    def run(self, progress: ProgressFn | None = None, every_s: float = 5.0) -> WorkerProgress:
        """Replay; call ``progress`` about every ``every_s`` seconds. Returns where it
        stopped (the agent is left open: closing it flushes the last events)."""
        self._t_start = time.monotonic()
        base = time.time()
        next_report = self._t_start + every_s
        while not self.stop.is_set():
            shift = self.loops * self._period
            for r in range(self.trace.n_requests):
                due = base + (self._rel[r] + shift) / self.speed
                delay = due - time.time()
                if delay > 0 and self.stop.wait(delay):
                    return self.progress()
                self.lag_s = max(-delay, 0.0)
                self._request(r, due)
                self.requests += 1
                if progress is not None and time.monotonic() >= next_report:
                    progress(self.progress())
                    next_report = time.monotonic() + every_s
                if self.stop.is_set():
                    return self.progress()
            self.loops += 1
            if not self.loop:
                break
        return self.progress()

    def _request(self, r: int, now: float) -> None:
        agent = self.agent
        lo, hi = self._offsets[r], self._offsets[r + 1]
        req: list[int] = self._hashes[lo:hi].tolist()
        category = self._cats[r]
        cached = list(map(agent.policy.__contains__, req))
        try:
            hits = cached.index(False)
        except ValueError:
            hits = hi - lo
        if any(cached):
            agent.touch(
                list(compress(req, cached)),
                now,
                category,
                offsets=list(compress(range(hi - lo), cached)),
                hits=hits,
            )
        req.reverse()
        agent.free(req, range(hi - lo - 1, -1, -1), now, category)
        excess = len(agent.policy) - agent.capacity
        if excess > 0:
            agent.evict(excess, now)
        agent.apply_pending()

    def progress(self) -> WorkerProgress:
        return WorkerProgress(
            agent=self.agent.status(),
            policy=self.policy_name,
            requests=self.requests,
            trace_requests=self.trace.n_requests,
            loops=self.loops,
            lag_s=round(self.lag_s, 3),
            seconds=round(time.monotonic() - self._t_start, 3),
        )

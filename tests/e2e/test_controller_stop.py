"""``kvwise controller`` stopped as Kubernetes (SIGTERM) or a terminal (SIGINT) stops it: a
graceful stop exits 0 on either signal and says what it left behind, within seconds even
where Redis hangs."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from controlplane.dev.embedded_redis import EmbeddedRedis
from controlplane.service.controller import STOP_GRACE_S
from controlplane.service.controller_parts import CALL_TIMEOUT_S, PROBE_TIMEOUT_S
from tests.e2e.procs import Stack, get
from tests.waiting import wait_until

pytestmark = pytest.mark.e2e


@pytest.fixture
def stack(tmp_path: Path, redis_url: str) -> Iterator[Stack]:
    with Stack.running(tmp_path, redis_url, "stop") as s:
        yield s


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_leader_stops_with_exit_code_0_and_says_what_it_did(
    stack: Stack, sig: signal.Signals
) -> None:
    proc, url = stack.controller("ctl-stop")
    wait_until(lambda: get(url, "/v1/policy")["version"] >= 1, timeout=30, what="leadership")
    assert proc.stop(sig) == 0, proc.output()[-2000:]
    said = [line for line in proc.output().splitlines() if "ctl-stop stopped:" in line]
    assert len(said) == 1, proc.output()[-2000:]
    assert "checkpoint written (" in said[0] and said[0].endswith(", lease released")


def test_a_controller_says_where_it_serves(stack: Stack) -> None:
    """uvicorn says nothing of the socket the command binds itself: without this line a
    user who ran ``kvwise controller`` saw no address to open."""
    proc, url = stack.controller("ctl-where")
    wait_until(lambda: "serving the API on" in proc.output(), timeout=10, what="the line")
    said = [line for line in proc.output().splitlines() if "serving the API on" in line]
    assert len(said) == 1, proc.output()[-2000:]
    assert said[0].endswith(
        f"serving the API on {url} (OpenAPI docs at /docs, dashboard at /ui/, metrics at /metrics)"
    )


HUNG_STOP_BOUND_S = STOP_GRACE_S + PROBE_TIMEOUT_S + CALL_TIMEOUT_S + 3
"""The stop's wait before it asks Redis, the ping, the one attempt each call then has in
flight, and 3 s for the process's own start of the stop and its exit on a busy machine."""


@pytest.mark.slow
def test_a_leader_whose_redis_hangs_stops_within_seconds_and_says_what_it_left(
    tmp_path: Path,
) -> None:
    """A Redis that takes connections and never answers (SIGSTOP: a hung host) held the stop
    for 60 to 200 s: API requests, ingest and the scheduled jobs waited out their calls'
    timeouts and retries, past a pod's grace period. The stop now gives those calls up
    once Redis does not answer a ping, and says that the checkpoint was not written."""
    with (
        EmbeddedRedis(tmp_path) as server,
        Stack.running(tmp_path, server.url, "hung") as stack,
    ):
        assert server.proc is not None
        proc, url = stack.controller("ctl-hung")
        wait_until(lambda: get(url, "/v1/policy")["version"] >= 1, timeout=30, what="leadership")
        os.kill(server.proc.pid, signal.SIGSTOP)
        try:
            reads = _reads_in_flight(url, 3)
            # Its readiness probe (1 s, no retry) says so: the reads sent before it wait.
            wait_until(lambda: _ready_status(url) == 503, what="/readyz to say redis hangs")
            began = time.monotonic()
            code = proc.stop(signal.SIGTERM, timeout=120)
            took = time.monotonic() - began
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)
        answers = [read.result() for read in reads]
    log = proc.output()
    assert code == 0, log[-3000:]
    assert took < HUNG_STOP_BOUND_S, f"stopped in {took:.1f} s\n{log[-3000:]}"
    said = [line for line in log.splitlines() if "ctl-hung stopped:" in line]
    assert len(said) == 1, log[-3000:]
    assert said[0].endswith(
        "ctl-hung stopped: redis unavailable: Timeout reading from socket: no checkpoint (what "
        "the window took since the last one is lost, as after a crash), lease left to expire "
        "(within 2 s)"
    )
    assert "Traceback" not in log, log[-3000:]
    assert answers == [503, 503, 503], log[-3000:]


class _Read(threading.Thread):
    """One GET of the policy on a thread of its own: its status code once it is answered."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.status: int | None = None

    def run(self) -> None:
        with contextlib.suppress(httpx.HTTPError):
            self.status = httpx.get(self.url + "/v1/policy", timeout=120).status_code

    def result(self) -> int | None:
        self.join(timeout=30)
        return self.status


def _ready_status(url: str) -> int:
    return httpx.get(url + "/readyz", timeout=10).status_code


def _reads_in_flight(url: str, n: int) -> list[_Read]:
    reads = [_Read(url) for _ in range(n)]
    for read in reads:
        read.start()
    return reads

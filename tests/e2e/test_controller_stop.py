"""``kvwise controller`` stopped as Kubernetes (SIGTERM) or a terminal (SIGINT) stops it: a
graceful stop exits 0 on either signal and says what it left behind."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

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

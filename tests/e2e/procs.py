"""Child processes for end-to-end tests: controllers and simulated workers, as users run them
(``python -m controlplane ...``), with their logs kept for failure messages."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from controlplane.dev.embedded_redis import free_port
from tests.waiting import wait_until


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def alive(self) -> bool:
        return self.popen.poll() is None

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        return stop_process(self.popen, sig, timeout)

    def wait_serving(self, url: str, *, timeout: float, what: str) -> None:
        """Wait until ``url``'s ``/healthz`` answers 200; fail with the log if this exits."""

        def up() -> bool:
            assert self.alive(), self.output()[-3000:]
            try:
                return httpx.get(url + "/healthz", timeout=1).status_code == 200
            except httpx.TransportError:
                return False

        wait_until(up, timeout=timeout, what=what)


def stop_process(
    popen: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout: float = 30
) -> int:
    """Send ``sig`` (if still running), wait ``timeout`` s, then kill; the exit code."""
    if popen.poll() is None:
        popen.send_signal(sig)
    try:
        return popen.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        popen.kill()
        return popen.wait()


@dataclass
class Stack:
    """Processes of one test, all sharing one Redis and one key prefix."""

    workdir: Path
    redis_url: str
    prefix: str
    procs: list[Proc] = field(default_factory=list)

    def env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update(KVWISE_REDIS_URL=self.redis_url, KVWISE_KEY_PREFIX=self.prefix, **extra)
        return env

    def spawn(
        self, name: str, args: list[str], env: dict[str, str], stdout_file: bool = False
    ) -> Proc:
        log = self.workdir / f"{name}.log"
        out = log.open("wb")
        popen = subprocess.Popen(
            [sys.executable, "-m", "controlplane", *args],
            env=env,
            stdout=(self.workdir / f"{name}.out").open("wb") if stdout_file else out,
            stderr=out,
            stdin=subprocess.DEVNULL,
        )
        proc = Proc(name, popen, log)
        self.procs.append(proc)
        return proc

    def controller(self, name: str, **settings: str) -> tuple[Proc, str]:
        port = free_port()
        defaults = {
            "KVWISE_CONSUMER_NAME": name,
            "KVWISE_REFIT_INTERVAL_S": "1",
            "KVWISE_MIN_SAMPLES": "200",
            "KVWISE_CHANGE_THRESHOLD": "0",
            "KVWISE_INGEST_BLOCK_MS": "100",
            "KVWISE_RECLAIM_IDLE_MS": "1000",
            "KVWISE_LEASE_TTL_S": "2",
            "KVWISE_LOG_LEVEL": "info",
        }
        env = self.env(**{**defaults, **settings})
        proc = self.spawn(name, ["controller", "--host", "127.0.0.1", "--port", str(port)], env)
        url = f"http://127.0.0.1:{port}"
        proc.wait_serving(url, timeout=30, what=f"controller {name} to serve")
        return proc, url

    def worker(self, wid: str, trace: Path, capacity: int, speed: float = 20, **env: str) -> Proc:
        return self.spawn(
            wid,
            [
                "worker",
                "--trace",
                str(trace),
                "--speed",
                str(speed),
                "--capacity",
                str(capacity),
                "--id",
                wid,
                "--loop",
                "--json",
                "--status-every",
                "0",
            ],
            self.env(
                **{
                    "KVWISE_HEARTBEAT_INTERVAL_S": "0.5",
                    "KVWISE_POLL_INTERVAL_S": "0.5",
                    "KVWISE_FLUSH_INTERVAL_S": "0.05",
                    **env,
                }
            ),
            stdout_file=True,
        )

    def summary(self, proc: Proc) -> dict[str, Any]:
        """The JSON summary a worker prints when it stops."""
        text = (self.workdir / f"{proc.name}.out").read_text()
        return dict(json.loads(text.strip().splitlines()[-1]))

    def stop_all(self) -> None:
        for p in self.procs:
            p.stop(timeout=20)

    @classmethod
    @contextmanager
    def running(cls, workdir: Path, redis_url: str, label: str) -> Iterator[Stack]:
        """A stack under a fresh key prefix ``kvwise-<label>-<random>:``; every process it
        started is stopped at the end."""
        stack = cls(workdir, redis_url, f"kvwise-{label}-{uuid.uuid4().hex[:6]}:")
        try:
            yield stack
        finally:
            stack.stop_all()


def metric(url: str, name: str) -> float:
    """One un-labelled sample from a controller's /metrics."""
    text = httpx.get(url + "/metrics", timeout=5).text
    m = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def get(url: str, path: str) -> Any:
    return httpx.get(url + path, timeout=5).json()


def version_in_force(url: str) -> int:
    """The controller's current version; -1 while it cannot say (a 503 while Redis fails
    over, or no answer within 5 s)."""
    try:
        response = httpx.get(url + "/v1/policy", timeout=5)
    except httpx.TimeoutException:
        return -1
    return int(response.json()["version"]) if response.status_code == 200 else -1

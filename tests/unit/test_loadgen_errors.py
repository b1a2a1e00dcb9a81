"""``kvwise bench serve``'s client against a real socket that resets the connection mid
stream: a failure is counted with its reason, not a bare exception name."""

from __future__ import annotations

import asyncio
import socket
import struct

import httpx
import numpy as np

from controlplane.loadgen.client import Completion, RequestResult, send_completion


async def _reset_mid_stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answer 200 with one chunk of the event stream, then reset the connection."""
    await reader.read(1024)
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n")
    writer.write(b"transfer-encoding: chunked\r\n\r\n5\r\ndata:\r\n")
    await writer.drain()
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST
    writer.transport.abort()


async def _send_to_a_server_that_hangs_up() -> RequestResult:
    server = await asyncio.start_server(_reset_mid_stream, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    result = RequestResult(index=0, category=None, scheduled_s=0.0)
    prompt = np.arange(3, dtype=np.int64)
    completion = Completion(model="m", prompt=prompt, max_tokens=1, category=None)
    async with server, httpx.AsyncClient(timeout=5) as client:
        await send_completion(client, f"http://127.0.0.1:{port}/v1/completions", completion, result)
    return result


def test_a_dropped_connection_is_counted_with_a_reason() -> None:
    result = asyncio.run(_send_to_a_server_that_hangs_up())
    assert result.error is not None
    kind, _, reason = result.error.partition(": ")
    assert kind == "ReadError", result.error
    assert "Connection reset by peer" in reason, result.error  # once "ReadError: " alone

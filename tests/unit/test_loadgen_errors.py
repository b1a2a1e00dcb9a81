"""``kvwise bench serve``'s client against real sockets: a connection reset mid stream is
counted with its reason, not a bare exception name; the bytes read of a stream grow with
the tokens it asks, up to a hard cap, and a line is never buffered without end."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Awaitable, Callable

import httpx
import numpy as np

from controlplane.loadgen.client import (
    BYTES_PER_TOKEN,
    MAX_LINE_BYTES,
    MAX_RESPONSE_BYTES,
    MIN_RESPONSE_BYTES,
    Completion,
    RequestResult,
    response_bytes,
    send_completion,
)


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


# One event of one token as vLLM streams a completion (BYTES_PER_TOKEN's measurement).
_EVENT = (
    b'data: {"id":"cmpl-2b9f3c1e8d7a4f6b9e0c1d2a3b4c5d6e","object":"text_completion",'
    b'"created":1765000000,"model":"meta-llama/Llama-3.1-70B-Instruct-FP8-dynamic",'
    b'"choices":[{"index":0,"text":" token","logprobs":null,"finish_reason":null,'
    b'"stop_reason":null,"token_ids":null,"prompt_logprobs":null,'
    b'"prompt_token_ids":null}],"usage":null}\n\n'
)
_USAGE = (
    b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":%d,'
    b'"prompt_tokens_details":{"cached_tokens":0}}}\n\ndata: [DONE]\n\n'
)


def _streaming(tokens: int, tail: bytes = b"") -> Callable[..., Awaitable[None]]:
    """A server that streams ``tokens`` events of ``_EVENT``, then ``tail`` (or the usage
    and ``[DONE]`` when empty), without a content length (each write one chunk)."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1 << 16)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n")
        writer.write(b"connection: close\r\n\r\n")
        batch = 1000
        for done in range(0, tokens, batch):
            writer.write(_EVENT * min(batch, tokens - done))
            await writer.drain()
        writer.write(tail or _USAGE % tokens)
        await writer.drain()
        writer.close()

    return serve


async def _send(serve: Callable[..., Awaitable[None]], max_tokens: int) -> RequestResult:
    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    result = RequestResult(index=0, category=None, scheduled_s=0.0)
    prompt = np.arange(3, dtype=np.int64)
    completion = Completion(model="m", prompt=prompt, max_tokens=max_tokens, category=None)
    async with server, httpx.AsyncClient(timeout=30) as client:
        await send_completion(client, f"http://127.0.0.1:{port}/v1/completions", completion, result)
    return result


def test_the_response_bound_grows_with_the_tokens_asked() -> None:
    """8 MiB for every request: a normal stream of over about 25,000 tokens was an error."""
    assert 3 * len(_EVENT) <= BYTES_PER_TOKEN
    tokens = 60_000  # about 20 MB of events
    result = asyncio.run(_send(_streaming(tokens), max_tokens=tokens))
    assert result.ok, result.error
    assert result.completion_tokens == tokens
    assert response_bytes(1) == MIN_RESPONSE_BYTES
    assert response_bytes(10**12) == MAX_RESPONSE_BYTES  # the hard cap holds


def test_a_stream_past_its_bound_or_a_line_without_end_is_an_error() -> None:
    # max_tokens 1: the 8 MiB floor; the server sends 12 MB of events
    result = asyncio.run(_send(_streaming(40_000), max_tokens=1))
    assert result.error == f"response over {MIN_RESPONSE_BYTES} bytes"
    endless_line = b"data: " + b"x" * (2 * MAX_LINE_BYTES)
    result = asyncio.run(_send(_streaming(1, tail=endless_line), max_tokens=1))
    assert result.error == f"a line of the stream over {MAX_LINE_BYTES} bytes"

"""One streamed completion request, timed: ``send_completion``.

Owns the request body (prompt as token ids, ``stream: true`` with usage in the last chunk,
``ignore_eos`` so the output length is the one asked, the category as
``vllm_xargs.kv_category``), reading the server-sent events, and the result: time to the
first chunk that carries a choice (the first token), time to the end of the stream, and the
usage the server reports (prompt, completion and cached tokens). Every failure (HTTP status,
transport, a malformed or oversized stream, a timeout) becomes the result's ``error``
instead of an exception. It must never retry: a retried request would be timed twice.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
import orjson
from numpy.typing import NDArray

BYTES_PER_TOKEN = 1024
"""Bytes of the stream allowed per output token asked. One event of one token, as vLLM
streams a completion, is about 330 bytes with a 45-character model name (``id``,
``object``, ``created``, ``model``, one choice with ``text``, ``logprobs``,
``finish_reason``, ``stop_reason``, ``token_ids``, ``prompt_logprobs``,
``prompt_token_ids``, and ``usage``: ``null``); three times that leaves room for longer
model names, multi-byte text and fields yet to come."""
MIN_RESPONSE_BYTES = 8 << 20
"""Bytes allowed of any response, however few tokens it asks (an error body, usage)."""
MAX_RESPONSE_BYTES = 1 << 30
"""Bytes read of one response at most, whatever it asks (about a million tokens); a
longer stream is an error, not a read without end."""
MAX_LINE_BYTES = 1 << 20
"""Bytes of one line of the stream at most (an event is hundreds): a line without an
end is never buffered past this."""
MAX_ERROR_CHARS = 300
"""Characters kept of an error body."""


@dataclass(frozen=True)
class Completion:
    """What one request asks for."""

    model: str
    prompt: NDArray[np.int64]
    max_tokens: int
    category: str | None


@dataclass
class RequestResult:
    """What one request measured; times in seconds, ``None`` when not reached."""

    index: int
    category: str | None
    scheduled_s: float
    """When the plan said to send it (from the run's start)."""
    sent_s: float = 0.0
    """When it was sent (later than ``scheduled_s`` when the concurrency cap was full)."""
    ttft_s: float | None = None
    latency_s: float | None = None
    prompt_tokens: int | None = None
    """As the server counted them (``usage.prompt_tokens``)."""
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    """``usage.prompt_tokens_details.cached_tokens``; None if the server did not say."""
    sent_prompt_tokens: int = 0
    cut_blocks: int = 0
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def request_body(c: Completion) -> bytes:
    body: dict[str, Any] = {
        "model": c.model,
        "prompt": c.prompt,
        "max_tokens": c.max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }
    if c.category is not None:
        body["vllm_xargs"] = {"kv_category": c.category}
    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)


async def send_completion(
    client: httpx.AsyncClient, url: str, completion: Completion, result: RequestResult
) -> None:
    """POST ``completion`` to ``url`` (a ``/v1/completions`` endpoint) and fill ``result``
    (``sent_s`` is the caller's; times here are measured from now)."""
    result.sent_prompt_tokens = len(completion.prompt)
    start = time.perf_counter()
    try:
        async with client.stream(
            "POST",
            url,
            content=request_body(completion),
            headers={"Content-Type": "application/json", "Accept": "text/event-stream"},
        ) as response:
            if response.status_code >= 400:
                body = await _bounded_body(response)
                result.error = f"HTTP {response.status_code}: {_error_message(body)}"
                return
            limit = response_bytes(completion.max_tokens)
            await _read_stream(response, start, limit, result)
    except httpx.TimeoutException as exc:
        result.error = f"timeout ({type(exc).__name__})"
    except httpx.HTTPError as exc:
        result.error = _transport_error(exc)[:MAX_ERROR_CHARS]
    except _StreamError as exc:
        result.error = str(exc)


class _StreamError(Exception):
    """A stream that does not follow the OpenAI event format, or is too large."""


def response_bytes(max_tokens: int) -> int:
    """Bytes read of a stream that asks ``max_tokens`` tokens at most (``BYTES_PER_TOKEN``
    each, at least ``MIN_RESPONSE_BYTES``, at most ``MAX_RESPONSE_BYTES``)."""
    return min(MAX_RESPONSE_BYTES, max(MIN_RESPONSE_BYTES, max_tokens * BYTES_PER_TOKEN))


async def _lines(response: httpx.Response, limit: int) -> AsyncIterator[bytes]:
    """The response's lines, reading at most ``limit`` bytes in all and buffering at most
    ``MAX_LINE_BYTES`` of a line without an end."""
    read = 0
    buffer = bytearray()
    async for part in response.aiter_bytes():
        read += len(part)
        if read > limit:
            raise _StreamError(f"response over {limit} bytes")
        searched = len(buffer)
        buffer += part
        if len(buffer) > MAX_LINE_BYTES and buffer.find(b"\n", searched) < 0:
            raise _StreamError(f"a line of the stream over {MAX_LINE_BYTES} bytes")
        end = buffer.find(b"\n", searched)
        while end >= 0:
            yield bytes(buffer[:end]).rstrip(b"\r")
            del buffer[: end + 1]
            end = buffer.find(b"\n")
    if buffer:
        yield bytes(buffer)


async def _read_stream(
    response: httpx.Response, start: float, limit: int, result: RequestResult
) -> None:
    done = False
    async for line in _lines(response, limit):
        if not line.startswith(b"data:"):
            continue  # blank separators, comments, other SSE fields
        data = line[5:].strip().decode(errors="replace")
        if data == "[DONE]":
            done = True
            break
        chunk = _parse_chunk(data)
        if result.ttft_s is None and chunk.get("choices"):
            result.ttft_s = time.perf_counter() - start
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            _take_usage(usage, result)
    if not done:
        raise _StreamError("stream ended without [DONE]")
    result.latency_s = time.perf_counter() - start
    if result.ttft_s is None:
        raise _StreamError("stream carried no token")


def _parse_chunk(data: str) -> dict[str, Any]:
    try:
        chunk = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise _StreamError(f"event is not JSON: {data[:80]!r}") from None
    if not isinstance(chunk, dict):
        raise _StreamError(f"event is not a JSON object: {data[:80]!r}")
    if "error" in chunk:
        raise _StreamError(f"server error in stream: {_error_message(data.encode())}")
    return chunk


def _take_usage(usage: dict[str, Any], result: RequestResult) -> None:
    result.prompt_tokens = _count(usage.get("prompt_tokens"))
    result.completion_tokens = _count(usage.get("completion_tokens"))
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict):
        result.cached_tokens = _count(details.get("cached_tokens"))


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


async def _bounded_body(response: httpx.Response) -> bytes:
    out = bytearray()
    async for part in response.aiter_bytes():
        out += part
        if len(out) > 64 << 10:
            break
    return bytes(out)


def _error_message(body: bytes) -> str:
    """The ``message`` of an OpenAI-style error body, else the body's start."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body[:MAX_ERROR_CHARS].decode(errors="replace").strip() or "(empty body)"
    if isinstance(obj, dict):
        err = obj.get("error", obj)
        message = err.get("message") if isinstance(err, dict) else err
        if message is not None:
            return str(message)[:MAX_ERROR_CHARS]
    return str(obj)[:MAX_ERROR_CHARS]


def _transport_error(exc: httpx.HTTPError) -> str:
    """``exc`` with a reason: httpx's read errors often carry no message ("ReadError: "),
    so the first error beneath it that has one is given (the connection reset)."""
    reason: BaseException | None = exc
    while reason is not None and not str(reason):
        reason = reason.__cause__ or reason.__context__
    return f"{type(exc).__name__}: {reason or 'the connection ended without a reply'}"

"""Reading one Redis string key no further than a bound.

Owns the bounded read of a string (one GETRANGE of a byte past the bound, so a value that
holds more is seen without reading it whole; or its size asked first, where even reading
the bound's worth of a refused value costs too much) and the naming of a key that holds
another type. It must never decode or judge what it reads, nor word the refusal: each
caller says what the key is and what its bound is called.
"""

from __future__ import annotations

import redis
from redis.client import Pipeline

from agent.runtime.connection import RedisClient


class StringRefused(Exception):
    """The key was not read: it holds more than the bound, or another type."""


class StringTooLarge(StringRefused):
    def __init__(self, size: int) -> None:
        super().__init__(f"{size} bytes")
        self.size = size
        """Its size in bytes, as Redis gave it (at least a byte past the bound)."""


class WrongType(StringRefused):
    def __init__(self, held: str) -> None:
        super().__init__(held)
        self.held = held
        """The type the key holds instead (``list``, ``hash``, ...)."""


def read_bounded_string(
    reader: RedisClient | Pipeline, key: str, limit: int, *, size_first: bool = False
) -> bytes | None:
    """The string at ``key`` (None: absent or empty), never read past ``limit`` bytes.
    ``size_first``: its size is asked before it is read, so a refusal reads nothing.
    ``StringTooLarge`` if it holds more (one that grew between the two calls too),
    ``WrongType`` if the key holds another type than a string; Redis's other errors
    raise."""
    try:
        if size_first and (size := reader.strlen(key)) > limit:
            raise StringTooLarge(size)
        raw = reader.getrange(key, 0, limit)
        if len(raw) > limit:
            raise StringTooLarge(max(reader.strlen(key), len(raw)))
    except redis.ResponseError as exc:
        raise wrong_type(exc, reader, key) from None
    if not raw:
        return None
    return raw if isinstance(raw, bytes) else raw.encode()


def wrong_type(exc: redis.ResponseError, reader: RedisClient | Pipeline, key: str) -> WrongType:
    """``exc`` as a ``WrongType`` naming what ``key`` holds, if it says the key holds
    another type; re-raised otherwise."""
    if not str(exc).startswith("WRONGTYPE"):
        raise exc
    held = reader.type(key)
    return WrongType(held.decode() if isinstance(held, bytes) else held)

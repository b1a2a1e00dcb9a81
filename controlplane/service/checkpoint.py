"""Checkpoints of the statistics window in Redis, so that a restart keeps the fit.

Owns the stored form of a ``WindowState`` under ``Keys.checkpoint``: a versioned, compressed
numpy archive (a JSON header with the format version, the window settings, the category
names, the writer's name and process id and the time it was taken; the count arrays, only
for buckets inside the window and categories that hold a count), refused above ``max_bytes``
so a checkpoint stays bounded. The leader writes one on a schedule and on shutdown; a new
leader loads the last one another process wrote before it ingests. A checkpoint from another
format or other window settings is reported and ignored (the window starts empty), and so is
one whose bytes are damaged in any way: every failure to read one is a ``CheckpointError``.
It must never decide when to checkpoint.
"""

from __future__ import annotations

import io
import json
import time
from dataclasses import dataclass
from typing import Final

import numpy as np

from agent.runtime.connection import RedisClient
from controlplane.fit.reuse_window import WindowState

FORMAT: Final = 1
"""Version of the stored form; another version is ignored, never misread."""

_ARRAYS: Final = ("edges", "bucket_ids", "accesses", "near_concurrent", "gaps")


class CheckpointError(ValueError):
    """A stored checkpoint that cannot be used (format, settings, corruption)."""


@dataclass(frozen=True)
class Loaded:
    state: WindowState
    taken_at: float
    writer: str
    """The controller (consumer name) that wrote it."""
    process: str
    """The id of the process that wrote it (a name survives a restart; this does not)."""
    nbytes: int


def encode(
    state: WindowState, *, writer: str = "", process: str = "", taken_at: float | None = None
) -> bytes:
    """The stored form of ``state``."""
    header = {
        "format": FORMAT,
        "writer": writer,
        "process": process,
        "taken_at": time.time() if taken_at is None else taken_at,
        "window_s": state.window_s,
        "near_concurrent_s": state.near_concurrent_s,
        "n_buckets": state.n_buckets,
        "names": list(state.names),
        "head": state.head,
        "origin": state.origin,
        "dropped": state.dropped,
    }
    out = io.BytesIO()
    arrays = {name: getattr(state, name) for name in _ARRAYS}
    np.savez_compressed(out, header=np.frombuffer(json.dumps(header).encode(), np.uint8), **arrays)
    return out.getvalue()


def decode(raw: bytes) -> Loaded:
    """The ``WindowState`` stored as ``raw``; ``CheckpointError`` if it cannot be used."""
    try:
        return _decode(raw)
    except CheckpointError:
        raise
    except Exception as exc:  # damaged bytes raise anything (BadZipFile, KeyError, ...)
        raise CheckpointError(f"unreadable checkpoint: {type(exc).__name__}: {exc}") from None


def _decode(raw: bytes) -> Loaded:
    with np.load(io.BytesIO(raw), allow_pickle=False) as archive:
        header = json.loads(archive["header"].tobytes())
        arrays = {name: archive[name] for name in _ARRAYS}
    if header.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint format {header.get('format')!r}, not {FORMAT}")
    state = WindowState(
        window_s=float(header["window_s"]),
        near_concurrent_s=float(header["near_concurrent_s"]),
        n_buckets=int(header["n_buckets"]),
        names=tuple(header["names"]),
        head=header["head"],
        origin=header["origin"],
        dropped=int(header["dropped"]),
        **arrays,
    )
    c, s = len(state.names), len(state.bucket_ids)
    if state.accesses.shape != (s, c) or state.gaps.shape[:2] != (s, c):
        raise CheckpointError("checkpoint arrays do not match its categories and buckets")
    return Loaded(
        state,
        float(header["taken_at"]),
        str(header.get("writer", "")),
        str(header.get("process", "")),
        len(raw),
    )


class CheckpointStore:
    """Reads and writes the one checkpoint under ``key``."""

    def __init__(self, client: RedisClient, key: str, *, max_bytes: int) -> None:
        self.r = client
        self.key = key
        self.max_bytes = max_bytes

    def save(self, state: WindowState, *, writer: str = "", process: str = "") -> int:
        """Write ``state``; returns its size. ``CheckpointError`` (nothing written) when it
        would be larger than ``max_bytes``."""
        raw = encode(state, writer=writer, process=process)
        if len(raw) > self.max_bytes:
            raise CheckpointError(
                f"checkpoint of {len(raw)} bytes > max_checkpoint_bytes ({self.max_bytes})"
            )
        self.r.set(self.key, raw)
        return len(raw)

    def load(self) -> Loaded | None:
        """The last checkpoint, or None if there is none."""
        raw = self.r.get(self.key)
        if raw is None:
            return None
        return decode(raw if isinstance(raw, bytes) else raw.encode("latin-1"))

"""Checkpoints of the statistics window in Redis, so that a restart keeps the fit.

Owns the stored form of a ``WindowState`` under ``Keys.checkpoint``: a versioned, compressed
numpy archive (a JSON header with the format version, the window settings, the category
names, the writer's name and process id and the time it was taken; the count arrays, only
for buckets inside the window and categories that hold a count), refused above ``max_bytes``
so a checkpoint stays bounded. The leader writes one on a schedule and on shutdown; a new
leader loads the last one another process wrote before it ingests. A checkpoint from another
format or other window settings is reported and ignored (the window starts empty), and so is
one whose bytes are damaged in any way: every failure to read one is a ``CheckpointError``.
A checkpoint is checked whole before anything is restored (names as the wire allows them,
at most ``max_categories``; counts whole, non-negative, of the window's dtypes; shapes and
buckets that fit the header), since a window restored from a bad one would fail every
refit until the key is deleted. It must never decide when to checkpoint.
"""

from __future__ import annotations

import io
import json
import math
import time
from dataclasses import dataclass
from typing import Final, TypeGuard

import numpy as np

from agent.runtime.connection import RedisClient
from agent.wire import MAX_CATEGORY_NAME_CHARS
from controlplane.fit.reuse_window import WindowState

FORMAT: Final = 1
"""Version of the stored form; another version is ignored, never misread."""

_ARRAYS: Final = ("edges", "bucket_ids", "accesses", "near_concurrent", "gaps")
_COUNTS: Final = {"accesses": np.int64, "near_concurrent": np.int64, "gaps": np.int32}
"""Count arrays and the dtype the window holds them in (a value must fit it as it is)."""


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


def decode(raw: bytes, *, max_categories: int | None = None) -> Loaded:
    """The ``WindowState`` stored as ``raw``; ``CheckpointError`` if it cannot be used
    (also when it holds more than ``max_categories`` categories)."""
    try:
        return _decode(raw, max_categories)
    except CheckpointError:
        raise
    except Exception as exc:  # damaged bytes raise anything (BadZipFile, KeyError, ...)
        raise CheckpointError(f"unreadable checkpoint: {type(exc).__name__}: {exc}") from None


def _decode(raw: bytes, max_categories: int | None) -> Loaded:
    with np.load(io.BytesIO(raw), allow_pickle=False) as archive:
        header = json.loads(archive["header"].tobytes())
        arrays = {name: archive[name] for name in _ARRAYS}
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        found = header.get("format") if isinstance(header, dict) else header
        raise CheckpointError(f"checkpoint format {found!r}, not {FORMAT}")
    names = _names(header.get("names"), max_categories)
    head = _optional_number(header, "head", whole=True)
    state = WindowState(
        window_s=float(_number(header, "window_s")),
        near_concurrent_s=float(_number(header, "near_concurrent_s")),
        n_buckets=int(_number(header, "n_buckets", whole=True)),
        names=names,
        head=None if head is None else int(head),
        origin=_optional_number(header, "origin"),
        dropped=int(_number(header, "dropped", whole=True)),
        **arrays,
    )
    _check_arrays(state)
    return Loaded(
        state,
        float(_number(header, "taken_at")),
        _text(header, "writer"),
        _text(header, "process"),
        len(raw),
    )


def _number(
    header: dict[str, object], field: str, *, whole: bool = False, signed: bool = False
) -> float:
    """Header ``field``: a finite number (an integer when ``whole``; negative only when
    ``signed``)."""
    value = header.get(field)
    if _usable(value, whole=whole, signed=signed):
        return value
    kind = "integer" if whole else "number"
    raise CheckpointError(f"checkpoint field {field!r} is {value!r}: not a finite {kind}")


def _optional_number(header: dict[str, object], field: str, *, whole: bool = False) -> float | None:
    """``_number`` (signed), or None where the header holds none."""
    return None if header.get(field) is None else _number(header, field, whole=whole, signed=True)


def _usable(value: object, *, whole: bool, signed: bool) -> TypeGuard[float]:
    if isinstance(value, bool) or not isinstance(value, int if whole else (int, float)):
        return False
    if isinstance(value, int):
        return abs(value) < 2**62 and (signed or value >= 0)
    return math.isfinite(value) and (signed or value >= 0)


def _text(header: dict[str, object], field: str) -> str:
    value = header.get(field, "")
    if not isinstance(value, str):
        raise CheckpointError(f"checkpoint field {field!r} is {value!r}: not a string")
    return value


def _names(names: object, max_categories: int | None) -> tuple[str, ...]:
    """The header's category names, as the wire allows them: strings of 1 to
    ``MAX_CATEGORY_NAME_CHARS`` characters, each once, at most ``max_categories``."""
    if not isinstance(names, list):
        raise CheckpointError(f"checkpoint field 'names' is {names!r:.80}: not a list")
    if max_categories is not None and len(names) > max_categories:
        raise CheckpointError(
            f"checkpoint field 'names' holds {len(names)} categories > "
            f"max_categories ({max_categories})"
        )
    for i, name in enumerate(names):
        if not (isinstance(name, str) and 1 <= len(name) <= MAX_CATEGORY_NAME_CHARS):
            size = f" of {len(name)} characters" if isinstance(name, str) else ""
            raise CheckpointError(
                f"checkpoint field 'names', category {i} ({name!r:.60}{size}): a category "
                f"name is a string of 1 to {MAX_CATEGORY_NAME_CHARS} characters"
            )
    if len(set(names)) != len(names):
        twice = next(n for i, n in enumerate(names) if n in names[:i])
        raise CheckpointError(f"checkpoint field 'names' names category {twice!r:.60} twice")
    return tuple(names)


def _check_arrays(state: WindowState) -> None:
    """Shapes, buckets and counts that fit the header (``CheckpointError`` naming the
    array and, for a count, its category)."""
    c, bins = len(state.names), len(state.edges) - 1
    if state.edges.ndim != 1 or state.edges.dtype.kind != "f" or bins < 1:
        raise CheckpointError("checkpoint array 'edges' is not a list of gap bin edges")
    ids = state.bucket_ids
    if ids.ndim != 1 or ids.dtype.kind not in "iu" or len(np.unique(ids)) != len(ids):
        raise CheckpointError("checkpoint array 'bucket_ids' is not a list of distinct buckets")
    s, head = len(ids), state.head
    if s and (head is None or ids.min() <= head - state.n_buckets or ids.max() > head):
        raise CheckpointError(
            f"checkpoint array 'bucket_ids' holds buckets outside the window "
            f"(head {state.head}, {state.n_buckets} buckets)"
        )
    for field, dtype in _COUNTS.items():
        counts = getattr(state, field)
        shape = (s, c, bins) if field == "gaps" else (s, c)
        if counts.shape != shape:
            raise CheckpointError(
                f"checkpoint array {field!r} of shape {counts.shape} does not match its "
                f"{c} categories, {s} buckets and {bins} gap bins (want {shape})"
            )
        _check_counts(field, counts, np.dtype(dtype), state.names)


def _check_counts(field: str, counts: np.ndarray, dtype: np.dtype, names: tuple[str, ...]) -> None:
    """Counts are whole, non-negative, fit ``dtype`` as they are (never cast) and sum
    within int64."""
    if counts.dtype.kind not in "iu":
        raise CheckpointError(
            f"checkpoint array {field!r} holds {counts.dtype} counts, not whole numbers"
        )
    top = np.iinfo(dtype).max
    bad = np.argwhere((counts < 0) | (counts > top))
    if len(bad):
        where = tuple(int(i) for i in bad[0])
        raise CheckpointError(
            f"checkpoint array {field!r}, category {names[where[1]]!r:.60}: count "
            f"{counts[where]} at {where} is not between 0 and {top}"
        )
    if float(counts.sum(dtype=np.float64)) >= 2.0**63:  # the window's sums are int64
        raise CheckpointError(f"checkpoint array {field!r}: its counts sum past 2**63")


class CheckpointStore:
    """Reads and writes the one checkpoint under ``key``."""

    def __init__(
        self, client: RedisClient, key: str, *, max_bytes: int, max_categories: int | None = None
    ) -> None:
        self.r = client
        self.key = key
        self.max_bytes = max_bytes
        self.max_categories = max_categories

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
        """The last checkpoint, or None if there is none; ``CheckpointError`` if it cannot
        be used."""
        raw = self.r.get(self.key)
        if raw is None:
            return None
        raw = raw if isinstance(raw, bytes) else raw.encode("latin-1")
        return decode(raw, max_categories=self.max_categories)

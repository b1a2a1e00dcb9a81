"""Checkpoints of the statistics window in Redis, so that a restart keeps the fit.

Owns the stored form of a ``WindowState`` under ``Keys.checkpoint``: a versioned, compressed
numpy archive (a JSON header with the format version, the window settings, the category
names, the writer's name and process id and the time it was taken; the count arrays, only
for buckets inside the window and categories that hold a count), refused above ``max_bytes``
so a checkpoint stays bounded. The leader writes one on a schedule and on shutdown; a new
leader loads the last one another process wrote before it ingests. A checkpoint from another
format or other window settings is reported and ignored (the window starts empty), and so is
one whose bytes are damaged in any way: every failure to read one is a ``CheckpointError``.
A stored one is read within bounds before anything is unpacked: no more than ``max_bytes``
of it (its size asked first; a key of another type refused), a zip end record of at most its
six members, and each member's array header declaring no more than a full window of these
settings holds (``CheckpointBounds``), so a small archive that unpacks to gigabytes is
refused unpacked. It is then checked whole before anything is restored (names as the wire
allows them, at most ``max_categories``; counts whole, non-negative, of the window's dtypes;
shapes and buckets that fit the header), since a window restored from a bad one would fail
every refit until the key is deleted. It must never decide when to checkpoint.
"""

from __future__ import annotations

import io
import json
import math
import struct
import time
import zipfile
from dataclasses import dataclass
from typing import IO, Final, TypeGuard

import numpy as np

from agent.runtime.connection import RedisClient
from agent.wire import MAX_CATEGORY_NAME_CHARS
from controlplane.fit.reuse_window import ReuseStats, WindowState
from controlplane.service.bounded_string import StringTooLarge, WrongType, read_bounded_string

FORMAT: Final = 1
"""Version of the stored form; another version is ignored, never misread."""

_ARRAYS: Final = ("edges", "bucket_ids", "accesses", "near_concurrent", "gaps")
_MEMBERS: Final = ("header", *_ARRAYS)
_COUNTS: Final = {"accesses": np.int64, "near_concurrent": np.int64, "gaps": np.int32}
"""Count arrays and the dtype the window holds them in (a value must fit it as it is)."""


class CheckpointError(ValueError):
    """A stored checkpoint that cannot be used (format, settings, corruption, size)."""


_HEADER_BYTES: Final = 64 << 10
"""A header's JSON less its category names: numbers, the writer's name (a controller's
``consumer_name``, 253 characters at most: about 3 KB escaped), its process id."""
_NAME_BYTES: Final = 12 * MAX_CATEGORY_NAME_CHARS + 4
"""A category name in the header's JSON at most: 12 bytes a character (a character past
the BMP escaped as two ``\\uXXXX``), its quotes and separator."""
_MAX_ITEM_BYTES: Final = 8
"""The widest element a member may hold (the window counts in int64 at most)."""


@dataclass(frozen=True)
class CheckpointBounds:
    """The most a checkpoint for a window of ``buckets`` buckets, ``gap_bins`` gap bins
    and at most ``categories`` categories may hold: what that window, full, holds. A stored
    one that declares more is refused before anything of it is unpacked."""

    buckets: int
    categories: int
    gap_bins: int

    @classmethod
    def of(cls, window: ReuseStats, max_categories: int) -> CheckpointBounds:
        return cls(window.n_buckets, max_categories, len(window.edges) - 1)

    def elements(self, member: str) -> int:
        """Elements ``member`` may declare, at most (bytes, for the header)."""
        cells = self.buckets * self.categories
        return {
            "header": _HEADER_BYTES + self.categories * _NAME_BYTES,
            "edges": self.gap_bins + 1,
            "bucket_ids": self.buckets,
            "accesses": cells,
            "near_concurrent": cells,
            "gaps": cells * self.gap_bins,
        }[member]


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


def decode(raw: bytes, *, bounds: CheckpointBounds | None = None) -> Loaded:
    """The ``WindowState`` stored as ``raw``; ``CheckpointError`` if it cannot be used
    (also when it holds more than ``bounds`` allow; None: bytes this process wrote)."""
    try:
        return _decode(raw, bounds)
    except CheckpointError:
        raise
    except Exception as exc:  # damaged bytes raise anything (BadZipFile, KeyError, ...)
        raise CheckpointError(f"unreadable checkpoint: {type(exc).__name__}: {exc}") from None


def _decode(raw: bytes, bounds: CheckpointBounds | None) -> Loaded:
    with _opened(raw) as archive:
        header = json.loads(_member(archive, "header", bounds).tobytes())
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            found = header.get("format") if isinstance(header, dict) else header
            raise CheckpointError(f"checkpoint format {found!r}, not {FORMAT}")
        names = _names(header.get("names"), None if bounds is None else bounds.categories)
        arrays = {name: _member(archive, name, bounds) for name in _ARRAYS}
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


_END_RECORD: Final = struct.Struct("<4s4H2LH")
"""A zip archive's end record: signature, disk numbers, members on this disk and in all,
the directory's size and offset, the comment's length."""
_END_SIGNATURE: Final = b"PK\x05\x06"
_ZIP64_LOCATOR: Final = b"PK\x06\x07"
"""20 bytes ahead of the end record, it points at a zip64 one, which zipfile would read
instead (never in a checkpoint: a Redis string is far smaller)."""
_DIRECTORY_ENTRY_BYTES: Final = 1 << 10
"""A member's entry in the archive's directory, at most (numpy writes about 60 bytes)."""


def _opened(raw: bytes) -> zipfile.ZipFile:
    """``raw`` opened as a zip archive once its end record says it holds no more than a
    checkpoint's members in a directory of their size, and it lists exactly those; each
    member is unpacked by ``_member``, only once its declared shape and dtype fit."""
    _check_end_record(raw)
    archive = zipfile.ZipFile(io.BytesIO(raw))
    listed = [info.filename.removesuffix(".npy") for info in archive.infolist()]
    if sorted(listed) != sorted(_MEMBERS):
        archive.close()
        raise CheckpointError(f"checkpoint archive holds {listed!r:.200}, not {_MEMBERS}")
    return archive


def _check_end_record(raw: bytes) -> None:
    """``CheckpointError`` unless the end record zipfile will read (found as it finds it)
    declares at most the checkpoint's members and a directory of their size: zipfile lists
    every entry its directory holds, and a forged one can name a million."""
    size = _END_RECORD.size
    last = len(raw) - size
    if raw[last : last + 4] == _END_SIGNATURE and raw[-2:] == b"\0\0":
        at = last  # no comment
    else:  # after a comment (up to 64 KiB), searched where zipfile searches
        at = raw.rfind(_END_SIGNATURE, max(last - (1 << 16), 0))
    if at < 0 or at > last:
        raise CheckpointError("unreadable checkpoint: not a zip archive (no end record)")
    _, _, _, here, members, directory, _, _ = _END_RECORD.unpack_from(raw, at)
    most = len(_MEMBERS)
    zip64 = at >= 20 and raw[at - 20 : at - 16] == _ZIP64_LOCATOR
    if zip64 or max(here, members) > most or directory > most * _DIRECTORY_ENTRY_BYTES:
        raise CheckpointError(
            f"checkpoint archive declares {members:,} members in a directory of "
            f"{directory:,} bytes{' (zip64)' if zip64 else ''}: a checkpoint has {most} "
            "(not unpacked)"
        )


def _member(archive: zipfile.ZipFile, name: str, bounds: CheckpointBounds | None) -> np.ndarray:
    """Member ``name`` unpacked, once its array header declares no more than ``bounds``
    allow it (no more elements than a full window holds, none wider than 8 bytes)."""
    if bounds is not None:
        with archive.open(f"{name}.npy") as member:
            shape, dtype = _declared(member)
        count, most = math.prod(shape), bounds.elements(name)
        if count > most or dtype.itemsize > _MAX_ITEM_BYTES:
            raise CheckpointError(
                f"checkpoint array {name!r} declares shape {shape} of {dtype} "
                f"({count * dtype.itemsize:,} bytes): more than a window of these settings "
                f"holds ({most:,} elements of at most {_MAX_ITEM_BYTES} bytes; not unpacked)"
            )
    with archive.open(f"{name}.npy") as member:
        return np.lib.format.read_array(member, allow_pickle=False)


def _declared(member: IO[bytes]) -> tuple[tuple[int, ...], np.dtype]:
    """The shape and dtype a member's array header declares."""
    major, _ = np.lib.format.read_magic(member)
    read = {1: np.lib.format.read_array_header_1_0, 2: np.lib.format.read_array_header_2_0}
    if major not in read:
        raise CheckpointError(f"checkpoint array of npy format {major}, not 1 or 2")
    shape, _, dtype = read[major](member)
    return shape, dtype


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
    """Reads and writes the one checkpoint under ``key``, at most ``max_bytes`` of it, and
    reads back only one that fits ``bounds``."""

    def __init__(
        self, client: RedisClient, key: str, *, max_bytes: int, bounds: CheckpointBounds
    ) -> None:
        self.r = client
        self.key = key
        self.max_bytes = max_bytes
        self.bounds = bounds

    def save(self, state: WindowState, *, writer: str = "", process: str = "") -> int:
        """Write ``state``; returns its size. ``CheckpointError`` (nothing written) when it
        would be larger than ``max_bytes``."""
        raw = encode(state, writer=writer, process=process)
        if len(raw) > self.max_bytes:
            raise CheckpointError(
                f"checkpoint of {len(raw):,} bytes > max_checkpoint_bytes ({self.max_bytes:,})"
            )
        self.r.set(self.key, raw)
        return len(raw)

    def load(self) -> Loaded | None:
        """The last checkpoint, or None if there is none; ``CheckpointError`` (saying its
        size) if it cannot be used."""
        raw = self._stored()
        if raw is None:
            return None
        try:
            return decode(raw, bounds=self.bounds)
        except CheckpointError as exc:
            raise CheckpointError(f"{exc}; {len(raw):,} bytes stored") from None

    def _stored(self) -> bytes | None:
        """The stored bytes (None: absent or empty), never read past ``max_bytes``
        (``read_bounded_string``, its size asked first, so a refusal reads nothing).
        ``CheckpointError`` if it is larger or the key holds another type than a string."""
        try:
            return read_bounded_string(self.r, self.key, self.max_bytes, size_first=True)
        except StringTooLarge as exc:
            raise CheckpointError(
                f"checkpoint of {exc.size:,} bytes > max_checkpoint_bytes ({self.max_bytes:,}; "
                "not read)"
            ) from None
        except WrongType as exc:
            raise CheckpointError(
                f"the key holds a {exc.held}, not a checkpoint (not read)"
            ) from None

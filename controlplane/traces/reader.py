"""Trace files -> ``Trace``: the Alibaba Bailian and Mooncake JSONL readers.

Owns parsing and validating trace lines, telling the two formats apart, reading gzip,
reporting malformed lines (``TraceError``, or counted skips) and how far a read has got.
Hash ids become an int64 row per line, merged into chunks of a million, so no Python
object per block outlives its line; per-request columns grow in compact ``array`` buffers.
It must never sort or remap hashes (``controlplane.traces.model`` does, and
``controlplane.traces.chaining`` re-chains ids that are not prefix-chained) or know about
policies and replay.

Formats (docs/traces.md):

- Bailian ``qwen_trace*_blksz_16.jsonl``: ``chat_id``, ``parent_chat_id``, ``timestamp``
  (seconds), ``input_length``, ``output_length``, ``type``, ``turn``, ``hash_ids``; and,
  optional (a trace ``kvwise trace record`` wrote), ``block_tokens``: tokens per block,
  the same on every line (``Trace.block_tokens``).
- Mooncake ``*_trace.jsonl``: ``timestamp`` (milliseconds), ``input_length``,
  ``output_length``, ``hash_ids``.
"""

from __future__ import annotations

import gzip
import io
import json
import math
import os
import re
import stat
import zlib
from array import array
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, Literal, cast

import numpy as np
import orjson

from controlplane.traces.chaining import prefix_chained
from controlplane.traces.model import Trace

TraceFormat = Literal["auto", "bailian", "mooncake"]
ReadProgress = Callable[[int, int | None], None]
"""Told ``(bytes read, file size)`` while a trace is read: bytes of the file as stored
(compressed, for gzip), the size ``None`` for a pipe. Called as each mebibyte is read and
once at the end, so a caller can show how far a long load has got."""
FORMATS: tuple[str, ...] = ("auto", "bailian", "mooncake")

BAILIAN_KEYS = frozenset({"chat_id", "parent_chat_id", "type", "turn"})
"""Any of these on a line marks the Bailian format (Mooncake lines carry none)."""
MOONCAKE_KEYS = frozenset({"timestamp", "hash_ids"})

MAX_SKIP_DETAILS = 1000
"""Skipped lines past this many keep a short reason (no offending value), so a file of
garbage read with ``skip_bad_lines`` costs a few dozen bytes a line; the count stays exact."""

MAX_LINE_BYTES = 16 << 20
"""Longest line read (without its newline). The longest real line is a few hundred
kilobytes (a million-token prompt's ids); a longer one (a binary file, a writer that never
ends its line) is a bad line, read past in pieces of this size, never held whole."""

_GZIP_MAGIC = b"\x1f\x8b"
_BOM = b"\xef\xbb\xbf"
_OTHER_COMPRESSIONS = {
    b"\xfd7zXZ\x00": ("xz", "xz -d"),
    b"BZh": ("bzip2", "bunzip2"),
    b"\x28\xb5\x2f\xfd": ("zstd", "zstd -d"),
    b"PK\x03\x04": ("zip", "unzip"),
}
"""Magic bytes of compressions the reader does not read -> (name, how to undo it): a file
that starts with one is refused as such, not as a line of invalid JSON."""
_LFS_POINTER = b"version https://git-lfs.github.com/spec/"
"""How a Git LFS pointer file starts: what a clone without LFS holds in place of a trace
stored with it (the public Bailian traces are)."""
_INT64_MAX = 2**63 - 1
_INT64_MIN = -(2**63)
_CHUNK_BLOCKS = 1 << 20  # hash ids per chunk (8 MiB)
_CHUNK_ROWS = 1 << 14  # lines per chunk: short lines must not pile up array objects
_SHOWN_MAX = 60


class TraceError(ValueError):
    """A malformed trace line: ``path:line: field 'name': problem``.

    ``line`` is 1-based; ``field`` is ``None`` when the line as a whole is wrong (bad
    JSON, not an object, unknown format, broken gzip stream).
    """

    def __init__(self, path: str, line: int, field: str | None, problem: str) -> None:
        where = f"{path}:{line}: "
        super().__init__(where + (f"field {field!r}: {problem}" if field else problem))
        self.path = path
        self.line = line
        self.field = field
        self.problem = problem

    def __reduce__(self) -> tuple[type[TraceError], tuple[str, int, str | None, str]]:
        # Survives pickling (process pools) with its attributes.
        return (TraceError, (self.path, self.line, self.field, self.problem))


class _Bad(Exception):
    """A line's defect, before the reader knows the path and line number. ``inexact``:
    the value it quotes may be an integer orjson could only read as a float
    (``_maybe_huge_integer``), so the line is read again exactly to quote it as written."""

    def __init__(self, field: str | None, problem: str, kind: str, inexact: bool = False) -> None:
        super().__init__(problem)
        self.field = field
        self.problem = problem
        self.kind = kind  # short form kept for skipped lines past MAX_SKIP_DETAILS
        self.inexact = inexact

    def reason(self, detailed: bool) -> str:
        text = self.problem if detailed else self.kind
        return f"field {self.field!r}: {text}" if self.field else text


def _shown(value: object) -> str:
    """The offending value as JSON, cut short: error messages quote it."""
    try:
        text = orjson.dumps(value).decode()
    except TypeError:
        text = repr(value)
    return text if len(text) <= _SHOWN_MAX else text[: _SHOWN_MAX - 3] + "..."


def _maybe_huge_integer(value: object) -> bool:
    """Whether ``value`` may stand for an integer literal that orjson read as a float (it
    does so outside [-2**63, 2**64): ``99999999999999999999999`` becomes ``1e+23``)."""
    return type(value) is float and value.is_integer() and abs(value) >= _INT64_MAX


def _as_written(bad: _Bad, line: bytes, fmt: str) -> _Bad:
    """``bad``, found again on ``line`` read by the standard library's parser, which keeps
    integers exact: a huge integer is then out of range, quoted as written, not a float."""
    try:
        _Columns(fmt).add(json.loads(line))
    except _Bad as exact:
        return exact if exact.field == bad.field else bad
    except (ValueError, RecursionError):  # e.g. an integer longer than Python converts
        pass
    return bad


def _field(obj: dict[str, Any], key: str) -> Any:
    try:
        return obj[key]
    except KeyError:
        raise _Bad(key, "missing", "missing") from None


def _int(obj: dict[str, Any], key: str, minimum: int) -> int:
    value = _field(obj, key)
    # type() rather than isinstance: JSON true/false must not pass as 1/0.
    if type(value) is not int:
        problem = f"expected an integer, got {_shown(value)}"
        raise _Bad(key, problem, "not an integer", _maybe_huge_integer(value))
    if not minimum <= value <= _INT64_MAX:
        want = "a non-negative integer" if minimum == 0 else f"an integer >= {minimum}"
        raise _Bad(key, f"expected {want} (64-bit), got {value}", "out of range")
    return value


def _timestamp(obj: dict[str, Any]) -> float:
    value = _field(obj, "timestamp")
    if type(value) is not int and type(value) is not float:
        raise _Bad("timestamp", f"expected a number, got {_shown(value)}", "not a number")
    if not (math.isfinite(value) and value >= 0):
        problem = f"expected a finite non-negative number, got {_shown(value)}"
        raise _Bad("timestamp", problem, "negative or not finite")
    return float(value)


def _type(obj: dict[str, Any]) -> str:
    value = _field(obj, "type")
    if type(value) is not str or not value:
        raise _Bad("type", f"expected a non-empty string, got {_shown(value)}", "not a string")
    return value


def _block_tokens(obj: dict[str, Any]) -> int | None:
    """A line's optional ``block_tokens`` (None: the line does not say)."""
    return _int(obj, "block_tokens", 1) if "block_tokens" in obj else None


_HASHES_WANTED = "expected a non-empty list of integers"


def _hash_ids(obj: dict[str, Any]) -> list[int]:
    value = _field(obj, "hash_ids")
    if type(value) is not list or not value:
        raise _Bad("hash_ids", f"{_HASHES_WANTED}, got {_shown(value)}", "not a list of integers")
    # One C-level pass over the element types; the slow search runs only on failure.
    if set(map(type, value)) != {int}:
        i, item = next((i, x) for i, x in enumerate(value) if type(x) is not int)
        problem = f"{_HASHES_WANTED}, got {_shown(item)} at index {i}"
        raise _Bad("hash_ids", problem, "not a list of integers", _maybe_huge_integer(item))
    return value


class _Columns:
    """Per-request columns in file order, as compact typed buffers."""

    def __init__(self, fmt: str) -> None:
        self.fmt = fmt
        self._hash_chunks: list[np.ndarray[Any, np.dtype[np.int64]]] = []
        self._pending: list[np.ndarray[Any, np.dtype[np.int64]]] = []
        self._pending_blocks = 0
        self.lengths = array("q")
        self.timestamps = array("d")
        self.input_lengths = array("q")
        self.output_lengths = array("q")
        self.chat_ids = array("q")
        self.parent_chat_ids = array("q")
        self.turns = array("q")
        self.types: list[str] = []
        self._type_names: dict[str, str] = {}  # one string object per distinct type
        self.block_tokens: int | None = None
        """What the first line read said; every other line must say the same."""
        self.add: Callable[[dict[str, Any]], None] = (
            self._add_bailian if fmt == "bailian" else self._add_mooncake
        )

    def _extend_hashes(self, ids: list[int]) -> None:
        try:
            # fromiter is the fastest list -> int64 path and rejects ids outside 64 bits
            # (element types were checked already: it would truncate floats silently).
            row = np.fromiter(ids, dtype=np.int64, count=len(ids))
        except OverflowError:
            i, item = next((i, x) for i, x in enumerate(ids) if not _INT64_MIN <= x <= _INT64_MAX)
            problem = f"{_HASHES_WANTED} (64-bit), got {item} at index {i}"
            raise _Bad("hash_ids", problem, "out of range") from None
        self.lengths.append(len(ids))
        self._pending.append(row)
        self._pending_blocks += len(ids)
        if self._pending_blocks >= _CHUNK_BLOCKS or len(self._pending) >= _CHUNK_ROWS:
            self._flush()

    def _flush(self) -> None:
        """Merge the per-line rows into one chunk: a few arrays, not one per line."""
        if self._pending:
            self._hash_chunks.append(np.concatenate(self._pending))
            self._pending.clear()
            self._pending_blocks = 0

    def hashes(self) -> np.ndarray[Any, np.dtype[np.int64]]:
        self._flush()
        chunks, self._hash_chunks = self._hash_chunks, []
        if not chunks:
            return np.zeros(0, dtype=np.int64)
        return chunks[0] if len(chunks) == 1 else np.concatenate(chunks)

    def _add_mooncake(self, obj: dict[str, Any]) -> None:
        ts = _timestamp(obj)
        inp = _int(obj, "input_length", 0)
        out = _int(obj, "output_length", 0)
        self._extend_hashes(_hash_ids(obj))
        self.timestamps.append(ts)
        self.input_lengths.append(inp)
        self.output_lengths.append(out)

    def _add_bailian(self, obj: dict[str, Any]) -> None:
        block_tokens = _block_tokens(obj)
        chat = _int(obj, "chat_id", 0)
        parent = _int(obj, "parent_chat_id", -1)
        ts = _timestamp(obj)
        inp = _int(obj, "input_length", 0)
        out = _int(obj, "output_length", 0)
        type_ = _type(obj)
        turn = _int(obj, "turn", 0)
        hash_ids = _hash_ids(obj)
        # After the fields a line needs, so that a line missing them says so first.
        if self.chat_ids and block_tokens != self.block_tokens:
            said, got = ("none" if n is None else n for n in (self.block_tokens, block_tokens))
            problem = (
                f"expected the earlier lines' block size ({said}), got {got} (a trace gives "
                "block_tokens on every line or on none)"
            )
            raise _Bad("block_tokens", problem, "differs from the earlier lines")
        self._extend_hashes(hash_ids)
        self.chat_ids.append(chat)
        self.parent_chat_ids.append(parent)
        self.timestamps.append(ts)
        self.input_lengths.append(inp)
        self.output_lengths.append(out)
        self.types.append(self._type_names.setdefault(type_, type_))
        self.turns.append(turn)
        self.block_tokens = block_tokens

    def to_trace(self, name: str, skipped: list[tuple[int, str]]) -> Trace:
        def i64(a: array[int]) -> np.ndarray[Any, np.dtype[np.int64]]:
            return np.frombuffer(a, dtype=np.int64) if len(a) else np.zeros(0, np.int64)

        ts = np.frombuffer(self.timestamps, dtype=np.float64) if self.timestamps else np.zeros(0)
        bailian = self.fmt == "bailian"
        trace = Trace.from_arrays(
            name=name,
            source_format=self.fmt,
            hash_ids=self.hashes(),
            lengths=i64(self.lengths),
            timestamps=ts if bailian else ts / 1000.0,  # Mooncake stamps are milliseconds
            types=self.types if bailian else None,
            turns=i64(self.turns) if bailian else None,
            input_lengths=i64(self.input_lengths),
            output_lengths=i64(self.output_lengths),
            chat_ids=i64(self.chat_ids) if bailian else None,
            parent_chat_ids=i64(self.parent_chat_ids) if bailian else None,
            skipped_lines=skipped,
            block_tokens=self.block_tokens,
        )
        return prefix_chained(trace)


def _detect_format(obj: dict[str, Any]) -> str:
    """``bailian`` or ``mooncake`` from one line's keys; ``_Bad`` when neither fits."""
    if not BAILIAN_KEYS.isdisjoint(obj):
        return "bailian"
    if obj.keys() >= MOONCAKE_KEYS:
        return "mooncake"
    keys = ", ".join(sorted(obj)) or "none"
    problem = (
        f"cannot tell the trace format from the keys ({keys}): Bailian lines carry "
        "chat_id/parent_chat_id/type/turn, Mooncake lines timestamp and hash_ids"
    )
    raise _Bad(None, problem, "unknown format")


class _CountedFile(io.FileIO):
    """A file that counts the bytes read from it, for ``ReadProgress``."""

    consumed = 0

    def readinto(self, buffer: Any) -> int | None:
        n = super().readinto(buffer)
        self.consumed += n or 0
        return n

    def size(self) -> int | None:
        """Bytes in the file; None when it is not a regular file (a pipe)."""
        st = os.fstat(self.fileno())
        return st.st_size if stat.S_ISREG(st.st_mode) else None


def _open(path: str) -> tuple[IO[bytes], _CountedFile]:
    """Plain or gzip, told by the magic bytes (a suffix can lie); another compression is a
    ``TraceError``. The file is opened once and its first bytes peeked, so a pipe
    (``<(zcat ...)``, ``/dev/stdin``) reads too. Returns the lines' reader and the file
    under it, which counts what was read."""
    counted = _CountedFile(path, "rb")
    raw = io.BufferedReader(counted, buffer_size=1 << 20)
    start = raw.peek(8)[:8]
    if start.startswith(_GZIP_MAGIC):
        return cast(IO[bytes], _GzipOver(raw)), counted
    for magic, (name, undo) in _OTHER_COMPRESSIONS.items():
        if start.startswith(magic):
            raw.close()
            problem = f"compressed with {name}, which is not read (gzip is): {undo} it first"
            raise TraceError(path, 1, None, problem)
    return raw, counted


class _GzipOver(gzip.GzipFile):
    """Gzip read from an open file, which it closes with itself (``GzipFile`` leaves a
    file it was given open)."""

    def __init__(self, raw: io.BufferedReader[_CountedFile]) -> None:
        super().__init__(fileobj=raw, mode="rb")
        self._raw = raw

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._raw.close()


def _records(f: IO[bytes], path: str) -> Iterator[tuple[int, bytes, Any]]:
    """(line number, the line, parsed object or ``_Bad``) for every non-blank line."""
    lineno = 0
    try:
        for lineno, line in enumerate(_lines(f), 1):
            if line is None:
                problem = f"line longer than {MAX_LINE_BYTES:,} bytes (no newline within them)"
                yield lineno, b"", _Bad(None, problem, "line too long")
                continue
            if lineno == 1:
                line = _first_line(line, f, path)
            try:
                yield lineno, line, orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                if line.isspace():
                    continue
                problem = f"invalid JSON ({exc.msg}, column {exc.pos + 1})"
                yield lineno, line, _Bad(None, problem, "bad JSON")
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        # A broken stream cannot be skipped past: nothing after it can be read.
        raise TraceError(
            path, lineno + 1, None, f"gzip stream truncated or corrupt ({exc})"
        ) from None


def _first_line(line: bytes, f: IO[bytes], path: str) -> bytes:
    """The first line without a byte order mark; ``TraceError`` when it shows that the
    file is a Git LFS pointer, which no skipping can read a trace from."""
    if line.startswith(_BOM):
        line = line[len(_BOM) :]
    if not line.startswith(_LFS_POINTER):
        return line
    size = re.search(rb"^size (\d+)", f.read(4096), re.MULTILINE)
    what = f"the {int(size[1]):,}-byte trace" if size else "the trace"
    problem = (
        f"a Git LFS pointer, not a trace: {what} was never downloaded "
        "(git lfs pull in the clone, or download the file itself)"
    )
    raise TraceError(path, 1, None, problem)


def _lines(f: IO[bytes]) -> Iterator[bytes | None]:
    """Every line of ``f``; None for a line longer than ``MAX_LINE_BYTES``, which is read
    past in pieces of that size."""
    limit = MAX_LINE_BYTES + 1  # the line and its newline
    while line := f.readline(limit):
        if len(line) < limit or line.endswith(b"\n"):
            yield line
            continue
        while (rest := f.readline(limit)) and not rest.endswith(b"\n"):
            pass
        yield None


def load_trace(
    path: str | os.PathLike[str],
    *,
    fmt: TraceFormat = "auto",
    skip_bad_lines: bool = False,
    progress: ReadProgress | None = None,
) -> Trace:
    """Read a Bailian or Mooncake JSONL trace (plain or gzip) into a ``Trace``.

    ``fmt="auto"`` decides from the first line that is a JSON object. A malformed line
    raises ``TraceError`` naming file, line and field; with ``skip_bad_lines`` it is left
    out and recorded, ``(line, reason)``, in ``Trace.skipped_lines`` (every skipped line is
    recorded; reasons past ``MAX_SKIP_DETAILS`` are short). Blank lines are ignored.
    ``progress``, if given, is told how many bytes of the file are read (``ReadProgress``).
    Raises ``OSError`` when the file cannot be read.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown trace format {fmt!r}; known formats: {', '.join(FORMATS)}")
    shown = os.fspath(path)
    columns = None if fmt == "auto" else _Columns(fmt)
    skipped: list[tuple[int, str]] = []
    brief: dict[str, str] = {}  # shared short reasons past MAX_SKIP_DETAILS
    f, counted = _open(shown)
    with f:
        size, told = counted.size(), 0
        for lineno, line, obj in _records(f, shown):
            if progress is not None and counted.consumed != told:
                told = counted.consumed
                progress(told, size)
            try:
                if isinstance(obj, _Bad):
                    raise obj
                if type(obj) is not dict:
                    raise _Bad(None, f"expected a JSON object, got {_shown(obj)}", "not an object")
                if columns is None:
                    columns = _Columns(_detect_format(obj))
                columns.add(obj)
            except _Bad as bad:
                if bad.inexact and columns is not None:
                    bad = _as_written(bad, line, columns.fmt)
                if not skip_bad_lines:
                    raise TraceError(shown, lineno, bad.field, bad.problem) from None
                if len(skipped) < MAX_SKIP_DETAILS:
                    skipped.append((lineno, bad.reason(detailed=True)))
                else:
                    reason = bad.reason(detailed=False)
                    skipped.append((lineno, brief.setdefault(reason, reason)))
        if progress is not None:
            progress(counted.consumed, size)
    if columns is None:  # nothing readable: an empty trace of unknown format
        columns = _Columns("mooncake")
        columns.fmt = "unknown"
    return columns.to_trace(_name(shown), skipped)


_DESCRIPTOR = re.compile(r"/(?:dev|proc/(?:self|\d+))/fd/(\d+)")
"""A path that names an open file descriptor, not a file (``<(zcat t.gz)`` is
``/dev/fd/63``)."""


def _name(path: str) -> str:
    """What reports call the trace at ``path``: its file's name. A descriptor's number
    means nothing to the reader: descriptor 0 is ``stdin`` (as ``/dev/stdin`` is), another
    the name of the file it has open, or ``pipe``."""
    descriptor = _DESCRIPTOR.fullmatch(path)
    if descriptor is None:
        return Path(path).name
    if descriptor[1] == "0":
        return "stdin"
    opened = os.path.realpath(path)
    return Path(opened).name if os.path.isfile(opened) else "pipe"

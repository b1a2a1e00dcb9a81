"""``Trace`` -> Bailian JSONL: the inverse of the Bailian reader.

Owns ``write_bailian``: one JSON object per request in replay order, with the keys of the
public ``qwen_trace*_blksz_16.jsonl`` files (``chat_id``, ``parent_chat_id``,
``timestamp``, ``input_length``, ``output_length``, ``type``, ``turn``, ``hash_ids``, and
``block_tokens`` on every line when the trace says its block size) and the trace's original
hash ids (``trace.hashes[trace.blocks]``), so reading the file back
gives the same arrays. A name ending in ``.gz`` (any case) is written gzip-compressed, its header
naming the file without ``.gz`` (as gzip(1) does), never the temporary file it is written
to. ``write_bailian_stream`` writes the same lines to an open stream (standard output).
A device, a pipe or a name under ``/dev`` or ``/proc`` (``/dev/stdout``) is written as it
goes, never replaced. It must never change the trace (no re-numbering, no re-timing) or
write any other format.
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path
from typing import IO, cast

import numpy as np
import orjson

from controlplane.traces.model import Trace

_OPTIONS = orjson.OPT_APPEND_NEWLINE | orjson.OPT_SERIALIZE_NUMPY


def write_bailian(
    trace: Trace, path: str | os.PathLike[str], *, final_name: str | None = None
) -> None:
    """Write ``trace`` as Bailian JSONL at ``path`` (gzip when the name ends in ``.gz``).

    ``final_name``: the name the file will bear once its writer renames it (default:
    ``path``'s); a gzip header records it, without ``.gz``, for ``gunzip -N``.

    Raises ``ValueError`` when the trace lacks the Bailian metadata (a Mooncake trace has
    no type, turn or chat id), ``OSError`` when the file cannot be written.
    """
    _check_bailian(trace)
    target = Path(path)
    if is_written_through(target):
        _write_records(trace, target, gzip_name=None)
        return
    gzip_name = _without_gz(final_name or target.name) if _gzipped(target.name) else None
    # Whole or not at all: an interrupted write (Ctrl-C, a full disk) leaves what was there.
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    try:
        _write_records(trace, partial, gzip_name=gzip_name)
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)


def write_bailian_stream(trace: Trace, stream: IO[bytes]) -> None:
    """Write ``trace`` as plain Bailian JSONL to ``stream``, an open binary stream
    (standard output for ``-o -``), left open: whatever stdout is (a pipe, a terminal, a
    file the shell opened, for appending or not), the lines go where it points.

    Raises ``ValueError`` as ``write_bailian`` does.
    """
    _check_bailian(trace)
    _write_lines(trace, stream)
    stream.flush()


def is_written_through(path: Path) -> bool:
    """Whether ``path`` is written as it goes rather than replaced whole: a device or a pipe,
    or an existing name under ``/dev`` or ``/proc``. ``/dev/stdout`` redirected to a file
    is a regular file behind a link: replacing it would replace the link in ``/dev`` (or
    fail there without root), never write the file the shell opened."""
    if not path.exists():
        return False
    return not path.is_file() or path.absolute().parts[1:2] in (("dev",), ("proc",))


def _check_bailian(trace: Trace) -> None:
    if trace.n_requests and (
        not all(trace.type_names)
        or np.any(trace.turns < 0)
        or np.any(trace.chat_ids < 0)
        or np.any(trace.input_lengths < 0)
        or np.any(trace.output_lengths < 0)
    ):
        raise ValueError(
            f"{trace.name}: not a Bailian trace (types, turns, chat ids and token counts "
            "are needed); convert it with its own format's tools"
        )


def _gzipped(name: str) -> bool:
    return name.lower().endswith(".gz")


def _without_gz(name: str) -> str:
    return name[:-3] if _gzipped(name) else name


def _write_records(trace: Trace, target: Path, *, gzip_name: str | None) -> None:
    """``gzip_name``: compress, the header naming the file so (None: plain JSONL)."""
    with open(target, "wb") as raw, _compressed(raw, gzip_name) as f:
        _write_lines(trace, f)


def _write_lines(trace: Trace, f: IO[bytes]) -> None:
    """One JSON object a line for each request of ``trace``, in replay order, to ``f``."""
    hashes = trace.hashes[trace.blocks]  # original ids, serialised straight from numpy
    offsets = trace.offsets.tolist()
    columns = zip(
        trace.chat_ids.tolist(),
        trace.parent_chat_ids.tolist(),
        trace.timestamps.tolist(),
        trace.input_lengths.tolist(),
        trace.output_lengths.tolist(),
        trace.types.tolist(),
        trace.turns.tolist(),
        strict=True,
    )
    lines = []
    for r, (chat, parent, ts, inp, out, type_code, turn) in enumerate(columns):
        record = {
            "chat_id": chat,
            "parent_chat_id": parent,
            "timestamp": ts,
            "input_length": inp,
            "output_length": out,
            "type": trace.type_names[type_code],
            "turn": turn,
            "hash_ids": hashes[offsets[r] : offsets[r + 1]],
        }
        if trace.block_tokens is not None:
            record["block_tokens"] = trace.block_tokens
        lines.append(orjson.dumps(record, option=_OPTIONS))
        if len(lines) >= 4096:  # write in slabs: few syscalls, bounded memory
            f.write(b"".join(lines))
            lines.clear()
    f.write(b"".join(lines))


def _compressed(raw: IO[bytes], gzip_name: str | None) -> IO[bytes]:
    """``raw`` itself, or gzip over it, its header naming ``gzip_name`` (closing the gzip
    stream leaves ``raw`` to its own ``with``)."""
    if gzip_name is None:
        return raw
    # Level 1: on these id lists it writes files ~15 % larger than level 6 in a seventh
    # of the time.
    # GzipFile records the name it is given less one ".gz" (and only in lower case).
    name = f"{gzip_name}.gz"
    return cast(IO[bytes], gzip.GzipFile(name, "wb", compresslevel=1, fileobj=raw))

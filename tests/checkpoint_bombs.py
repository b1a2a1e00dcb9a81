"""Checkpoints that are small in Redis and huge once unpacked, for the checkpoint bound
tests and the load benchmark.

``declaring`` keeps a real checkpoint's members but one, whose array header declares
``declared_bytes`` (of int32 counts by default) and whose data is streamed through the compressor a
megabyte at a time (mostly zeros, so it compresses about a thousand to one): building one
never holds the declared array. ``with_members`` pads an archive's directory with empty
members instead.
"""

from __future__ import annotations

import io
import zipfile

import numpy as np

CHUNK_BYTES = 1 << 20


def declaring(
    checkpoint: bytes,
    declared_bytes: int,
    *,
    member: str = "gaps",
    dtype: str = "<i4",
    noise: float = 0.0,
) -> bytes:
    """``checkpoint`` with ``member`` replaced by a flat array of ``dtype`` declaring
    ``declared_bytes`` (a multiple of its size), zeros but for a ``noise`` share of int32
    ones at seeded random places (so the archive grows with ``noise``)."""
    out = io.BytesIO()
    rng = np.random.default_rng(0)
    shape = (declared_bytes // np.dtype(dtype).itemsize,)
    with (
        zipfile.ZipFile(io.BytesIO(checkpoint)) as real,
        zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as bomb,
    ):
        for info in real.infolist():
            if info.filename != f"{member}.npy":
                bomb.writestr(info.filename, real.read(info))
                continue
            with bomb.open(info.filename, "w", force_zip64=True) as fp:
                header = {"descr": dtype, "fortran_order": False, "shape": shape}
                np.lib.format.write_array_header_1_0(fp, header)
                for start in range(0, declared_bytes, CHUNK_BYTES):
                    n = min(CHUNK_BYTES, declared_bytes - start) // 4
                    fp.write((rng.random(n) < noise).astype("<i4").tobytes())
    return out.getvalue()


def with_members(checkpoint: bytes, extra: int) -> bytes:
    """``checkpoint`` with ``extra`` empty members added to its archive."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(checkpoint)) as real, zipfile.ZipFile(out, "w") as padded:
        for info in real.infolist():
            padded.writestr(info.filename, real.read(info))
        for i in range(extra):
            padded.writestr(f"extra{i}.npy", b"")
    return out.getvalue()

"""The checkpoint's stored form: a round trip, and every kind of damage refused as one
``CheckpointError`` (never another exception a leader's tick would die of)."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

from controlplane.fit.reuse_window import ReuseStats
from controlplane.service.checkpoint import CheckpointError, decode, encode


def _stored() -> bytes:
    stats = ReuseStats(100.0, n_buckets=10, categories=["a"])
    return encode(stats.state(), writer="w", taken_at=1.0)


def _archive(**arrays: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.savez_compressed(out, **arrays)
    return out.getvalue()


def _header(**fields: object) -> np.ndarray:
    return np.frombuffer(json.dumps(fields).encode(), np.uint8)


def test_a_checkpoint_reads_back() -> None:
    loaded = decode(_stored())
    assert loaded.state.names == ("a",) and loaded.writer == "w" and loaded.taken_at == 1.0


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(b"not a checkpoint", id="garbage"),
        pytest.param(b"PK\x03\x04" + b"\x00" * 64, id="a zip cut short"),
        pytest.param(_stored()[: len(_stored()) // 2], id="truncated"),
        pytest.param(_archive(edges=np.zeros(3)), id="no header"),
        pytest.param(_archive(header=_header(format=1)), id="a header without its fields"),
        pytest.param(_archive(header=np.zeros(4, np.uint8)), id="a header that is not JSON"),
    ],
)
def test_any_damage_is_a_checkpoint_error(raw: bytes) -> None:
    with pytest.raises(CheckpointError, match="checkpoint"):
        decode(raw)

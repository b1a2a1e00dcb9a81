"""The checkpoint's stored form: a round trip, and every kind of damage refused as one
``CheckpointError`` (never another exception a leader's tick would die of)."""

from __future__ import annotations

import dataclasses
import io
import json
import tracemalloc
import uuid

import numpy as np
import pytest

from controlplane.fit.reuse_window import ReuseStats, WindowState
from controlplane.service.checkpoint import CheckpointBounds, CheckpointError, decode, encode
from controlplane.service.settings import MAX_CONSUMER_NAME_CHARS
from tests import checkpoint_bombs


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


def test_a_checkpoint_by_the_longest_consumer_name_reads_back_within_its_bounds() -> None:
    """The writer is the controller's ``consumer_name``: the longest one, in characters
    JSON escapes the most, still fits the header's allowance."""
    stats = ReuseStats(100.0, n_buckets=10, categories=["a"])
    writer = "\U0001f600" * MAX_CONSUMER_NAME_CHARS
    raw = encode(stats.state(), writer=writer, process=uuid.uuid4().hex)
    assert decode(raw, bounds=CheckpointBounds.of(stats, 1)).writer == writer


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


def _bounds(categories: int) -> CheckpointBounds:
    """The bounds of ``_counted``'s window shape with room for ``categories``."""
    return CheckpointBounds.of(ReuseStats(100.0, n_buckets=10), categories)


def _counted() -> WindowState:
    """A window of categories "a" and "b" with accesses and reuses in three buckets."""
    stats = ReuseStats(100.0, n_buckets=10)
    ts = np.array([1.0, 2.0, 15.0, 25.0, 26.0])
    cat = np.array([0, 1, 0, 1, 0], np.int32)
    stats.ingest(ts, cat, ts - 0.5, cat, names=["a", "b"])
    return stats.state()


def _with(field: str, index: tuple[int, ...], value: int, dtype: type = np.int64) -> bytes:
    state = _counted()
    counts = getattr(state, field).astype(dtype)
    counts[index] = value
    return encode(dataclasses.replace(state, **{field: counts}))


def _replaced(**fields: object) -> bytes:
    return encode(dataclasses.replace(_counted(), **fields))  # type: ignore[arg-type]


def _with_header(header: object = None, **fields: object) -> bytes:
    """``_counted`` stored with header ``fields`` replaced (or with ``header`` whole)."""
    with np.load(io.BytesIO(encode(_counted())), allow_pickle=False) as archive:
        arrays = {name: archive[name] for name in archive.files}
    if header is None:
        header = {**json.loads(arrays.pop("header").tobytes()), **fields}
    arrays["header"] = np.frombuffer(json.dumps(header).encode(), np.uint8)
    return _archive(**arrays)


def _buckets(oldest: int, newest: int) -> bytes:
    """``_counted`` (buckets -7 to its head, 2) with its oldest and newest ids replaced."""
    ids = np.sort(_counted().bucket_ids)
    ids[0], ids[-1] = oldest, newest
    return _replaced(bucket_ids=ids)


def test_a_counted_window_reads_back_whole() -> None:
    counted = _counted()
    state = decode(encode(counted), bounds=_bounds(2)).state
    assert state.names == ("a", "b") and int(state.accesses.sum()) > 0
    for field in ("bucket_ids", "accesses", "near_concurrent", "gaps"):
        assert np.array_equal(getattr(state, field), getattr(counted, field))
    assert state.gaps.dtype == np.int32 and state.head == counted.head


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        pytest.param(_replaced(names=("a", 7)), "category 1 (7)", id="a numeric name"),
        pytest.param(_replaced(names=("a", "")), "category 1 (''", id="an empty name"),
        pytest.param(_replaced(names=("a", "a")), "names category 'a' twice", id="a name twice"),
        pytest.param(_with_header(names="ab"), "'names' is 'ab': not a list", id="names a string"),
        pytest.param(_with("accesses", (0, 1), -3), "category 'b': count -3", id="negative"),
        pytest.param(
            _with("gaps", (0, 0, 0), 2**31, np.int64), "not between 0 and 2147483647", id="gap"
        ),
        pytest.param(
            _replaced(accesses=np.full((10, 2), 2**62, np.int64)),
            "sum past 2**63",
            id="counts that overflow once summed",
        ),
        pytest.param(
            _replaced(near_concurrent=np.zeros((10, 2), np.float64)),
            "holds float64 counts",
            id="float counts",
        ),
        pytest.param(
            _replaced(accesses=np.zeros((10, 1), np.int64)), "of shape (10, 1)", id="shape"
        ),
        pytest.param(
            _replaced(gaps=np.zeros((10, 2, 4), np.int32)), "(10, 2, 4)", id="gaps not edges"
        ),
        pytest.param(_buckets(-7, 1), "distinct buckets", id="a bucket twice"),
        pytest.param(_buckets(-8, 2), "outside the window", id="a bucket that left"),
        pytest.param(_buckets(-7, 3), "outside the window", id="a bucket after the head"),
        pytest.param(_replaced(head=None), "outside the window", id="buckets without head"),
        pytest.param(_with_header(dropped=-1), "'dropped' is -1", id="negative dropped"),
        pytest.param(_with_header(n_buckets=True), "'n_buckets' is True", id="a bool"),
        pytest.param(_with_header(window_s=float("nan")), "'window_s' is nan", id="a NaN"),
        pytest.param(_with_header(head=2.5), "'head' is 2.5: not a finite integer", id="head"),
        pytest.param(_with_header(head=10**400), "not a finite integer", id="a huge head"),
        pytest.param(_with_header(writer=3), "'writer' is 3: not a string", id="writer"),
        pytest.param(_with_header([1]), "format [1]", id="a header that is a list"),
    ],
)
def test_a_checkpoint_is_checked_whole(raw: bytes, said: str) -> None:
    with pytest.raises(CheckpointError, match="checkpoint") as refused:
        decode(raw, bounds=_bounds(2))
    assert said in str(refused.value)


def test_more_categories_than_the_window_may_hold_are_refused() -> None:
    raw = encode(_counted())
    assert decode(raw).state.names == ("a", "b")  # no bound: read
    with pytest.raises(CheckpointError, match=r"holds 2 categories > max_categories \(1\)"):
        decode(raw, bounds=_bounds(1))


DECLARED_BYTES = 64 << 20
"""What the bomb's one member declares: a window of ``_bounds(2)`` holds 2,060 gap counts."""


def test_an_archive_declaring_more_than_the_window_holds_is_refused_unpacked() -> None:
    """The gaps member declares 64 MiB of counts in about 64 KiB: refused from its array
    header, before its data is unpacked (the bound is far under what unpacking it takes,
    so it fails for any unpacking first, whatever the allocator)."""
    bomb = checkpoint_bombs.declaring(encode(_counted()), DECLARED_BYTES)
    assert len(bomb) < DECLARED_BYTES // 256
    tracemalloc.start()
    try:
        with pytest.raises(CheckpointError) as refused:
            decode(bomb, bounds=_bounds(2))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert f"'gaps' declares shape ({DECLARED_BYTES // 4},) of int32" in str(refused.value)
    assert "not unpacked" in str(refused.value)
    assert peak < DECLARED_BYTES // 16


def test_an_archive_of_more_members_than_a_checkpoint_is_refused() -> None:
    raw = checkpoint_bombs.with_members(_stored(), 1000)
    with pytest.raises(CheckpointError, match=r"declares 1,006 members in a directory of"):
        decode(raw)


def test_an_archive_without_a_member_is_refused() -> None:
    with np.load(io.BytesIO(_stored()), allow_pickle=False) as archive:
        arrays = {name: archive[name] for name in archive.files if name != "gaps"}
    with pytest.raises(CheckpointError, match=r"holds \['header', 'edges'"):
        decode(_archive(**arrays))


def test_an_array_of_elements_wider_than_a_count_is_refused_unpacked() -> None:
    """One element of 1 MB passes any bound on the count of elements."""
    raw = checkpoint_bombs.declaring(encode(_counted()), 1 << 20, member="edges", dtype="|V1048576")
    with pytest.raises(CheckpointError, match=r"'edges' declares shape \(1,\) of \|V1048576"):
        decode(raw, bounds=_bounds(2))


def test_an_archive_pointing_at_a_zip64_end_record_is_refused() -> None:
    """zipfile would read the zip64 record's member count and directory size instead."""
    raw = _stored()
    at = raw.rfind(b"PK\x05\x06")
    pointed = raw[:at] + b"PK\x06\x07" + bytes(16) + raw[at:]
    with pytest.raises(CheckpointError, match=r"\(zip64\): a checkpoint has 6"):
        decode(pointed)

"""Trace readers on what a downloaded trace file can turn out to be: a Git LFS pointer
instead of the trace, another compression than gzip; and the progress of a long read."""

from __future__ import annotations

import bz2
import gzip
import lzma
import subprocess
import sys
import zipfile
from pathlib import Path

import orjson
import pytest

from controlplane.traces.reader import TraceError, load_trace
from tests.conftest import REPO
from tests.unit.test_reader import bailian, mooncake

LFS_POINTER = (
    b"version https://git-lfs.github.com/spec/v1\n"
    b"oid sha256:" + b"0123456789abcdef" * 4 + b"\n"
    b"size 132054902\n"
)


@pytest.mark.parametrize("skip_bad_lines", [False, True])
def test_a_git_lfs_pointer_is_named_not_read_as_bad_json(
    tmp_path: Path, skip_bad_lines: bool
) -> None:
    """The public Bailian traces are Git LFS objects: a clone without LFS holds a
    three-line pointer under the trace's name, which must say so, even with skipping."""
    path = tmp_path / "qwen_traceA_blksz_16.jsonl"
    path.write_bytes(LFS_POINTER)
    with pytest.raises(TraceError) as err:
        load_trace(path, skip_bad_lines=skip_bad_lines)
    assert (err.value.line, err.value.field) == (1, None)
    assert "Git LFS pointer" in err.value.problem
    assert "132,054,902-byte" in err.value.problem and "git lfs pull" in err.value.problem


def _zstd_frame(body: bytes) -> bytes:
    """A zstd frame's magic number and a header; the reader never gets past the magic."""
    return b"\x28\xb5\x2f\xfd" + b"\x20" + len(body).to_bytes(1, "little") + body


def _zipped(body: bytes, tmp_path: Path) -> bytes:
    archive = tmp_path / "t.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("t.jsonl", body)
    return archive.read_bytes()


@pytest.mark.parametrize(
    ("name", "compress", "tool"),
    [
        ("xz", lzma.compress, "xz -d"),
        ("bzip2", bz2.compress, "bunzip2"),
        ("zstd", _zstd_frame, "zstd -d"),
        ("zip", None, "unzip"),
    ],
)
def test_another_compression_than_gzip_is_named(
    tmp_path: Path, name: str, compress: object, tool: str
) -> None:
    body = orjson.dumps(mooncake(0)) + b"\n"
    data = _zipped(body, tmp_path) if compress is None else compress(body)  # type: ignore[operator]
    path = tmp_path / "t.jsonl.x"
    path.write_bytes(data)
    with pytest.raises(TraceError) as err:
        load_trace(path, skip_bad_lines=True)
    assert (err.value.line, err.value.field) == (1, None)
    assert err.value.problem.startswith(f"compressed with {name}")
    assert tool in err.value.problem


def _big_trace(path: Path, *, compress: bool) -> Path:
    body = b"".join(orjson.dumps(bailian(i, [i, 10**6 + i])) + b"\n" for i in range(40_000))
    path.write_bytes(gzip.compress(body) if compress else body)
    return path


@pytest.mark.parametrize("compress", [False, True])
def test_progress_counts_the_files_bytes_up_to_its_size(tmp_path: Path, compress: bool) -> None:
    path = _big_trace(tmp_path / "t.jsonl", compress=compress)
    size = path.stat().st_size
    calls: list[tuple[int, int | None]] = []
    trace = load_trace(path, progress=lambda done, total: calls.append((done, total)))
    assert trace.n_requests == 40_000
    done = [d for d, _ in calls]
    assert {t for _, t in calls} == {size}
    assert done == sorted(done) and done[-1] == size
    assert len(calls) >= 2 or size < 1 << 20


def test_progress_from_a_pipe_has_no_total(tmp_path: Path) -> None:
    path = _big_trace(tmp_path / "t.jsonl", compress=False)
    code = (
        "from controlplane.traces.reader import load_trace\n"
        "seen = []\n"
        "load_trace('/dev/stdin', progress=lambda d, t: seen.append((d, t)))\n"
        "print(seen[-1][0], {t for _, t in seen} == {None})\n"
    )
    with path.open("rb") as source:
        piped = subprocess.Popen(["cat"], stdin=source, stdout=subprocess.PIPE)
        assert piped.stdout is not None
        res = subprocess.run(
            [sys.executable, "-c", code],
            cwd=REPO,
            stdin=piped.stdout,
            capture_output=True,
        )
        piped.stdout.close()
        piped.wait()
    assert res.stdout.decode().split() == [str(path.stat().st_size), "True"], res.stderr

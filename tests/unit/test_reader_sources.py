"""Trace readers on what a downloaded trace file can turn out to be: a Git LFS pointer
instead of the trace."""

from __future__ import annotations

from pathlib import Path

import pytest

from controlplane.traces.reader import TraceError, load_trace

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

"""Fixtures shared by the end-to-end tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from controlplane.traces.synth import synthesize
from controlplane.traces.writer import write_bailian


@pytest.fixture(scope="session")
def trace_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    """Ten minutes of synthetic to-C traffic and a cache of 10 % of its unique blocks."""
    trace = synthesize("to-c", duration_s=600, qps=3, seed=7)
    path = tmp_path_factory.mktemp("trace") / "toc.jsonl"
    write_bailian(trace, path)
    return path, max(100, trace.n_unique // 10)

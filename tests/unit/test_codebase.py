"""The house rules, checked by the tools that enforce them: ruff, mypy, import-linter."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from tests.conftest import REPO


def _run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)


def test_ruff_clean() -> None:
    res = _run(sys.executable, "-m", "ruff", "check", "agent", "controlplane", "tests")
    assert res.returncode == 0, res.stdout + res.stderr


def test_import_contracts_hold() -> None:
    exe = shutil.which("lint-imports")
    if exe is None:
        pytest.fail("lint-imports not installed: pip install -e '.[test]'")
    res = _run(exe)
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.slow
def test_mypy_strict_clean() -> None:
    res = _run(sys.executable, "-m", "mypy")
    assert res.returncode == 0, res.stdout + res.stderr

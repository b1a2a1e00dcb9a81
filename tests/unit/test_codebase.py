"""The house rules, checked by the tools that enforce them (ruff, mypy, import-linter) and
two of this project's own: short functions, and prose that cites only what the repository
holds."""

from __future__ import annotations

import ast
import re
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


PACKAGES = ("agent", "controlplane")
LONGEST_FUNCTION = 60
"""Lines of the longest function (its decorators and docstring included) in a package."""


def _package_sources() -> list[tuple[str, str]]:
    return [
        (str(path.relative_to(REPO)), path.read_text())
        for package in PACKAGES
        for path in sorted((REPO / package).rglob("*.py"))
    ]


def test_no_function_in_the_packages_is_long() -> None:
    long = [
        f"{name}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for name, text in _package_sources()
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > LONGEST_FUNCTION
    ]
    assert not long, long


def test_the_packages_cite_no_notes_outside_the_repository() -> None:
    """The design notes the project grew from are not shipped: what a reader needs is in
    docs/."""
    outside = re.compile(r"\b(POLICY|DESIGN|ENGINES)\.md\b")
    cited = [
        f"{name}:{n}"
        for name, text in _package_sources()
        for n, line in enumerate(text.splitlines(), 1)
        if outside.search(line)
    ]
    assert not cited, cited


ENGINE_MODULES = {"agent.device_evictor", "agent.integrations.vllm", "agent.integrations.sglang"}
"""The agent modules that may import torch, vllm or sglang."""


def test_the_engine_free_contract_names_every_other_agent_module() -> None:
    """A module left out of the contract could import torch unseen (``reuse_classes`` and
    ``engine_time`` were left out)."""
    import tomllib

    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    (sources,) = [
        c["source_modules"]
        for c in contracts
        if c["type"] == "forbidden"
        and set(c["forbidden_modules"]) == {"torch", "vllm", "sglang"}
        and c["source_modules"] != ["controlplane"]
    ]
    covered = set(sources)
    modules = {
        ".".join(path.relative_to(REPO).with_suffix("").parts)
        for path in (REPO / "agent").rglob("*.py")
        if path.name != "__init__.py"
    }
    left_out = sorted(
        m
        for m in modules - ENGINE_MODULES
        if not any(m == c or m.startswith(c + ".") for c in covered)
    )
    assert not left_out, left_out

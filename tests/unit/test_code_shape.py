"""Functions in the product stay short: none in agent/ or controlplane/ over 60 lines."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

MAX_FUNCTION_LINES = 60
PRODUCT_PACKAGES = ("agent", "controlplane")


def long_functions(source: str, max_lines: int) -> list[tuple[str, int, int]]:
    """(qualified name, first line, length) of each function in ``source`` longer than
    ``max_lines``; the length runs from the ``def`` (or its first decorator) to the last
    line of the body."""
    found: list[tuple[str, int, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                    length = (child.end_lineno or child.lineno) - first + 1
                    if length > max_lines:
                        found.append((name, child.lineno, length))
                visit(child, f"{name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return found


def test_the_checker_measures_from_def_to_last_line() -> None:
    body = "\n".join(f"        x{i} = {i}" for i in range(4))
    source = f"class C:\n    @staticmethod\n    def f():\n{body}\n"
    assert long_functions(source, 4) == [("C.f", 3, 6)]
    assert long_functions(source, 6) == []


def test_no_function_over_60_lines() -> None:
    offenders = [
        f"{path.relative_to(REPO)}:{line} {name} is {length} lines"
        for package in PRODUCT_PACKAGES
        for path in sorted((Path(REPO) / package).rglob("*.py"))
        for name, line, length in long_functions(path.read_text(), MAX_FUNCTION_LINES)
    ]
    assert not offenders, f"over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(offenders)

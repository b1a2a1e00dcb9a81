"""Helpers shared by CLI commands: list parsing, error exits, consoles.

Owns how the CLI reports a user error (one red line naming what was wrong, exit code 2).
It must never contain command logic.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, TypeVar

import typer
from rich.console import Console

if TYPE_CHECKING:
    from controlplane.traces.model import Trace

err_console = Console(stderr=True)
T = TypeVar("T")


def fail(message: str, code: int = 2) -> NoReturn:
    """Print ``message`` as an error and exit with ``code``."""
    err_console.print(f"[bold red]error:[/] {message}", highlight=False)
    raise typer.Exit(code)


def split_list(value: str, what: str) -> list[str]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    if not items:
        fail(f"{what}: empty list")
    return items


def _parse_numbers(
    value: str, what: str, convert: Callable[[str], T], noun: str, rule: Callable[[T], str]
) -> list[T]:
    """Comma-separated ``convert``-ed items; ``rule`` says what is wrong with one ("")."""
    out = []
    for item in split_list(value, what):
        try:
            x = convert(item)
        except ValueError:
            fail(f"{what}: {item!r} is not {noun}")
        problem = rule(x)
        if problem:
            fail(f"{what}: {problem}")
        out.append(x)
    return out


def parse_ints(value: str, what: str) -> list[int]:
    def rule(n: int) -> str:
        return f"{n} is negative" if n < 0 else ""

    return _parse_numbers(value, what, int, "an integer", rule)


def parse_floats(value: str, what: str, *, at_most: float = math.inf) -> list[float]:
    """Comma-separated numbers in (0, ``at_most``]."""

    def rule(f: float) -> str:
        ok = 0 < f <= at_most and f != math.inf
        return "" if ok else f"{f} is not in (0, {at_most:g}]"

    return _parse_numbers(value, what, float, "a number", rule)


def parse_fracs(value: str, what: str) -> list[float]:
    return parse_floats(value, what, at_most=1.0)


def load_trace_or_fail(path: Path, *, skip_bad_lines: bool = False) -> Trace:
    """The trace at ``path``; a file that cannot be read is a one-line error (exit 2),
    skipped lines are counted on stderr."""
    from controlplane.traces.reader import TraceError, load_trace

    try:
        trace = load_trace(path, skip_bad_lines=skip_bad_lines)
    except (OSError, TraceError) as exc:
        fail(str(exc))
    if trace.skipped_lines:
        first = ", ".join(f"line {ln}: {why}" for ln, why in trace.skipped_lines[:3])
        typer.echo(f"skipped {len(trace.skipped_lines)} bad lines ({first})", err=True)
    return trace

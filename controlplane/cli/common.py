"""Helpers shared by CLI commands: list parsing, error exits, consoles.

Owns how the CLI reports a user error (one red line naming what was wrong, exit code 2).
It must never contain command logic.
"""

from __future__ import annotations

from typing import NoReturn

import typer
from rich.console import Console

err_console = Console(stderr=True)


def fail(message: str, code: int = 2) -> NoReturn:
    """Print ``message`` as an error and exit with ``code``."""
    err_console.print(f"[bold red]error:[/] {message}", highlight=False)
    raise typer.Exit(code)


def split_list(value: str, what: str) -> list[str]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    if not items:
        fail(f"{what}: empty list")
    return items


def parse_ints(value: str, what: str) -> list[int]:
    out = []
    for item in split_list(value, what):
        try:
            n = int(item)
        except ValueError:
            fail(f"{what}: {item!r} is not an integer")
        if n < 0:
            fail(f"{what}: {n} is negative")
        out.append(n)
    return out


def parse_fracs(value: str, what: str) -> list[float]:
    out = []
    for item in split_list(value, what):
        try:
            f = float(item)
        except ValueError:
            fail(f"{what}: {item!r} is not a number")
        if not 0 < f <= 1:
            fail(f"{what}: {f} is not in (0, 1]")
        out.append(f)
    return out

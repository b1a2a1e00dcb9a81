"""The ``kvwise`` command line: ``main`` (the console entry point) and ``app``.

Owns only the entry point, and loads nothing heavy itself: the app and its command modules
(``controlplane.cli.root``) load inside ``main``, so a Ctrl-C while they load ends the
command with one line and exit code 130, as one during a command does, not a traceback.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import typer

INTERRUPTED = 130
"""Exit code of a command ended by Ctrl-C (128 + SIGINT), as Typer gives one mid-command."""


def main() -> None:
    """Run ``kvwise``; a Ctrl-C before the command starts ends it in one line."""
    try:
        from controlplane.cli.root import app
    except KeyboardInterrupt:
        print("kvwise: interrupted", file=sys.stderr)
        raise SystemExit(INTERRUPTED) from None
    app()


def __getattr__(name: str) -> typer.Typer:
    """``controlplane.cli.app``, the Typer app, loaded on first use."""
    if name == "app":
        from controlplane.cli.root import app

        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

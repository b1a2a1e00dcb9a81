"""Click's own usage errors in the CLI's one-line style: ``error: --split: must be in
(0, 1), got 1.5``, exit code 2, as ``common.fail`` prints the errors a command finds.

Owns ``OneLineUsageErrors``, the app's group class. Click finds some errors before a
command runs (an unknown option, a value its type or bounds refuse, a missing argument),
and Typer printed those as a boxed panel under the usage line, unlike every other error.
It must never change what is accepted, nor touch the help shown when no command is given
(click raises that as a usage error too).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import typer
from typer.core import TyperGroup

from controlplane.cli.common import say

click_errors: Any = importlib.import_module(typer.BadParameter.__module__)
"""Click's exceptions as Typer raises them: click's own, or the copy of click that Typer
0.2x carries inside it."""


class OneLineUsageErrors(TyperGroup):
    """The root group: a usage error found while parsing any command is one line."""

    def make_context(
        self, info_name: str | None, args: list[str], parent: Any = None, **extra: Any
    ) -> Any:
        with _in_one_line():
            return super().make_context(info_name, args, parent, **extra)

    def invoke(self, ctx: Any) -> Any:
        with _in_one_line():
            return super().invoke(ctx)


@contextmanager
def _in_one_line() -> Iterator[None]:
    try:
        yield
    except click_errors.UsageError as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":  # the help, already shown
            raise
        say(_said(exc), lead="error: ")
        raise typer.Exit(exc.exit_code) from None


def _said(exc: Any) -> str:
    """``exc`` as ``--option: what is wrong`` for a refused value; else click's words,
    then where the command's options are listed."""
    param = getattr(exc, "param", None)
    if param is not None and not isinstance(exc, click_errors.MissingParameter):
        named = param.opts[0] if param.param_type_name == "option" else param.human_readable_name
        return f"{named}: {exc.message.removeprefix('Value error, ').rstrip('.')}"
    message = exc.format_message().rstrip(".")
    command = exc.ctx.command_path if exc.ctx is not None else "kvwise"
    return f"{message[:1].lower()}{message[1:]}; try '{command} --help'"

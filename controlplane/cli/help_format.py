"""How ``--help`` shows options and arguments where Typer's own rendering misleads.

Typer 0.29 labels every option without a metavar by its type, flags included
(``--json <bool>``, though ``--json true`` is refused), and writes a required argument
``{TRACE}`` in the usage line (braces read as a choice) beside an optional one's
``[TRACE]``. ``adjust`` makes a flag show no value and a required argument its bare name
(``TRACE``), the usual spelling, optional ones keeping their brackets. It also has help
rendered by ``controlplane.cli.help_markdown``, so an example block stands one blank
line from the text around it, not two. It must never change parsing; it touches
only methods it finds (another Typer version keeps its own).
"""

from __future__ import annotations

from typing import Any

import typer.core


def adjust() -> None:
    """Patch Typer's option, argument and command classes, once (a second call changes
    nothing)."""
    option: Any = typer.core.TyperOption
    argument: Any = typer.core.TyperArgument
    if hasattr(option, "display_type_rich") and not hasattr(option, "_kvwise_type"):
        option._kvwise_type = option.display_type_rich
        option.display_type_rich = _flag_shows_no_value
    if hasattr(argument, "_usage_display_name") and not hasattr(argument, "_kvwise_usage"):
        argument._kvwise_usage = argument._usage_display_name
        argument._usage_display_name = _required_is_bare
    for command in (typer.core.TyperCommand, typer.core.TyperGroup):
        patched: Any = command
        if not hasattr(patched, "_kvwise_help"):
            patched._kvwise_help = patched.format_help
            patched.format_help = _examples_padded_once


def _flag_shows_no_value(self: Any, ctx: Any) -> str | None:
    if self.is_flag and self.metavar is None:
        return None
    shown: str | None = self._kvwise_type(ctx)
    return shown


def _required_is_bare(self: Any) -> str:
    shown: str = self._kvwise_usage()
    if self.required and shown.startswith("{"):
        return shown[1:].replace("}", "", 1)
    return shown


def _examples_padded_once(self: Any, ctx: Any, formatter: Any) -> None:
    """Typer's help, its Markdown read by ``HelpMarkdown``: swapped in only when help is
    shown, as Typer loads its renderer (Markdown and Pygments take 0.1 s to load)."""
    import typer.rich_utils
    from rich.markdown import Markdown

    from controlplane.cli.help_markdown import HelpMarkdown

    renderer: Any = typer.rich_utils
    if getattr(renderer, "Markdown", None) is Markdown:
        renderer.Markdown = HelpMarkdown
    self._kvwise_help(ctx, formatter)

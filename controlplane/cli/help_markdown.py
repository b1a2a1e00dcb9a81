"""The Markdown that ``--help`` renders: Rich's, an example block padded only at its sides.

Rich gives a code block (an indented example in a command's help) a blank line above and
below of its own, beside the one Markdown puts between blocks: two blank lines around
every "Examples:" block. Owns that one change; loaded only when help is shown
(``controlplane.cli.help_format`` swaps it in). It must never change what help says.
"""

from __future__ import annotations

from typing import ClassVar

from rich.console import Console, ConsoleOptions, RenderResult
from rich.markdown import CodeBlock, Markdown, MarkdownElement
from rich.syntax import Syntax


class ExampleBlock(CodeBlock):
    """An indented example: one space at each side, no blank line of its own."""

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        code = str(self.text).rstrip()
        yield Syntax(code, self.lexer_name, theme=self.theme, word_wrap=True, padding=(0, 1))


class HelpMarkdown(Markdown):
    """Markdown whose code blocks are ``ExampleBlock``s."""

    elements: ClassVar[dict[str, type[MarkdownElement]]] = {
        **Markdown.elements,
        "code_block": ExampleBlock,
        "fence": ExampleBlock,
    }

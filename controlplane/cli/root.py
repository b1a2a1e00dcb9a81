"""The ``kvwise`` app: one Typer app, one module per command group.

Owns argument parsing and rendering only; every command calls into library code. Command
modules import their heavy dependencies inside the command, so ``kvwise --help`` is fast.
Help text is Markdown (paragraphs reflow to the terminal's width; indented lines are
examples, kept as they are).
"""

from __future__ import annotations

from typing import Annotated

import typer

from controlplane.cli import (
    bench_cmd,
    config_cmd,
    controller_cmd,
    demo_cmd,
    help_format,
    replay_cmd,
    simulate_cmd,
    trace_cmd,
    worker_cmd,
)
from controlplane.cli.usage_errors import OneLineUsageErrors

help_format.adjust()
app = typer.Typer(
    name="kvwise",
    cls=OneLineUsageErrors,
    help=(
        "kvwise: a KV-cache eviction control plane for LLM inference servers.\n\n"
        "Replay traces through eviction policies, fit per-category reuse models, and run "
        "the live controller that pushes fitted policies to every worker.\n\n"
        "Examples:\n\n"
        "    kvwise demo\n"
        "    kvwise trace synth --profile to-c --duration 600 -o toc.jsonl.gz\n"
        "    kvwise replay toc.jsonl.gz -p lru,s3fifo,wa --capacity-frac 0.05,0.1\n"
        "    kvwise controller --port 8080"
    ),
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},  # every command inherits it
    rich_markup_mode="markdown",
    pretty_exceptions_enable=False,
)


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"kvwise {version('kvwise')}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version and exit"
        ),
    ] = False,
) -> None:
    """kvwise: a KV-cache eviction control plane for LLM inference servers."""


for module in (
    demo_cmd,
    replay_cmd,
    simulate_cmd,
    trace_cmd,
    bench_cmd,
    controller_cmd,
    config_cmd,
    worker_cmd,
):
    module.register(app)

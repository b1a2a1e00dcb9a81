"""The command line of a benchmark script: its options read into the keyword arguments of
its ``run``, and the Redis URL those that need a Redis take by default. Never runs or
measures anything itself."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

REDIS_URL = "redis://127.0.0.1:6379/0"
"""The Redis a benchmark uses unless ``--redis-url`` names another."""


def run_from_command_line(
    doc: str | None,
    run: Callable[..., object],
    argv: Sequence[str] | None = None,
    **defaults: float | str | bool,
) -> None:
    """Call ``run`` with one keyword argument for each of ``defaults``, read from the option
    ``--name-with-dashes`` (of its default's type; a ``False`` default makes a flag) or left
    at its default. ``--help`` prints the script's docstring ``doc``, which says what each
    option means, and each option's default."""
    parser = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    for name, default in defaults.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(default, bool):
            if default:
                raise ValueError(f"{flag}: a flag is off unless given, its default False")
            parser.add_argument(flag, action="store_true")
        else:
            parser.add_argument(
                flag, type=type(default), default=default, help="default %(default)s"
            )
    run(**vars(parser.parse_args(argv)))

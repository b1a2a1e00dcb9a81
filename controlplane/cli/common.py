"""What every CLI command shares: user errors, option parsers, option types, trace loading.

Owns how the CLI reports a user error (one red line naming the option, environment
variable or file that was wrong, exit code 2), the parsing of comma-separated option
values (duplicates merged, first order kept), the options several commands declare alike
(a trace argument, ``--json``, ``--skip-bad-lines``), loading a trace for a command (bad
lines reported, an empty trace refused), printing a ``--json`` document, and checking
settings and Redis URLs before a command starts anything. It must never contain command
logic.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar

import typer
from pydantic_settings import BaseSettings
from rich.console import Console
from rich.markup import escape

if TYPE_CHECKING:
    from controlplane.traces.model import Trace

SettingsT = TypeVar("SettingsT", bound=BaseSettings)
NumberT = TypeVar("NumberT", int, float)

err_console = Console(stderr=True)

TraceArgument = Annotated[
    Path, typer.Argument(metavar="TRACE", help="Bailian or Mooncake JSONL trace (.gz ok)")
]
JsonFlag = Annotated[bool, typer.Option("--json", help="One JSON object on stdout")]
JobsOpt = Annotated[
    int,
    typer.Option("--jobs", "-j", min=0, metavar="N", help="Worker processes (0 = one per core)"),
]
SkipBadLinesFlag = Annotated[
    bool,
    typer.Option(
        "--skip-bad-lines", help="Skip malformed trace lines (counted) instead of stopping"
    ),
]


def fail(message: str, code: int = 2) -> NoReturn:
    """Print ``message`` as an error and exit with ``code``."""
    # Wrapped at a terminal's width; one line where the output is read by a program.
    err_console.print(
        f"[bold red]error:[/] {escape(message)}",
        highlight=False,
        soft_wrap=not err_console.is_terminal,
    )
    raise typer.Exit(code)


def counted(n: int, noun: str, plural: str = "") -> str:
    """``n`` and ``noun``, thousands separated, the noun plural (``plural``, by default
    ``noun`` + "s") unless ``n`` is 1: "1 request", "1,234 requests"."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"


def unique(items: Iterable[str]) -> list[str]:
    """``items`` with repeats dropped, first occurrence kept in place."""
    return list(dict.fromkeys(items))


def split_list(value: str, option: str) -> list[str]:
    """The comma-separated items of ``value``, each once; an empty list fails."""
    items = unique(v.strip() for v in value.split(",") if v.strip())
    if not items:
        fail(f"{option}: empty list")
    return items


def check_names(names: list[str], known: Iterable[str], option: str, what: str) -> list[str]:
    """``names`` if each is ``known``; else fail naming the first unknown one."""
    catalog = list(known)
    for name in names:
        if name not in catalog:
            fail(f"{option}: unknown {what} {name!r}; known: {', '.join(catalog)}")
    return names


def policy_names(policy: str) -> list[str]:
    """The replay catalogue's policies ``policy`` names (comma-separated, or ``all``)."""
    import controlplane.shadow.auto_replay  # noqa: F401  (registers auto in the catalogue)
    from controlplane.replay import catalog

    if policy == "all":
        return catalog.names()
    return check_names(split_list(policy, "--policy"), catalog.names(), "--policy", "policy")


THOUSANDS = re.compile(r"[1-9]\d?(,\d{3})+|\d+(,\d{3})*,0\d\d(,\d{3})*")
"""What reads as one number with thousands separators, as the CLI's own tables print
sizes ("1,651", "12,288", "1,000,000"), rather than a list: one or two digits then groups
of three, or any group of three with a leading zero (no one lists a size as "048")."""


def parse_ints(value: str, option: str) -> list[int]:
    """Comma-separated non-negative integers, each once. A value that reads as one number
    with thousands separators (``THOUSANDS``: "1,651", copied from a table) fails rather
    than run the sizes 1 and 651; such a list takes a space after each comma ("1, 651")."""
    if THOUSANDS.fullmatch(value):
        fail(
            f"{option}: {value!r} reads as {value.replace(',', '')} with thousands "
            f"separators, but commas separate sizes: write {value.replace(',', '')} for one "
            f"size, or {value.replace(',', ', ')!r} for a list"
        )
    return _parse_list(value, option, int, "an integer", lambda n: n >= 0, "is negative")


def parse_floats(value: str, option: str, *, at_most: float = math.inf) -> list[float]:
    """Comma-separated numbers in (0, ``at_most``], each once."""
    return _parse_list(
        value,
        option,
        float,
        "a number",
        lambda f: 0 < f <= at_most and f != math.inf,
        f"is not in (0, {at_most:g}]",
    )


def parse_fracs(value: str, option: str) -> list[float]:
    """Comma-separated fractions in (0, 1], each once."""
    return parse_floats(value, option, at_most=1.0)


def _parse_list(
    value: str,
    option: str,
    convert: Callable[[str], NumberT],
    kind: str,
    valid: Callable[[NumberT], bool],
    invalid: str,
) -> list[NumberT]:
    out: list[NumberT] = []
    for item in split_list(value, option):
        try:
            number = convert(item)
        except ValueError:
            fail(f"{option}: {item!r} is not {kind}")
        if not valid(number):
            fail(f"{option}: {number:g} {invalid}")
        out.append(number)
    return list(dict.fromkeys(out))


def positive(text: str) -> float:
    """Typer parser of a finite number > 0 (the error names the option)."""
    value = _number(text)
    if not (value > 0 and math.isfinite(value)):
        raise typer.BadParameter(f"must be a finite number > 0, got {text}")
    return value


def non_negative(text: str) -> float:
    """Typer parser of a finite number >= 0 (the error names the option)."""
    value = _number(text)
    if not (value >= 0 and math.isfinite(value)):
        raise typer.BadParameter(f"must be a finite number >= 0, got {text}")
    return value


def open_fraction(text: str) -> float:
    """Typer parser of a number strictly between 0 and 1."""
    value = _number(text)
    if not 0 < value < 1:
        raise typer.BadParameter(f"must be in (0, 1), got {text}")
    return value


def _number(text: str | float) -> float:
    try:
        return float(text)
    except ValueError:
        raise typer.BadParameter(f"{text!r} is not a number") from None


def load_trace_or_fail(path: Path, *, skip_bad_lines: bool = False) -> Trace:
    """``path`` read as a trace; unreadable, malformed or empty: fail with exit code 2.

    Skipped lines (``skip_bad_lines``) are counted on stderr with the first reasons.
    """
    from controlplane.traces.reader import TraceError, load_trace

    try:
        trace = load_trace(path, skip_bad_lines=skip_bad_lines)
    except OSError as exc:  # "nope.jsonl: No such file or directory", not "[Errno 2] ..."
        fail(f"{path}: {exc.strerror or exc}")
    except TraceError as exc:
        fail(str(exc))
    if trace.skipped_lines:
        first = ", ".join(f"line {ln}: {why}" for ln, why in trace.skipped_lines[:3])
        typer.echo(f"skipped {counted(len(trace.skipped_lines), 'bad line')} ({first})", err=True)
    if trace.n_requests == 0:
        fail(f"{path}: no requests")
    return trace


def trace_json(path: Path, trace: Trace) -> dict[str, object]:
    """What every command's JSON says about the trace it read."""
    return {
        "trace": str(path),
        "requests": trace.n_requests,
        "accesses": trace.n_accesses,
        "unique_blocks": trace.n_unique,
        "skipped_lines": len(trace.skipped_lines),
    }


def print_json(doc: object) -> None:
    """``doc`` as one line of JSON on stdout (what ``--json`` prints)."""
    json.dump(doc, sys.stdout)
    sys.stdout.write("\n")


def settings_or_fail(
    cls: type[SettingsT], overrides: dict[str, Any], options: dict[str, str], *, what: str
) -> SettingsT:
    """``cls`` read from the environment, ``overrides`` on top. A bad value fails naming
    its CLI option (``options``: field -> option) when it came from one, else its
    environment variable (``bad {what} setting KVWISE_...``)."""
    from pydantic import ValidationError

    try:
        return cls(**overrides)
    except ValidationError as exc:
        error = exc.errors()[0]
        reason = error["msg"].removeprefix("Value error, ")
        if not error["loc"]:  # a check across settings names them itself
            fail(f"bad {what} settings: {reason}")
        field = str(error["loc"][0])
        if field in overrides:
            fail(f"{options[field]}: {reason}")
        variable = f"{cls.model_config.get('env_prefix', '')}{field}".upper()
        fail(f"bad {what} setting {variable}: {reason}")


def check_redis_url(url: str, where: str) -> str:
    """``url`` if the agent's and controller's client factory accepts it (nothing is
    connected); else fail naming ``where`` (the option or environment variable it came
    from). The message never shows a password."""
    from agent.runtime.connection import RedisUrlError, connect

    try:
        connect(url, timeout_s=1.0, retries=0).close()
    except RedisUrlError as exc:
        fail(f"{where}: {exc}")
    return url


def check_plotting(option: str, png: Path | None = None, *, folder: Path | None = None) -> None:
    """Fail now, naming ``option``, if figures cannot be drawn (no ``plot`` extra), ``png``
    does not name a PNG file that can be written, or ``folder`` is neither a folder nor
    one that can be made in an existing one."""
    from controlplane.plots.common import (
        PlotsUnavailable,
        check_available,
        check_folder,
        check_path,
    )

    try:
        check_available()
        if png is not None:
            check_path(png)
        if folder is not None:
            check_folder(folder if folder.is_dir() else folder.parent, folder)
    except (PlotsUnavailable, OSError) as exc:
        fail(f"{option}: {exc}")

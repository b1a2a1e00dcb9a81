"""What every CLI command shares: user errors, option parsers, option types, trace loading.

Owns how the CLI reports a user error (one red line naming the option, environment
variable or file that was wrong, exit code 2), the parsing of comma-separated option
values (duplicates merged, first order kept), the options several commands declare alike
(a trace argument, ``--json``, ``--skip-bad-lines``, ``--block-tokens``, the ``--speed``
of simulate and worker, which replay a trace in time: ``kvwise replay`` takes none; each
option names itself, so every command spells it alike), loading a trace
for a command (bad lines reported, an empty trace refused), printing a ``--json``
document, and checking settings, Redis URLs and the configured evictor before a command
starts anything. It must never contain command logic.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from textwrap import wrap
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar, get_args

import typer
from pydantic_settings import BaseSettings
from rich.console import Console
from rich.text import Text

if TYPE_CHECKING:
    from agent.settings import AgentSettings
    from controlplane.service.settings import ControllerSettings
    from controlplane.traces.model import RechainResult, Trace
    from controlplane.traces.reader import ReadProgress, TraceError

SettingsT = TypeVar("SettingsT", bound=BaseSettings)
NumberT = TypeVar("NumberT", int, float)
HashableT = TypeVar("HashableT", bound=Hashable)

err_console = Console(stderr=True)


def whole_number(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    """A Typer parser of a whole number >= ``minimum`` (and <= ``maximum`` when given), the
    error naming the option in the other parsers' words: a ``min=``/``max=`` bound reads
    as pydantic's "Input should be greater than or equal to 1"."""
    bounds = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"

    def parse(text: str) -> int:
        value = as_whole_number(text)
        if value < minimum or (maximum is not None and value > maximum):
            raise typer.BadParameter(f"must be a whole number {bounds}, got {text}")
        return value

    return parse


def as_whole_number(text: str | int) -> int:
    """``text`` as an int; anything else fails as a Typer parser's error."""
    return _read_as(int, text, "a whole number")


def _read_as(kind: Callable[[str | NumberT], NumberT], text: str | NumberT, noun: str) -> NumberT:
    """``text`` read by ``kind`` (int, float); a text it cannot read fails as a Typer
    parser's error saying it is not ``noun``."""
    try:
        return kind(text)
    except ValueError:
        raise typer.BadParameter(f"{text!r} is not {noun}") from None


TraceArgument = Annotated[
    Path, typer.Argument(metavar="TRACE", help="Bailian or Mooncake JSONL trace (.gz ok)")
]
JsonFlag = Annotated[bool, typer.Option("--json", help="One JSON object on stdout")]
JobsOpt = Annotated[
    int,
    typer.Option(
        "--jobs",
        "-j",
        parser=whole_number(0),
        metavar="N",
        help="Worker processes (0 = one per core, within a container's CPU limit)",
    ),
]
RedisUrlOpt = Annotated[
    str | None,
    typer.Option("--redis-url", metavar="URL", help="Redis URL [default: KVWISE_REDIS_URL]"),
]
KeyPrefixOpt = Annotated[
    str | None,
    typer.Option(
        metavar="PREFIX", help="Prefix of kvwise's Redis keys [default: KVWISE_KEY_PREFIX]"
    ),
]
BlockTokensOpt = Annotated[
    int,
    typer.Option(
        "--block-tokens",
        parser=whole_number(1),
        metavar="TOKENS",
        help="Tokens per block of the engine, so per trace block (vLLM on GPUs: 16)",
    ),
]
"""The engine's block size, for the commands that turn trace blocks into tokens or back."""
SkipBadLinesFlag = Annotated[
    bool,
    typer.Option(
        "--skip-bad-lines", help="Skip malformed trace lines (counted) instead of stopping"
    ),
]


def fail(message: str, code: int = 2) -> NoReturn:
    """Print ``message`` as an error and exit with ``code``."""
    say(message, lead="error: ")
    raise typer.Exit(code)


def exit_interrupted(said: str) -> NoReturn:
    """End a command a Ctrl-C cut, after what it could still give: ``said`` on stderr, and
    exit code 130 (``INTERRUPTED``), as Typer ends a command a Ctrl-C reaches."""
    from controlplane.cli import INTERRUPTED

    say(said)
    raise typer.Exit(INTERRUPTED)


def say(text: str, *, lead: str = "") -> None:
    """Print ``lead`` (bold red) and ``text`` on stderr, wrapped between words at 80
    columns or a narrower terminal's width (a path is never cut); one line where a program
    reads it."""
    line = lead + text
    lines = [line]
    if err_console.is_terminal:
        width = min(err_console.width, 80)
        lines = wrap(line, width, break_long_words=False, break_on_hyphens=False) or [line]
    shown = Text("\n".join(lines))
    shown.stylize("bold red", 0, len(lead))
    err_console.print(shown, highlight=False, soft_wrap=True)


def note(text: str) -> None:
    """A note for the reader on stderr, led by ``note:`` and wrapped between words at 80
    columns (or a narrower terminal's width): prose, unlike an error, is not grepped."""
    width = min(err_console.width, 80) if err_console.is_terminal else 80
    lines = wrap("note: " + text, width, break_long_words=False, break_on_hyphens=False)
    typer.echo("\n".join(lines), err=True)


def note_one_category(trace: Trace, names: Sequence[str], categories: str) -> None:
    """Say, on stderr, that fitted policies saw one category when the trace labels every
    request alike (a Mooncake trace): they then rank as lru does."""
    from controlplane.replay import catalog

    fitted = any(catalog.is_fitted(name) for name in names)
    if fitted and len(trace.category_names) == 1 and categories == "labels":
        note(
            f"the trace labels every request {trace.category_names[0]!r}: the fitted policies "
            "see one category. --categories auto infers them."
        )


def refuse_fit_options_unused(
    names: Sequence[str], refit_every: float, reuse_class: str, **given: bool
) -> None:
    """Fail when options of the fitted policies, set to other than their defaults
    (``--refit-every``, ``--reuse-class``, and each of ``given`` that is True, its name the
    option's), come with a --policy that names none of those policies: ``--reuse-class hit
    -p lru`` ran and changed nothing, silently. Refused, as ``--auto-*`` are without auto."""
    from controlplane.replay import catalog
    from controlplane.replay.options import DEFAULT_OPTIONS

    set_options = {
        "--refit-every": refit_every != DEFAULT_OPTIONS.refit_every_s,
        **{"--" + name.replace("_", "-"): is_set for name, is_set in given.items()},
        "--reuse-class": reuse_class != DEFAULT_OPTIONS.reuse_class,
    }
    named = [option for option, is_set in set_options.items() if is_set]
    if not named or any(catalog.is_fitted(name) for name in names):
        return
    fitted = ", ".join(n for n in catalog.names() if catalog.is_fitted(n))
    verb = "applies" if len(named) == 1 else "apply"
    fail(f"{', '.join(named)} {verb} only to the fitted policies ({fitted}); --policy names none")


COMPARE_SMALLER = (
    "Give smaller sizes (--capacity: your engine's KV blocks) to compare the policies."
)
"""The advice of every note that says a cache size evicted nothing."""


def note_no_eviction(trace: Trace, capacities: Iterable[int], where: str = "") -> None:
    """Say, on stderr, which cache sizes hold every block the trace uses: no block is ever
    evicted there, so every policy scores the same (a frequent surprise when a default
    size, a GPU's KV pool, meets a small trace). ``where`` names what holds the cache."""
    whole = sorted(c for c in set(capacities) if c >= trace.n_unique)
    if not whole:
        return
    sizes = ", ".join(f"{c:,}" for c in whole)
    note(
        f"a cache of {sizes} blocks{where} holds all {counted(trace.n_unique, 'unique block')} "
        f"of the trace: nothing is evicted there and every policy scores the same. "
        f"{COMPARE_SMALLER}"
    )


def counted(n: int, noun: str, plural: str = "") -> str:
    """``n`` and ``noun``, thousands separated, the noun plural (``plural``, by default
    ``noun`` + "s") unless ``n`` is 1: "1 request", "1,234 requests"."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"


def signed_percent(change: float) -> str:
    """``change`` as ``+1.2%``; one that rounds to zero reads ``+0.0%``, not ``-0.0%``."""
    text = f"{change:+.1%}"
    return "+0.0%" if text == "-0.0%" else text


def unique(items: Iterable[HashableT]) -> list[HashableT]:
    """``items`` with repeats dropped, first occurrence kept in place."""
    return list(dict.fromkeys(items))


def split_list(value: str, option: str) -> list[str]:
    """The comma-separated items of ``value``, each once; an empty list fails."""
    items = unique(v.strip() for v in value.split(",") if v.strip())
    if not items:
        fail(f"{option}: empty list")
    return items


def check_names(names: list[str], known: Iterable[str], option: str, what: str) -> list[str]:
    """``names`` if each is ``known``; else fail naming the first unknown one, and the
    known name it was surely meant as, if one is (``unknown_name``)."""
    from agent.unknown_names import unknown_name

    catalog = list(known)
    for name in names:
        if name not in catalog:
            fail(f"{option}: {unknown_name(what, name, catalog)}")
    return names


def policy_names(policy: str) -> list[str]:
    """The replay catalogue's policies ``policy`` names (comma-separated, or ``all``
    alone)."""
    import controlplane.shadow.auto_replay  # noqa: F401  (registers auto in the catalogue)
    from controlplane.replay import catalog

    names = split_list(policy, "--policy")
    if names == ["all"]:
        return catalog.names()
    if "all" in names:
        fail("--policy: 'all' stands alone (every policy): give -p all, or names without it")
    return check_names(names, catalog.names(), "--policy", "policy")


NUMBER_WITH_SEPARATORS = re.compile(r"[1-9]\d?(,\d{3})+")
"""One number as the CLI's own tables print it ("1,651", "12,288", "1,000,000") rather
than a list: one or two digits, then groups of three."""
SEPARATED_GROUP = re.compile(r"0\d")
"""An item no one writes as a value of its own ("000", "048"): the rest of a number cut at
its thousands separators."""


INT64_MAX = 2**63 - 1
"""The largest integer option: sizes are counted in int64 arrays, and no cache holds more."""


def parse_ints(value: str, option: str) -> list[int]:
    """Comma-separated non-negative integers, each once; one beyond ``INT64_MAX`` fails."""
    numbers = _parse_list(value, option, int, "an integer", lambda n: n >= 0, "is negative")
    for number in numbers:
        if number > INT64_MAX:
            fail(f"{option}: {number} is too large (at most {INT64_MAX})")
    return numbers


def parse_floats(value: str, option: str, *, at_most: float = math.inf) -> list[float]:
    """Comma-separated numbers in (0, ``at_most``], each once."""
    return _parse_list(
        value,
        option,
        float,
        "a number",
        lambda f: 0 < f <= at_most and f != math.inf,
        "is not a finite number > 0" if at_most == math.inf else f"is not in (0, {at_most:g}]",
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
    _refuse_thousands_separators(value, option)
    out: list[NumberT] = []
    for item in split_list(value, option):
        try:
            number = convert(item)
        except ValueError:
            fail(f"{option}: {item!r} is not {kind}")
        if not valid(number):
            fail(f"{option}: {number:g} {invalid}")
        out.append(number)
    return unique(out)


def _refuse_thousands_separators(value: str, option: str) -> None:
    """Fail if ``value`` reads as numbers written with thousands separators (a size copied
    from a table: "1,651", "10,000,20,000") rather than run their pieces as values, and
    say what to write. A list of small values takes a space after each comma ("1, 651")."""
    items = [item.strip() for item in value.split(",")]
    pieces = any(SEPARATED_GROUP.match(item) for item in items)
    if not pieces and not NUMBER_WITH_SEPARATORS.fullmatch(value):
        return
    merged: list[str] = []
    for item in items:  # a group of three digits goes back onto the number before it
        if merged and len(item) == 3 and item.isdigit():
            merged[-1] += item
        else:
            merged.append(item)
    also = "" if pieces else f", or {value.replace(',', ', ')!r} for a list"
    fail(
        f"{option}: {value!r} reads as numbers with thousands separators, but commas "
        f"separate values: write {','.join(merged)}{also}"
    )


def positive(text: str) -> float:
    """Typer parser of a finite number > 0 (the error names the option)."""
    value = _number(text)
    if not (value > 0 and math.isfinite(value)):
        raise typer.BadParameter(f"must be a finite number > 0, got {text}")
    return value


def ratio(text: str) -> float:
    """Typer parser of a number in [0, 1] (the error names the option)."""
    value = _number(text)
    if not 0 <= value <= 1:
        raise typer.BadParameter(f"must be a number in [0, 1], got {text}")
    return value


def finite_at_least(minimum: float) -> Callable[[str], float]:
    """A Typer parser of a finite number >= ``minimum`` (the error names the option): a
    bound typed as ``min=`` lets ``inf`` and ``nan`` through."""

    def parse(text: str) -> float:
        value = _number(text)
        if not (value >= minimum and math.isfinite(value)):
            raise typer.BadParameter(f"must be a finite number >= {minimum:g}, got {text}")
        return value

    return parse


non_negative = finite_at_least(0.0)
"""Typer parser of a finite number >= 0 (the error names the option)."""
SpeedOpt = Annotated[
    float,
    typer.Option(
        "--speed",
        parser=positive,
        metavar="FACTOR",
        help="Replay speed: trace time divided by this",
    ),
]
"""How much faster than the trace a command that replays it in time runs (2: twice)."""
StatusEveryOpt = Annotated[
    float,
    typer.Option(
        "--status-every",
        parser=non_negative,
        metavar="SECONDS",
        help="Seconds between status lines on stderr (0 = none)",
    ),
]
"""How often a long-running command says where it is."""


def open_fraction(text: str) -> float:
    """Typer parser of a number strictly between 0 and 1."""
    value = _number(text)
    if not 0 < value < 1:
        raise typer.BadParameter(f"must be in (0, 1), got {text}")
    return value


def _number(text: str | float) -> float:
    return _read_as(float, text, "a number")


def is_stream(path: Path) -> bool:
    """Whether ``path`` is a device, a pipe or a name under ``/dev`` (``/dev/stdout``, even
    redirected to a file): written as it goes, not a file replaced whole."""
    from controlplane.traces.writer import is_written_through

    return is_written_through(path)


def check_writable(path: Path, option: str) -> None:
    """Fail now, naming ``option``, unless ``path`` names a file in a folder that takes
    one (the plots' check; ``path`` itself is not touched): before minutes of work, not
    after. A device or a pipe that exists (``/dev/stdout``) passes."""
    from controlplane.plots.common import check_folder

    if path.is_dir():
        fail(f"{option} {path}: is a folder")
    if is_stream(path):
        return
    try:
        check_folder(path.parent, path)
    except OSError as exc:
        fail(f"{option} {exc}")


def load_trace_or_fail(path: Path, *, skip_bad_lines: bool | None = None) -> Trace:
    """``path`` read as a trace; unreadable, malformed or empty: fail with exit code 2.

    Skipped lines (``skip_bad_lines``) are counted on stderr with the first reasons, and
    ids re-chained by prefix (``Trace.rechained``) are said there once. ``None``: the
    command has no ``--skip-bad-lines``, so a malformed line's error does not offer it.
    """
    from controlplane.traces.reader import TraceError, load_trace

    try:
        with _reading(path) as progress:
            trace = load_trace(path, skip_bad_lines=bool(skip_bad_lines), progress=progress)
    except OSError as exc:  # "nope.jsonl: No such file or directory", not "[Errno 2] ..."
        fail(f"{path}: {exc.strerror or exc}")
    except TraceError as exc:
        fail(str(exc) + (_not_json_lines_hint(exc) or _skip_hint(exc, skip_bad_lines)))
    if trace.skipped_lines:
        say(_skipped_text(trace.skipped_lines))
    if trace.n_requests == 0:
        fail(f"{path}: no requests")
    if trace.rechained is not None:
        note(_rechained_text(trace.rechained))
    return trace


def _skipped_text(skipped: tuple[tuple[int, str], ...], *, shown: int = 3) -> str:
    """``skipped N bad lines (line 2: why, ..., and M more)``: the first ``shown`` reasons,
    and how many were left out, so that the ones quoted do not read as all of them."""
    first = listed([f"line {line}: {why}" for line, why in skipped], shown)
    return f"skipped {counted(len(skipped), 'bad line')} ({first})"


def listed(items: Sequence[str], shown: int) -> str:
    """The first ``shown`` of ``items``, comma-separated, and how many were left out
    (``a, b, c, and 7 more``), so that a list quoted in a line stays bounded."""
    first = list(items[:shown])
    if len(items) > shown:
        first.append(f"and {len(items) - shown:,} more")
    return ", ".join(first)


def _rechained_text(found: RechainResult) -> str:
    """Why the ids were re-chained, for the note ``load_trace_or_fail`` prints."""
    ids, requests = found.ids_after_several_blocks, found.requests_repeating_an_id
    follow = "follows" if ids == 1 else "follow"
    repeat = "repeats" if requests == 1 else "repeat"
    return (
        f"hash_ids are not prefix-chained ({counted(ids, 'id')} {follow} more than one "
        f"block, {counted(requests, 'request')} {repeat} an id): ids re-chained by prefix, "
        "as an engine's prefix cache keys blocks"
    )


def _not_json_lines_hint(exc: TraceError) -> str:
    """A hint when the first line is not JSON at all (a CSV file, say): the parser's own
    words ("invalid literal, expected 'true'") do not say what a trace must be."""
    if exc.line == 1 and exc.field is None and exc.problem.startswith("invalid JSON"):
        return "; a trace must be JSON Lines, one JSON object a line (Bailian or Mooncake)"
    return ""


def _skip_hint(exc: TraceError, skip_bad_lines: bool | None) -> str:
    """Where the command has ``--skip-bad-lines``, the way past one malformed line in a
    long trace; not for what no skipping reads past (another compression, a Git LFS
    pointer, a broken gzip stream)."""
    whole_file = exc.field is None and (exc.line == 1 or exc.problem.startswith("gzip"))
    return (
        "; --skip-bad-lines skips such lines" if skip_bad_lines is False and not whole_file else ""
    )


_MIB = 1 << 20


@contextmanager
def _reading(path: Path) -> Iterator[ReadProgress | None]:
    """On a terminal, a status line while ``path`` is read (a large trace takes seconds to
    minutes): a spinner and how far the read has got (``reading_status``), told by the
    reader's progress hook, which this yields; elsewhere nothing, and no hook."""
    if not err_console.is_terminal:
        yield None
        return
    with err_console.status(reading_status(path, 0, None), spinner="dots") as status:

        def progress(read: int, size: int | None) -> None:
            status.update(reading_status(path, read, size))

        yield progress


def reading_status(path: Path, read: int, size: int | None) -> Text:
    """The status line while a trace is read: ``reading t.jsonl`` at first, then
    ``reading t.jsonl: 12.0 of 340.5 MiB (4%)`` (bytes of the file as stored), or only
    what was read when the size is unknown (a pipe). Plain text: a path is never markup."""
    if read == 0:
        return Text(f"reading {path}")
    done = f"{read / _MIB:,.1f}"
    if size is None or size <= 0:
        return Text(f"reading {path}: {done} MiB")
    return Text(f"reading {path}: {done} of {size / _MIB:,.1f} MiB ({read / size:.0%})")


def trace_json(path: Path, trace: Trace) -> dict[str, object]:
    """What every command's JSON says about the trace it read."""
    return {
        "trace": str(path),
        "requests": trace.n_requests,
        "accesses": trace.n_accesses,
        "unique_blocks": trace.n_unique,
        "skipped_lines": len(trace.skipped_lines),
        "rechained": None if trace.rechained is None else asdict(trace.rechained),
    }


def print_json(doc: object) -> None:
    """``doc`` as one line of JSON on stdout (what ``--json`` prints)."""
    json.dump(doc, sys.stdout)
    sys.stdout.write("\n")


def settings_or_fail(
    cls: type[SettingsT], given: dict[str, Any], options: dict[str, str], *, what: str
) -> SettingsT:
    """``cls`` read from the environment, a command's options on top (``given``: field ->
    the option's value, None where it was not given). A bad value fails naming its CLI
    option (``options``: field -> option) when it came from one, else its environment
    variable (``bad {what} setting KVWISE_...``)."""
    from pydantic import ValidationError

    overrides = {field: value for field, value in given.items() if value is not None}
    try:
        return cls(**overrides)
    except ValidationError as exc:
        error = exc.errors()[0]
        reason = error["msg"].removeprefix("Value error, ")
        if not error["loc"]:  # a check across settings names them itself
            fail(f"bad {what} settings: {reason}")
        field = str(error["loc"][0])
        value = _given(cls, field, error.get("input"))
        if field in overrides:
            fail(f"{options[field]}{value}: {reason}")
        variable = f"{cls.model_config.get('env_prefix', '')}{field}".upper()
        fail(f"bad {what} setting {variable}{value}: {reason}")


def _given(cls: type[BaseSettings], field: str, value: object) -> str:
    """The bad value for the error line (``='abc'``), or nothing: never a secret's, and a
    password inside a URL is masked."""
    from pydantic import SecretStr

    from agent.runtime.connection import redact

    declared = cls.model_fields.get(field)
    if declared is None or not isinstance(value, str):
        return ""
    annotation = declared.annotation
    if annotation is SecretStr or SecretStr in get_args(annotation):
        return ""
    shown = redact(value)
    return f"={shown[:60] + '...' if len(shown) > 60 else shown!r}"


def agent_settings_or_fail(given: dict[str, Any], options: dict[str, str]) -> AgentSettings:
    """The agent's settings with a command's options ``given`` (``settings_or_fail``), its
    Redis URL checked, naming ``--redis-url`` or ``KVWISE_REDIS_URL``, where it came from."""
    from agent.settings import AgentSettings

    settings = settings_or_fail(AgentSettings, given, options, what="agent")
    where = "--redis-url" if given.get("redis_url") is not None else "KVWISE_REDIS_URL"
    check_redis_url(settings.redis_url, where)
    return settings


def warn_unless_agents_fit(controller: ControllerSettings, agent: AgentSettings) -> None:
    """Warn on stderr where an agent of this environment could name more categories than a
    controller of this environment takes from one worker: it would dead-letter that
    agent's every entry from then on (the chart refuses the same values at install)."""
    from agent.settings import category_limit_by_deprecated_name

    limit, per_worker = agent.max_tracked_categories, controller.max_categories_per_worker
    if limit <= per_worker:
        return
    if category_limit_by_deprecated_name() is None:
        named = f"KVWISE_MAX_TRACKED_CATEGORIES ({limit})"
    else:
        named = f"KVWISE_MAX_CATEGORIES ({limit}, deprecated here)"
    typer.echo(
        f"warning: {named} exceeds KVWISE_MAX_CATEGORIES_PER_WORKER ({per_worker}): a "
        "controller of this environment dead-letters every entry of an agent of this "
        "environment once it names more categories than that",
        err=True,
    )


def warn_unknown_variables() -> None:
    """Warn on stderr of each ``KVWISE_*`` variable that nothing reads: a misspelt one
    (``KVWISE_REFIT_INTERVAL`` for ``KVWISE_REFIT_INTERVAL_S``, ``KVWISE_ENABLED``) was
    ignored without a word, its setting left at the default. The agent inside an engine
    warns of the same variables (``agent.setting_names.unread_variables``), in the same words."""
    import os

    from agent.setting_names import unread_variables
    from agent.unknown_names import not_a_setting

    for name, close in unread_variables(os.environ):
        say(not_a_setting(name, close), lead="warning: ")


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


def check_evictor(settings: AgentSettings, where: str) -> str:
    """The family of the configured evictor, by the rule an agent starts by
    (``agent.runtime.family``); an unknown name fails naming ``where`` (the option or
    environment variable it came from) and every name accepted."""
    from agent.policies import UnknownPolicyError
    from agent.runtime.family import configured_family

    try:
        return configured_family(settings)
    except UnknownPolicyError as exc:
        fail(f"{where}: {exc}")


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
            if folder.exists() and not folder.is_dir():
                raise OSError(f"{folder} is a file: it takes a folder for the figures")
            check_folder(folder if folder.is_dir() else folder.parent, folder)
    except (PlotsUnavailable, OSError) as exc:
        fail(f"{option}: {exc}")

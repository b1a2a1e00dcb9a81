"""``kvwise bench serve``: replay a trace against a real OpenAI-compatible server.

Owns the command's options, its progress display and its output (a table, ``--json``, the
summary file and the per-request JSON lines), and the side-by-side view of two runs
(``--compare``). A ``--controller`` that does not answer never stops a run: it is said
once and the summary keeps the reason; one that refuses its token before the run stops the
command before anything is sent. The tokens (``--api-key``, ``--controller-token``) are
read by ``bench_tokens``; they never reach the summary or the output. The load generator is
``controlplane.loadgen``; trace reading is ``controlplane.traces.reader``.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Annotated, Any

import typer

from controlplane.cli.bench_tokens import (
    CONTROLLER_TOKEN,
    SERVER_KEY,
    Token,
    how_to_give,
    option_help,
    read_token,
    refusal,
)
from controlplane.cli.common import (
    BlockTokensOpt,
    SkipBadLinesFlag,
    check_writable,
    exit_interrupted,
    fail,
    load_trace_or_fail,
    non_negative,
    positive,
    print_json,
    say,
    signed_percent,
    whole_number,
)

if TYPE_CHECKING:
    from rich.console import Console

    from controlplane.loadgen.client import RequestResult
    from controlplane.loadgen.observe import ServerUnreachable
    from controlplane.loadgen.plan import PlannedRequest

bench_app = typer.Typer(
    name="bench",
    help=(
        "Measure a real serving deployment with trace-driven load.\n\n"
        "serve sends a trace's requests to an OpenAI-compatible server at trace times and "
        "writes what it measured; --compare sets two such runs side by side "
        "(docs/bench-serve.md).\n\n"
        "Examples:\n\n"
        "    kvwise bench serve toc.jsonl.gz --url http://127.0.0.1:8000 -o a.json\n"
        "    kvwise bench serve --compare a.json b.json"
    ),
    no_args_is_help=True,
)

PROGRESS_EVERY_S = 10.0
"""Seconds between progress lines when stderr is not a terminal."""
MAX_SUMMARY_BYTES = 256 << 20
"""Bytes of a ``--compare`` file read at most (a summary keeps about 30 bytes a request)."""


def register(app: typer.Typer) -> None:
    app.add_typer(bench_app)


SERVE_HELP = (
    "Send TRACE's requests to an OpenAI-compatible server at trace times and measure time "
    "to first token, latency and prefix-cache hits.\n\n"
    "Each trace block becomes a fixed run of --block-tokens token ids, so the server's "
    "prefix cache sees exactly the trace's sharing. Requests stream; TTFT is timed at the "
    "first token. A labelled trace's categories go as vllm_xargs.kv_category. Exit code 1 "
    "when any request failed.\n\n"
    "Examples:\n\n"
    "    kvwise bench serve trace.jsonl --limit 500 -o a.json\n"
    "    kvwise bench serve --compare a.json b.json"
)


OptionalTraceArgument = Annotated[
    Path | None,
    typer.Argument(metavar="TRACE", help="Bailian or Mooncake JSONL trace (.gz ok)"),
]
UrlOpt = Annotated[str, typer.Option(metavar="URL", help="Server root URL")]
ModelOpt = Annotated[
    str | None,
    typer.Option(metavar="NAME", help="Model to ask for (default: the server's first)"),
]
MAX_VOCAB = 1 << 31
"""The largest ``--vocab``: token ids stay within what servers take (int32)."""
VocabOpt = Annotated[
    int,
    typer.Option(
        parser=whole_number(12, MAX_VOCAB),
        metavar="VOCAB",
        help="Token ids come from [10, VOCAB): the model's or less (12 to 2^31)",
    ),
]
SaltOpt = Annotated[
    int, typer.Option(metavar="N", help="Runs with different salts share no cached tokens")
]
SpeedOpt = Annotated[
    float,
    typer.Option(
        parser=non_negative, metavar="FACTOR", help="Trace seconds per second (0: no waiting)"
    ),
]
LimitOpt = Annotated[
    int | None,
    typer.Option(
        parser=whole_number(1), metavar="N", help="Send only the trace's first N requests"
    ),
]
ConcurrencyOpt = Annotated[
    int,
    typer.Option(
        parser=whole_number(1), metavar="N", help="Requests in flight at most; later ones wait"
    ),
]


def _output_tokens(text: str) -> int:
    """``--max-tokens``: a whole number from 1 to ``MAX_REQUEST_TOKENS`` (imported when an
    option is read, as numpy comes with it), the most a server is asked to generate."""
    from controlplane.traces.model import MAX_REQUEST_TOKENS

    return whole_number(1, MAX_REQUEST_TOKENS)(text)


MaxTokensOpt = Annotated[
    int,
    typer.Option(
        parser=_output_tokens,
        metavar="N",
        help="Output tokens per request: the trace's, capped here (at most 2^24)",
    ),
]
MaxBlocksOpt = Annotated[
    int | None,
    typer.Option(
        parser=whole_number(1), metavar="N", help="Cut longer prompts to their first N blocks"
    ),
]
NoCategoriesFlag = Annotated[bool, typer.Option("--no-categories", help="Send no kv_category")]
TimeoutOpt = Annotated[
    float, typer.Option(parser=positive, metavar="SECONDS", help="Seconds per request at most")
]
ControllerOpt = Annotated[
    str | None,
    typer.Option(metavar="URL", help="kvwise controller URL: report its agents' versions"),
]
ApiKeyOpt = Annotated[
    str | None,
    typer.Option(metavar="KEY", help=option_help(SERVER_KEY, "the server, vLLM's --api-key")),
]
ControllerTokenOpt = Annotated[
    str | None,
    typer.Option(
        metavar="TOKEN", help=option_help(CONTROLLER_TOKEN, "--controller: its read token")
    ),
]
OutputOpt = Annotated[
    Path | None, typer.Option("--output", "-o", help="Write the summary JSON here")
]
RequestsOutOpt = Annotated[
    Path | None, typer.Option("--requests", help="Write one JSON line per request here")
]
JsonOutFlag = Annotated[bool, typer.Option("--json", help="Print the summary as JSON")]
CompareOpt = Annotated[
    tuple[Path, Path] | None,
    typer.Option(metavar="A B", help="Show two saved summaries (-o) side by side"),
]
UnpairedFlag = Annotated[
    bool,
    typer.Option(
        "--unpaired",
        help="--compare runs that sent different requests, without intervals",
    ),
]


@bench_app.command("serve", help=SERVE_HELP)
def serve(
    trace_path: OptionalTraceArgument = None,
    url: UrlOpt = "http://127.0.0.1:8000",
    model: ModelOpt = None,
    block_tokens: BlockTokensOpt = 16,
    vocab: VocabOpt = 1000,
    salt: SaltOpt = 0,
    speed: SpeedOpt = 1.0,
    limit: LimitOpt = None,
    concurrency: ConcurrencyOpt = 64,
    max_tokens: MaxTokensOpt = 64,
    max_blocks: MaxBlocksOpt = None,
    no_categories: NoCategoriesFlag = False,
    timeout: TimeoutOpt = 600.0,
    controller: ControllerOpt = None,
    api_key: ApiKeyOpt = None,
    controller_token: ControllerTokenOpt = None,
    output: OutputOpt = None,
    requests_out: RequestsOutOpt = None,
    json_out: JsonOutFlag = False,
    compare: CompareOpt = None,
    unpaired: UnpairedFlag = False,
    skip_bad_lines: SkipBadLinesFlag = False,
) -> None:
    """Replay a trace against a real server (help: ``SERVE_HELP``)."""
    if compare is not None:
        if trace_path is not None:
            fail("--compare takes two summary files and no TRACE")
        _compare(compare, json_out, unpaired)
        return
    if unpaired:
        fail("--unpaired goes with --compare A.json B.json")
    if trace_path is None:
        fail("missing TRACE (or --compare A.json B.json)")
    run_args = dict(
        url=url, model=model, block_tokens=block_tokens, vocab=vocab, salt=salt, speed=speed,
        limit=limit, concurrency=concurrency, max_tokens=max_tokens, max_blocks=max_blocks,
        categories=not no_categories, timeout=timeout, controller=controller,
    )  # fmt: skip
    tokens = _Tokens(
        read_token(SERVER_KEY, api_key), read_token(CONTROLLER_TOKEN, controller_token)
    )
    if output is not None:
        check_writable(output, "--output")  # now: a run is minutes of a server's time
    summary = _serve(trace_path, run_args, tokens, requests_out, skip_bad_lines, quiet=json_out)
    if json_out:
        print_json(summary)
    else:
        _print_summary(summary)
    if output is not None:  # after the summary is shown: a failed write loses nothing
        try:
            output.write_text(json.dumps(summary, indent=1) + "\n")
        except OSError as exc:
            fail(f"--output {output}: {exc.strerror or exc}")
    if summary["errors"]:
        _say_requests_refused(summary, tokens.server)
        raise typer.Exit(1)


@dataclass(frozen=True)
class _Tokens:
    """The run's two tokens, each for its own service."""

    server: Token
    """``--api-key``: sent to the server only."""
    controller: Token
    """``--controller-token``: sent to the controller only."""


def _serve(
    trace_path: Path,
    args: dict[str, Any],
    tokens: _Tokens,
    requests_out: Path | None,
    skip_bad_lines: bool,
    quiet: bool,
) -> dict[str, Any]:
    from controlplane.loadgen.observe import ServerUnreachable
    from controlplane.loadgen.prompts import TokenSpace
    from controlplane.loadgen.report import summarize
    from controlplane.loadgen.runner import ServerOptions, run_bench

    plan, digest = _plan(trace_path, args, skip_bad_lines)
    base_url = _base_url(args["url"])
    controller = args["controller"].rstrip("/") if args["controller"] else None
    model = args["model"] or _served_model(base_url, tokens.server)
    kvwise = _kvwise_before(controller, tokens.controller) if controller else None
    space = TokenSpace(block_tokens=args["block_tokens"], vocab=args["vocab"], salt=args["salt"])
    server = ServerOptions(
        base_url, model, args["concurrency"], args["timeout"], api_key=tokens.server.value
    )
    lines = _open_lines(requests_out)
    progress = _Progress(len(plan), quiet)
    try:
        with progress:

            def done(result: RequestResult) -> None:
                progress.update(result)
                if lines is not None:
                    _write_line(lines, result)

            run = run_bench(plan, space, server, on_result=done)
    except ServerUnreachable as exc:  # its /metrics, read before anything is sent
        fail(_server_error(exc, tokens.server))
    except KeyboardInterrupt:
        exit_interrupted(_interrupted(progress, requests_out))
    finally:
        if lines is not None:
            lines.close()
    config = {**args, "url": base_url, "model": model, "trace": str(trace_path)}
    summary = summarize(run, config | {"trace_digest": digest})
    if controller and kvwise is not None:
        _kvwise_after(controller, tokens.controller, kvwise)
    summary["kvwise"] = kvwise
    return summary


def _interrupted(progress: _Progress, requests_out: Path | None) -> str:
    """What a Ctrl-C mid-run leaves: it ended silently, the minutes of the run lost
    without a word. A summary covers a whole run, so none is written or printed."""
    kept = f"; {requests_out} holds them" if requests_out is not None else ""
    return (
        f"bench: interrupted after {progress.done:,}/{progress.total:,} requests done"
        f"{kept}; no summary (one covers a whole run: --limit N sends fewer)"
    )


def _served_model(base_url: str, key: Token) -> str:
    """The server's first model; a server that does not list one fails, saying why."""
    import httpx

    from controlplane.loadgen.observe import ServerUnreachable, bearer_headers, served_model

    try:
        with httpx.Client(timeout=30, headers=bearer_headers(key.value)) as client:
            return served_model(client, base_url)
    except ServerUnreachable as exc:
        fail(_server_error(exc, key))


def _server_error(exc: ServerUnreachable, key: Token) -> str:
    """``exc`` with what to do about it: which key to give for a 401 or 403, and what
    ``--url`` is for a 404."""
    from controlplane.loadgen.observe import HttpStatus

    if not isinstance(exc, HttpStatus):
        return str(exc)
    if exc.status == 404:
        return (
            f"{exc}: is this an OpenAI-compatible server? --url is the server's root "
            "(http://host:port)"
        )
    return refusal(SERVER_KEY, key, exc.url, exc.status) or str(exc)


def _say_requests_refused(summary: dict[str, Any], key: Token) -> None:
    """After a run whose requests the server refused (401, 403: ``--model`` skipped the
    check of ``/v1/models``), which key to give."""
    refused = [e for e in summary["top_errors"] if e["error"].startswith(("HTTP 401", "HTTP 403"))]
    if not refused:
        return
    said = "refused the key from " + str(key.source) if key.value else "wants an API key"
    say(f"the server {said}: give it with {how_to_give(SERVER_KEY)}", lead="hint: ")


def _kvwise_before(controller: str, token: Token) -> dict[str, Any]:
    """The controller's versions before the run; one that does not answer is said once
    (the run goes on without the version report), and its reason kept as ``error``; one
    that refuses the token stops the command before anything is sent."""
    before, error = _kvwise_state(controller, token, refused_fails=True)
    if error is None:
        return {"before": before, "after": None}
    _say_no_report(error)
    return {"before": None, "after": None, "error": error}


def _kvwise_after(controller: str, token: Token, kvwise: dict[str, Any]) -> None:
    """The versions after the run, unless the controller did not answer before it."""
    if "error" in kvwise:
        return  # said once already
    kvwise["after"], error = _kvwise_state(controller, token)
    if error is not None:
        kvwise["error"] = error
        _say_no_report(error)


def _kvwise_state(
    controller: str, token: Token, refused_fails: bool = False
) -> tuple[dict[str, Any] | None, str | None]:
    """The controller's policy version and its agents' now, or why they cannot be read
    (a refused token says which token to give; with ``refused_fails``, as a failure)."""
    import httpx

    from controlplane.loadgen.observe import (
        HttpStatus,
        ServerUnreachable,
        bearer_headers,
        kvwise_state,
    )

    try:
        with httpx.Client(timeout=30, headers=bearer_headers(token.value)) as client:
            return kvwise_state(client, controller), None
    except HttpStatus as exc:
        refused = refusal(CONTROLLER_TOKEN, token, exc.url, exc.status)
        if refused is not None and refused_fails:
            fail(f"--controller: {refused}")
        if exc.status == 404:
            return None, f"{exc}: is --controller a kvwise controller's root URL?"
        return None, refused or str(exc)
    except ServerUnreachable as exc:
        return None, str(exc)


def _say_no_report(error: str) -> None:
    say(f"--controller: {error}: the kvwise version report is unavailable", lead="warning: ")


def _plan(
    trace_path: Path, args: dict[str, Any], skip_bad_lines: bool
) -> tuple[list[PlannedRequest], str]:
    """The requests to send and the trace's ``trace_digest``."""
    from controlplane.loadgen.plan import PlanOptions, plan_requests, trace_digest

    trace = load_trace_or_fail(trace_path, skip_bad_lines=skip_bad_lines)
    options = PlanOptions(
        speed=args["speed"],
        limit=args["limit"],
        max_tokens=args["max_tokens"],
        max_blocks=args["max_blocks"],
        send_categories=args["categories"],
    )
    try:
        plan = plan_requests(trace, options)
    except ValueError as exc:  # the one thing the options' parsers cannot see: the span
        fail(f"--speed: {str(exc).removeprefix('speed ')}")
    _check_prompt_sizes(plan, args["block_tokens"])
    return plan, trace_digest(trace)


def _check_prompt_sizes(plan: list[PlannedRequest], block_tokens: int) -> None:
    """Fail, before anything is sent, if a prompt would be over ``MAX_REQUEST_TOKENS`` (each
    is built whole in memory when it is sent)."""
    from controlplane.traces.model import MAX_REQUEST_TOKENS

    longest = max(plan, key=lambda p: len(p.hash_ids), default=None)
    if longest is None:
        return
    tokens = len(longest.hash_ids) * block_tokens + 1
    if tokens > MAX_REQUEST_TOKENS:
        fail(
            f"--block-tokens {block_tokens}: request {longest.index}'s prompt would be "
            f"{tokens:,} tokens ({len(longest.hash_ids):,} blocks), more than "
            f"{MAX_REQUEST_TOKENS:,}; give the server's block size, or a smaller --max-blocks"
        )


def _base_url(url: str) -> str:
    """The server's root: a trailing ``/`` or ``/v1`` (an OpenAI client's base URL) goes."""
    base = url.rstrip("/")
    if base.endswith("/v1"):
        base = base[: -len("/v1")]
    if not base.startswith(("http://", "https://")):
        fail(f"--url {url!r}: expected http://host:port or https://...")
    return base


def _open_lines(path: Path | None) -> IO[str] | None:
    if path is None:
        return None
    try:
        return path.open("w")
    except OSError as exc:
        fail(f"--requests {path}: {exc.strerror or exc}")


def _write_line(out: IO[str], result: RequestResult) -> None:
    from controlplane.loadgen.report import request_line

    out.write(json.dumps(request_line(result)) + "\n")


class _Progress:
    """A bar on a terminal; else a line every ``PROGRESS_EVERY_S`` s (CI logs); on stderr."""

    def __init__(self, total: int, quiet: bool) -> None:
        self.total = total
        self.quiet = quiet
        self.done = self.errors = self.prompt = self.cached = 0
        self.last_line = time.monotonic()
        self.bar: Any = None
        self.task: Any = None

    def __enter__(self) -> _Progress:
        if not self.quiet and sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            self.bar = Progress(
                TextColumn("[bold]bench"), BarColumn(), MofNCompleteColumn(),
                TextColumn("{task.fields[note]}"), TimeElapsedColumn(),
                transient=True, console=Console(stderr=True),
            )  # fmt: skip
            self.bar.start()
            self.task = self.bar.add_task("bench", total=self.total, note="")
        return self

    def update(self, result: RequestResult) -> None:
        self.done += 1
        self.errors += not result.ok
        if result.cached_tokens is not None and result.prompt_tokens:
            self.prompt += result.prompt_tokens
            self.cached += result.cached_tokens
        if self.quiet:
            return
        if self.bar is not None:
            self.bar.update(self.task, completed=self.done, note=self._note())
        elif time.monotonic() - self.last_line >= PROGRESS_EVERY_S or self.done == self.total:
            self.last_line = time.monotonic()
            typer.echo(f"bench: {self.done:,}/{self.total:,} done, {self._note()}", err=True)

    def _note(self) -> str:
        hit = f"{self.cached / self.prompt:.3f}" if self.prompt else "n/a"
        return f"{self.errors:,} errors, hit ratio {hit}"

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()


def _print_other_errors(console: Console, s: dict[str, Any]) -> None:
    """The errors past the most common kinds listed: "7 errors" over five lines of one
    each read as errors lost."""
    listed = sum(e["count"] for e in s["top_errors"])
    if s["errors"] > listed:
        rest = s["errors"] - listed
        console.print(
            f"[red]{rest:,} x[/] other error{'' if rest == 1 else 's'} (--requests FILE "
            "keeps each request's)",
            highlight=False,
        )


def _fmt(value: float | None, unit: str = "") -> str:
    if value is None:
        return "n/a"
    if unit == "s":
        return f"{value * 1000:,.1f} ms" if value < 10 else f"{value:,.2f} s"
    if unit == "ratio":
        return f"{value:.4f}"
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.2f}"


def _print_summary(s: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=min(Console().width, 100))
    cfg = s["config"]
    console.print(
        f"[bold]{Path(cfg['trace']).name}[/] -> {cfg['url']} ({cfg['model']})", highlight=False
    )
    console.print(
        f"{s['requests']:,} requests in {s['wall_s']:.1f} s, {s['errors']:,} errors",
        highlight=False,
    )
    table = Table(show_header=True, title_justify="left")
    for col in ("", "mean", "p50", "p90", "p99", "max"):
        table.add_column(col, justify="left" if not col else "right")
    for label, key in (
        ("TTFT", "ttft_s"),
        ("latency", "latency_s"),
        ("queue wait", "queue_wait_s"),
    ):
        d = s[key] or {}
        table.add_row(label, *(_fmt(d.get(q), "s") for q in ("mean", "p50", "p90", "p99", "max")))
    console.print(table)
    server = s["server"] or {}
    console.print(
        f"hit ratio {_fmt(s['hit_ratio'], 'ratio')} from cached tokens "
        f"({s['cached_tokens_reported']:,} of {s['ok']:,} requests reported them)",
        highlight=False,
    )
    console.print(
        f"hit ratio {_fmt(server.get('hit_ratio'), 'ratio')} from the server's counters",
        highlight=False,
    )
    if server.get("error"):
        console.print(f"server counters unavailable: {server['error']}", highlight=False)
    for e in s["top_errors"]:
        console.print(f"[red]{e['count']:,} x[/] {e['error']}", highlight=False)
    _print_other_errors(console, s)
    kvwise = s["kvwise"]
    if kvwise and kvwise.get("error"):
        console.print(f"kvwise version report unavailable: {kvwise['error']}", highlight=False)
    if kvwise and kvwise.get("after"):
        after = kvwise["after"]
        for a in after["agents"]:
            console.print(
                f"kvwise agent {a['id']} ({a['engine']}): policy v{a['applied_version']} applied"
                f", v{a['staged_version']} staged (controller at v{after['policy_version']})",
                highlight=False,
            )


def _compare(paths: tuple[Path, Path], json_out: bool, unpaired: bool) -> None:
    from controlplane.loadgen.report import NotPaired, compare, config_differences

    runs = [_read_summary(p) for p in paths]
    try:
        rows = compare(runs[0], runs[1], names=(str(paths[0]), str(paths[1])), paired=not unpaired)
    except NotPaired as exc:
        fail(f"--compare: {exc}; --unpaired compares them without intervals")
    except ValueError as exc:
        fail(f"--compare: {exc}")
    differences = config_differences(runs[0], runs[1])
    if json_out:
        print_json(
            {"a": str(paths[0]), "b": str(paths[1]), "paired": not unpaired}
            | {"differences": {k: list(v) for k, v in differences.items()}, "rows": rows}
        )
        return
    _print_comparison(paths, rows)
    if unpaired:
        _say_unpaired(differences)
    elif not any(r["interval"] for r in rows):
        say(
            "--compare: no intervals (a summary without per-request figures, or fewer than "
            "30 requests both runs finished)"
        )


def _read_summary(path: Path) -> dict[str, Any]:
    """A ``--compare`` file's JSON object, or a one-line error naming the file."""
    try:
        with path.open("rb") as f:
            text = f.read(MAX_SUMMARY_BYTES + 1)
        if len(text) > MAX_SUMMARY_BYTES:
            fail(f"--compare {path}: over {MAX_SUMMARY_BYTES:,} bytes, not a bench summary")
        summary = json.loads(text)
    except OSError as exc:
        fail(f"--compare {path}: {exc.strerror or exc}")
    except ValueError as exc:
        fail(f"--compare {path}: not JSON ({exc})")
    if not isinstance(summary, dict):
        fail(f"--compare {path}: not a bench summary (a JSON object)")
    return summary


def _print_comparison(paths: tuple[Path, Path], rows: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"A = {paths[0]}\nB = {paths[1]}", title_justify="left")
    for col in ("metric", "A", "B", "B vs A", "95 % interval"):
        table.add_column(
            col, justify="left" if col == "metric" else "right", no_wrap=col == "metric"
        )
    for r in rows:
        change = "" if r["change"] is None else signed_percent(r["change"])
        interval = "" if r["interval"] is None else " .. ".join(map(signed_percent, r["interval"]))
        a, b = _fmt(r["a"], r["unit"]), _fmt(r["b"], r["unit"])
        table.add_row(r["metric"], a, b, change, interval)
    Console().print(table)


def _say_unpaired(differences: dict[str, tuple[Any, Any]]) -> None:
    from controlplane.loadgen.report import differences_text

    if differences:
        say(
            f"--unpaired: the runs sent different requests ({differences_text(differences)}); "
            "each figure is its run's own, with no interval",
            lead="warning: ",
        )
    else:
        say("--unpaired: no intervals (the runs sent the same requests: without it they pair)")

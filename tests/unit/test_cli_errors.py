"""Bad settings and unreachable Redis at the CLI boundary, in real processes: one error line
naming the option or variable, the right exit code, no traceback, nothing left behind."""

from __future__ import annotations

import gzip
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from controlplane.dev.embedded_redis import free_port
from controlplane.traces.synth import synthesize
from controlplane.traces.writer import write_bailian
from tests.conftest import REPO

SAMPLE = REPO / "tests" / "data" / "mooncake_synthetic.jsonl.gz"
BAD_SCHEME = "must start with redis://, rediss://"


def kvwise(
    *args: str, env: dict[str, str] | None = None, tmp: Path | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "COLUMNS": "200", **(env or {})}
    if tmp is not None:
        full["TMPDIR"] = str(tmp)
    cmd = [sys.executable, "-m", "controlplane", *args]
    return subprocess.run(cmd, cwd=REPO, env=full, capture_output=True, text=True, timeout=timeout)


def one_error_line(res: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in res.stderr, res.stderr
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1, res.stderr
    return errors[0]


@pytest.mark.parametrize(
    ("args", "env", "names"),
    [
        (["--redis-url", "notaurl"], {}, "--redis-url: "),
        ([], {"KVWISE_REDIS_URL": "notaurl"}, "KVWISE_REDIS_URL: "),
        ([], {"KVWISE_BATCH_EVENTS": "many"}, "bad agent setting KVWISE_BATCH_EVENTS='many': "),
        (["--policy", "nope"], {}, "--policy: unknown policy 'nope'"),
        (["--key-prefix", "a{b}:"], {}, "--key-prefix='a{b}:': key prefix 'a{b}:' must not"),
        ([], {"KVWISE_EVICTOR": "nope"}, "KVWISE_EVICTOR: unknown policy 'nope'"),
        # a slip is answered as replay's and simulate's are: the name meant, then the list
        (["--policy", "LRU"], {}, "--policy: unknown policy 'LRU' (did you mean 'lru'?); known: "),
        (
            [],
            {"KVWISE_EVICTOR": "devce"},
            "KVWISE_EVICTOR: unknown policy 'devce' (did you mean 'device'?); known: ",
        ),
        # an empty option is given, as in every command: not passed over for the variable
        (["--redis-url", ""], {"KVWISE_REDIS_URL": "notaurl"}, "--redis-url: "),
        (["--policy", ""], {"KVWISE_EVICTOR": "lru"}, "--policy: unknown policy ''"),
        # an empty --id was passed over for the default id, as an unset KVWISE_WORKER_ID is
        # (were it taken, a fast replay to a Redis that is not there ends it, exit code 1)
        (
            ["--id", "", "--speed", "5000", "--redis-url", f"redis://127.0.0.1:{free_port()}/0"],
            {"KVWISE_WORKER_ID": "w1"},
            "--id: must not be empty",
        ),
    ],
)
def test_worker_refuses_bad_settings(args: list[str], env: dict[str, str], names: str) -> None:
    res = kvwise("worker", "--trace", str(SAMPLE), "--capacity", "100", *args, env=env)
    assert res.returncode == 2
    assert one_error_line(res).startswith(f"error: {names}")
    assert res.stdout == ""


@pytest.mark.parametrize(
    ("command", "what"),
    [
        (["controller", "--port", str(free_port())], "controller"),
        (["worker", "--trace", str(SAMPLE), "--capacity", "100"], "agent"),
        (["config"], "controller"),
    ],
)
def test_a_key_prefix_with_a_hash_tag_is_one_error_line(command: list[str], what: str) -> None:
    """Braces in ``KVWISE_KEY_PREFIX`` (a Redis Cluster hash tag) were refused by the key
    builder as the controller or worker started: a traceback, and the controller exited 0."""
    res = kvwise(*command, env={"KVWISE_KEY_PREFIX": "kv{a}:"})
    assert res.returncode == 2
    line = one_error_line(res)
    assert line.startswith(f"error: bad {what} setting KVWISE_KEY_PREFIX='kv{{a}}:': "), line
    assert "must not contain braces" in line


def test_config_refuses_a_device_the_evictor_would_refuse() -> None:
    """``KVWISE_DEVICE=tpu kvwise config`` exited 0; the worker's evictor refused it later."""
    res = kvwise("config", env={"KVWISE_DEVICE": "tpu"})
    assert res.returncode == 2
    line = one_error_line(res)
    assert line.startswith("error: bad agent setting KVWISE_DEVICE='tpu': "), line
    assert "cpu, cuda or cuda:N" in line


@pytest.mark.parametrize(
    ("env", "warned"),
    [
        ({"KVWISE_MAX_CATEGORIES": "4096"}, "KVWISE_MAX_CATEGORIES (4096, deprecated here)"),
        ({"KVWISE_MAX_TRACKED_CATEGORIES": "2048"}, "KVWISE_MAX_TRACKED_CATEGORIES (2048)"),
        ({"KVWISE_MAX_CATEGORIES": "4096", "KVWISE_MAX_TRACKED_CATEGORIES": "1024"}, None),
    ],
)
def test_config_names_each_category_limit_once_and_warns_where_agents_would_be_refused(
    env: dict[str, str], warned: str | None
) -> None:
    """``kvwise config`` printed ``KVWISE_MAX_CATEGORIES`` twice (the controller's window
    and the agent's limit), and said nothing of an agent limit past the controller's
    per-worker one, which the chart refuses at install."""
    res = kvwise("config", env=env)
    assert res.returncode == 0, res.stderr
    names = [line.split("=")[0] for line in res.stdout.splitlines() if "=" in line]
    assert names.count("KVWISE_MAX_CATEGORIES") == 1
    assert names.count("KVWISE_MAX_TRACKED_CATEGORIES") == 1
    said = [line for line in res.stderr.splitlines() if line.startswith("warning: ")]
    if warned is None:
        assert said == [], res.stderr
    else:
        assert said == [
            f"warning: {warned} exceeds KVWISE_MAX_CATEGORIES_PER_WORKER (1024): a controller "
            "of this environment dead-letters every entry of an agent of this environment "
            "once it names more categories than that"
        ], res.stderr


@pytest.mark.parametrize("command", ["replay", "simulate", "trace stats"])
def test_a_missing_trace_is_named_in_plain_words(command: str) -> None:
    res = kvwise(*command.split(), "no-such-trace.jsonl")
    assert res.returncode == 2
    assert one_error_line(res) == "error: no-such-trace.jsonl: No such file or directory"


def test_controller_refuses_a_malformed_redis_url() -> None:
    res = kvwise("controller", "--port", str(free_port()), env={"KVWISE_REDIS_URL": "notaurl"})
    assert res.returncode == 2
    line = one_error_line(res)
    assert line.startswith("error: KVWISE_REDIS_URL: ") and BAD_SCHEME in line


def test_controller_refuses_at_start_a_window_past_max_window_bytes() -> None:
    env = {"KVWISE_WINDOW_BUCKETS": "10000", "KVWISE_MAX_CATEGORIES": "4096"}
    res = kvwise("controller", "--port", str(free_port()), env=env, timeout=60)
    assert res.returncode == 2
    line = one_error_line(res)
    assert line.startswith("error: bad controller settings: KVWISE_WINDOW_BUCKETS (10000) x ")
    assert "(21.06 GiB)" in line and "KVWISE_MAX_WINDOW_BYTES (1,073,741,824)" in line


@pytest.mark.parametrize(
    ("host", "written"), [("127.0.0.1", "127.0.0.1"), ("::1", "[::1]")], ids=["ipv4", "ipv6"]
)
def test_a_controller_whose_port_is_taken_fails_before_it_writes_anything(
    redis_url: str, key_prefix: str, host: str, written: str
) -> None:
    """It led, published v1 and wrote a checkpoint, then failed to bind: the next
    controller loaded that checkpoint as if a replica had run. An IPv6 address is written
    in brackets (it said ``::1:PORT``)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as taken:
        taken.bind((host, 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {"KVWISE_REDIS_URL": redis_url, "KVWISE_KEY_PREFIX": key_prefix}
        res = kvwise("controller", "--host", host, "--port", str(port), env=env)
    assert res.returncode == 2
    assert one_error_line(res).startswith(f"error: cannot listen on {written}:{port}: ")
    assert not list(redis.Redis.from_url(redis_url).scan_iter(match=key_prefix + "*"))


def test_a_malformed_redis_url_is_reported_without_its_password() -> None:
    url = "redis://kvwise:hunter2@127.0.0.1:notaport/0"
    res = kvwise("controller", "--port", str(free_port()), env={"KVWISE_REDIS_URL": url})
    assert res.returncode == 2
    line = one_error_line(res)
    assert line.startswith("error: KVWISE_REDIS_URL: ") and "malformed" in line
    assert "hunter2" not in res.stderr + res.stdout and "kvwise:***@" in line


def test_controller_names_the_option_of_a_bad_port() -> None:
    res = kvwise("controller", "--port", "70000")
    assert res.returncode == 2 and one_error_line(res).startswith("error: --port: ")


@pytest.mark.parametrize(
    ("url", "says"),
    [("notaurl", BAD_SCHEME), (f"redis://127.0.0.1:{free_port()}/0", "does not answer")],
)
def test_demo_fails_in_one_line_and_leaves_nothing(tmp_path: Path, url: str, says: str) -> None:
    res = kvwise("demo", "--duration", "1", env={"KVWISE_REDIS_URL": url}, tmp=tmp_path)
    assert res.returncode == 2
    assert says in one_error_line(res)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("args", "says"),
    [
        *(
            (["--speed", speed], f"error: --speed: must be a finite number >= 0.1, got {speed}")
            for speed in ("inf", "nan", "0.05")
        ),
        (["--refit-interval", "inf"], "error: --refit-interval: must be a finite number >= 0.5"),
        # worded as the others, not pydantic's "Input should be greater than or equal to 2"
        (
            ["--workers", "1"],
            "error: --workers: must be at least 2 (a pair: wa and stock LRU), got 1",
        ),
        (["--workers", "17"], "error: --workers: must be at most 16, got 17"),
    ],
)
def test_demo_refuses_a_bad_rate_or_count_before_it_starts_anything(
    tmp_path: Path, args: list[str], says: str
) -> None:
    """``--speed inf`` and ``--refit-interval inf`` passed the options' bounds (>= 0.1,
    >= 0.5): Redis and the controller started, then a child refused the value. Each error
    names the option and the value, in the same words."""
    res = kvwise("demo", *args, "--duration", "1", tmp=tmp_path)
    assert res.returncode == 2
    assert one_error_line(res).startswith(says)
    assert list(tmp_path.iterdir()) == []


def test_demo_passes_on_the_controllers_error_line_once(tmp_path: Path) -> None:
    """A controller that refused its settings was reported as ``error: error: ...``."""
    res = kvwise("demo", "--duration", "1", env={"KVWISE_SHADOW_RATE": "5"}, tmp=tmp_path)
    assert res.returncode == 2
    line = one_error_line(res)
    assert line.startswith("error: bad controller setting KVWISE_SHADOW_RATE='5': "), line
    assert list(tmp_path.iterdir()) == []


def test_demo_refuses_a_bad_agent_setting_before_it_starts_anything(tmp_path: Path) -> None:
    """The workers are agents: with a bad agent setting the demo started Redis and the
    controller, then every worker died of it, and no line named it. The demo reads the
    agent settings, ``KVWISE_REDIS_URL`` among them, once, and names the bad one."""
    res = kvwise("demo", "--duration", "1", env={"KVWISE_BATCH_EVENTS": "many"}, tmp=tmp_path)
    assert res.returncode == 2
    assert one_error_line(res).startswith("error: bad agent setting KVWISE_BATCH_EVENTS='many': ")
    assert list(tmp_path.iterdir()) == []


def test_demo_leaves_the_users_key_prefix_unread(tmp_path: Path) -> None:
    """The demo's keys go under a prefix of its own: a ``KVWISE_KEY_PREFIX`` the agents
    would refuse is not the demo's to refuse. A URL with no Redis behind it stops the demo
    at its first step, so the line it fails with shows what was read."""
    url = f"redis://127.0.0.1:{free_port()}/0"
    env = {"KVWISE_KEY_PREFIX": "{braces}", "KVWISE_REDIS_URL": url}
    res = kvwise("demo", "--duration", "1", env=env, tmp=tmp_path)
    assert res.returncode == 2
    assert "does not answer" in one_error_line(res)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("variable", "value"), [("KVWISE_PORT", "abc"), ("KVWISE_SHADOW_RATE", "5")]
)
def test_config_names_a_bad_setting_and_its_value_in_one_line(variable: str, value: str) -> None:
    res = kvwise("config", env={variable: value})
    assert res.returncode == 2
    assert one_error_line(res).startswith(f"error: bad controller setting {variable}='{value}': ")


@pytest.mark.parametrize(
    ("variable", "command"),
    [
        ("KVWISE_EVICTOR", ["worker", "--trace", str(SAMPLE), "--capacity", "100"]),
        ("KVWISE_REDIS_URL", ["worker", "--trace", str(SAMPLE), "--capacity", "100"]),
        ("KVWISE_REDIS_URL", ["controller", "--port", str(free_port())]),
    ],
)
def test_config_refuses_what_the_commands_refuse_in_their_line(
    variable: str, command: list[str]
) -> None:
    """An unknown evictor or a malformed Redis URL was printed as the value in effect
    (exit 0) while the commands that read it refused it."""
    env = {variable: "bogus"}
    refused = kvwise(*command, env=env)
    assert refused.returncode == 2
    for args in ((), ("--json",)):
        res = kvwise("config", *args, env=env)
        assert res.returncode == 2
        assert one_error_line(res) == one_error_line(refused)
        assert res.stdout == ""


def test_an_empty_worker_id_variable_keeps_the_default_id() -> None:
    """``KVWISE_WORKER_ID`` defaults to empty, which means host-pid: set empty, it is the
    default, not an error (an empty ``--id`` is refused)."""
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    args = ["--capacity", "500", "--speed", "5000", "--status-every", "0", "--redis-url", url]
    res = kvwise("worker", "--trace", str(SAMPLE), "--policy", "lru", *args,
                 env={"KVWISE_WORKER_ID": ""})  # fmt: skip
    assert res.returncode == 1, res.stderr
    assert res.stdout.startswith(f"done: worker {socket.gethostname()}-")


def test_a_bad_token_is_named_but_never_shown() -> None:
    res = kvwise("config", env={"KVWISE_API_TOKEN": "s3cret", "KVWISE_API_READ_TOKEN": "s3cret"})
    assert res.returncode == 2
    assert one_error_line(res).startswith("error: bad controller setting KVWISE_API_READ_TOKEN: ")
    assert "s3cret" not in res.stderr + res.stdout


@pytest.mark.parametrize(
    ("low", "high"),
    [("KVWISE_RATE_MIN", "KVWISE_RATE_MAX"), ("KVWISE_LIFE_MIN_S", "KVWISE_LIFE_MAX_S")],
)
def test_controller_refuses_inverted_bounds_naming_both(low: str, high: str) -> None:
    res = kvwise("controller", "--port", str(free_port()), env={low: "100", high: "1"})
    assert res.returncode == 2
    line = one_error_line(res)
    assert line == f"error: bad controller settings: {low} (100) must not exceed {high} (1)"


def test_config_shows_no_password_of_a_url() -> None:
    url = "redis://kvwise:hunter2@127.0.0.1:6379/0"
    for args in ((), ("--json",)):
        res = kvwise("config", *args, env={"KVWISE_REDIS_URL": url})
        assert res.returncode == 0, res.stderr
        assert "hunter2" not in res.stdout and "kvwise:***@127.0.0.1:6379/0" in res.stdout


def test_worker_that_sends_nothing_exits_1_after_its_summary() -> None:
    url = f"redis://kvwise:hunter2@127.0.0.1:{free_port()}/0"  # nothing listens there
    args = ["--capacity", "500", "--speed", "5000", "--status-every", "0", "--redis-url", url]
    res = kvwise("worker", "--trace", str(SAMPLE), "--policy", "lru", *args)
    assert res.returncode == 1, res.stderr
    summary = res.stdout.strip().splitlines()
    assert len(summary) == 3 and summary[0].startswith("done: worker ")
    assert all(len(line) <= 80 for line in summary), summary
    assert "3,993 requests" in summary[0]
    assert summary[1].startswith("  hit ratio 0.") and "applied version 0" in summary[1]
    assert summary[2].startswith("  events sent 0 dropped")
    line = one_error_line(res)
    assert "sent no event" in line and url.replace("hunter2", "***") in line
    assert "hunter2" not in res.stderr + res.stdout


def test_worker_on_a_cluster_that_never_answers_counts_what_it_could_not_send(
    tmp_path: Path,
) -> None:
    """With ``KVWISE_REDIS_CLUSTER`` the summary said "events sent 0 dropped 0" and the
    worker exited 0: the cluster client, made on first use, failed before the send that
    counts a failure, and the events it had drained were lost uncounted. (A trace short
    enough that the agent's buffer never fills: its drops are counted either way.)"""
    trace = tmp_path / "short.jsonl"
    write_bailian(synthesize("to-c", duration_s=10, qps=4, seed=1), trace)
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    args = ["--capacity", "500", "--speed", "100", "--status-every", "0", "--redis-url", url]
    env = {"KVWISE_REDIS_CLUSTER": "true"}
    res = kvwise("worker", "--trace", str(trace), "--policy", "lru", *args, env=env)
    assert res.returncode == 1, res.stderr
    sent = res.stdout.strip().splitlines()[2]
    assert sent.startswith("  events sent 0 dropped ") and " dropped 0," not in sent, sent
    assert "sent no event" in one_error_line(res)


@pytest.mark.parametrize("command", ["replay", "simulate"])
@pytest.mark.parametrize(
    ("sizes", "write"),
    [
        ("1,651", "1651, or '1, 651' for a list"),
        ("12,288", "12288, or '12, 288' for a list"),
        ("300,048", "300048"),
        ("10,000,20,000", "10000,20000"),  # once run as 10, 0 and 20
        ("1,000, 2,000", "1000,2000"),
    ],
)
def test_sizes_with_thousands_separators_are_refused_not_split(
    command: str, sizes: str, write: str
) -> None:
    res = kvwise(command, str(SAMPLE), "-p", "lru", "--capacity", sizes)
    assert res.returncode == 2
    assert one_error_line(res) == (
        f"error: --capacity: '{sizes}' reads as numbers with thousands separators, but "
        f"commas separate values: write {write}"
    )


def test_a_list_written_with_spaces_runs_each_size() -> None:
    res = kvwise("replay", str(SAMPLE), "-p", "lru", "--capacity", "1, 651", "--json")
    assert res.returncode == 0, res.stderr
    assert '"capacity": 1,' in res.stdout and '"capacity": 651,' in res.stdout


def test_bad_sizes_are_refused_before_the_trace_is_read(tmp_path: Path) -> None:
    broken = tmp_path / "broken.jsonl"
    line = '{"timestamp": 0, "hash_ids": [1], "input_length": 16, "output_length": 4}'
    broken.write_text(f"{line}\nnot json\n")
    res = kvwise("replay", str(broken), "--skip-bad-lines", "-p", "lru", "--capacity", "-5")
    assert res.returncode == 2
    assert "skipped" not in res.stderr
    assert one_error_line(res).startswith("error: --capacity: ")


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--wa-fit", "split", "--split", "1.5"], "error: --split: must be in (0, 1), got 1.5"),
        (["--wa-fit", "nope"], "error: --wa-fit: 'nope' is not one of 'online', 'split'"),
        (["--bogus"], "error: no such option: --bogus"),
        (["extra"], "error: got unexpected extra argument(s) (extra); try '"),
    ],
)
def test_a_usage_error_click_finds_is_one_line_too(args: list[str], said: str) -> None:
    """Typer printed the errors click finds while parsing in a boxed panel under the
    usage line; every other error is one line."""
    res = kvwise("replay", str(SAMPLE), *args)
    assert res.returncode == 2
    assert one_error_line(res).startswith(said)
    assert res.stderr.count("\n") == 1, res.stderr


def test_no_command_still_shows_the_help() -> None:
    res = kvwise("trace")
    assert res.returncode == 2
    assert "synth" in res.stdout and res.stderr == ""


def test_a_negative_seed_is_an_option_error_not_a_traceback(tmp_path: Path) -> None:
    res = kvwise("trace", "synth", "--seed", "-1", "-o", str(tmp_path / "t.jsonl"))
    assert res.returncode == 2
    assert "Traceback" not in res.stderr
    assert "--seed" in res.stderr
    assert not (tmp_path / "t.jsonl").exists()


def test_split_mode_with_nothing_left_to_score_is_refused(tmp_path: Path) -> None:
    one = tmp_path / "one.jsonl"
    one.write_text('{"timestamp": 0, "hash_ids": [1, 2], "input_length": 32, "output_length": 4}\n')
    res = kvwise("replay", str(one), "-p", "lru,wa", "--wa-fit", "split", "--capacity", "4")
    assert res.returncode == 2
    assert one_error_line(res) == (
        "error: --wa-fit split: fitting on 50% of 1 request leaves none to score; give a "
        "longer trace or a smaller --split"
    )


def test_simulate_refuses_a_block_size_the_trace_format_contradicts() -> None:
    res = kvwise("simulate", str(SAMPLE), "-p", "lru", "--capacity", "500", "--block-tokens", "16")
    assert res.returncode == 2
    assert one_error_line(res).startswith(
        "error: --block-tokens 16: this mooncake trace's blocks hold 512 tokens each"
    )


def test_bench_serve_refuses_an_output_it_could_not_write_before_sending(tmp_path: Path) -> None:
    """``-o nodir/a.json`` was tried only after the run: minutes of a server's time lost,
    and no summary shown."""
    out = tmp_path / "nodir" / "a.json"
    port = free_port()  # nothing listens: the run would fail later, differently
    res = kvwise("bench", "serve", str(SAMPLE), "--url", f"http://127.0.0.1:{port}", "-o", str(out))
    assert res.returncode == 2
    assert one_error_line(res) == f"error: --output {out}: folder {out.parent} does not exist"
    assert not out.parent.exists()


def test_bench_serve_refuses_an_infinite_speed_naming_the_option() -> None:
    """``--speed inf`` passed the option's bound (>= 0) and raised the plan's ValueError
    as a traceback."""
    port = free_port()  # nothing listens: it must fail before trying
    res = kvwise(
        "bench", "serve", str(SAMPLE), "--url", f"http://127.0.0.1:{port}", "--speed", "inf"
    )
    assert res.returncode == 2
    assert one_error_line(res) == "error: --speed: must be a finite number >= 0, got inf"
    tiny = kvwise(
        "bench", "serve", str(SAMPLE), "--url", f"http://127.0.0.1:{port}", "--speed", "1e-310"
    )  # finite and above 0, but the sends came at inf seconds: a run that waited for ever
    assert tiny.returncode == 2
    assert one_error_line(tiny).startswith("error: --speed: 1e-310 puts sends past a float's")


VOCAB_BOUND = f"must be a whole number in [12, {2**31}], got"


@pytest.mark.parametrize(
    ("option", "value", "error"),
    [
        ("--vocab", "99999999999999999999", f"error: --vocab: {VOCAB_BOUND}"),
        ("--vocab", str(2**31 + 1), f"error: --vocab: {VOCAB_BOUND}"),
        ("--timeout", "inf", "error: --timeout: must be a finite number > 0, got inf"),
        ("--timeout", "nan", "error: --timeout: must be a finite number > 0, got nan"),
        ("--timeout", "0", "error: --timeout: must be a finite number > 0, got 0"),
    ],
)
def test_bench_serve_refuses_an_unbounded_vocab_or_timeout_naming_the_option(
    option: str, value: str, error: str
) -> None:
    """A vocabulary past a 64-bit int was a traceback (and past 2^31 token ids a server
    cannot take); an infinite timeout ran."""
    port = free_port()  # nothing listens: it must fail before trying
    url = f"http://127.0.0.1:{port}"
    res = kvwise("bench", "serve", str(SAMPLE), "--url", url, "--model", "m", option, value)
    assert res.returncode == 2
    assert one_error_line(res).startswith(error)


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (
            ["replay", "--auto-windows", "0"],
            "--auto-windows: must be a whole number in [1, 1000], got 0",
        ),
        (
            ["replay", "--auto-windows", "1001"],
            "--auto-windows: must be a whole number in [1, 1000]",
        ),
        (["replay", "--auto-windows", "x"], "--auto-windows: 'x' is not a whole number"),
        (
            ["replay", "--auto-min-accesses", "-1"],
            "--auto-min-accesses: must be a whole number >= 0",
        ),
        (["replay", "--top-categories", "-1"], "--top-categories: must be a whole number >= 0"),
        (
            ["simulate", "-p", "lru", "--capacity", "9", "-j", "-1"],
            "--jobs: must be a whole number >= 0",
        ),
        (
            ["bench", "serve", "--block-tokens", "0"],
            "--block-tokens: must be a whole number >= 1",
        ),
        (
            ["trace", "stats", "--top-categories", "-1"],
            "--top-categories: must be a whole number >= 0",
        ),
        (["bench", "serve", "--limit", "0"], "--limit: must be a whole number >= 1, got 0"),
        (["bench", "serve", "--concurrency", "0"], "--concurrency: must be a whole number >= 1"),
        (
            ["bench", "serve", "--max-tokens", "0"],
            f"--max-tokens: must be a whole number in [1, {2**24}], got 0",
        ),
        (
            ["bench", "serve", "--max-tokens", str(2**24 + 1)],
            f"--max-tokens: must be a whole number in [1, {2**24}]",
        ),
        (["bench", "serve", "--max-blocks", "0"], "--max-blocks: must be a whole number >= 1"),
        (
            ["bench", "serve", "--vocab", "11"],
            "--vocab: must be a whole number in [12, 2147483648]",
        ),
    ],
)
def test_a_bounded_whole_number_is_refused_in_the_other_options_words(
    args: list[str], error: str
) -> None:
    """``min=``/``max=`` bounds were refused in pydantic's words ("Input should be greater
    than or equal to 1"), unlike every other option's "must be ..., got ..."."""
    command, rest = (args[:2], args[2:]) if args[0] in ("trace", "bench") else (args[:1], args[1:])
    url = ["--url", f"http://127.0.0.1:{free_port()}"] if command == ["bench", "serve"] else []
    res = kvwise(*command, str(SAMPLE), *url, *rest)
    assert res.returncode == 2
    assert one_error_line(res).startswith(f"error: {error}")


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["trace", "synth", "--seed", "-1"], "--seed: must be a whole number >= 0, got -1"),
        (
            ["worker", "--trace", str(SAMPLE), "--capacity", "0"],
            "--capacity: must be a whole number >= 1",
        ),
        (["demo", "--duration", "-1"], "--duration: must be a finite number >= 0, got -1"),
        (["demo", "--duration", "inf"], "--duration: must be a finite number >= 0, got inf"),
    ],
)
def test_a_bounded_option_of_a_command_without_a_trace_argument_is_worded_alike(
    tmp_path: Path, args: list[str], error: str
) -> None:
    res = kvwise(
        *args,
        "-o" if args[1] == "synth" else "--json",
        *([str(tmp_path / "t.jsonl")] if args[1] == "synth" else []),
        tmp=tmp_path,
    )
    assert res.returncode == 2
    assert one_error_line(res).startswith(f"error: {error}")
    assert list(tmp_path.iterdir()) == []


def test_bench_serve_refuses_a_prompt_past_its_bound_before_building_it(tmp_path: Path) -> None:
    """``--block-tokens`` had no upper bound: each prompt was built whole in memory (eight
    bytes a token, several copies) when sent, up to ``--concurrency`` at once, however
    many tokens; one past 2^24 tokens is now refused before anything is sent."""
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "hash_ids": [1], "input_length": 1, "output_length": 1}\n')
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens: it must fail before trying
    too_many = str(2**24 + 1)
    res = kvwise(
        "bench", "serve", str(trace), "--url", url, "--model", "m", "--block-tokens", too_many
    )
    assert res.returncode == 2
    assert one_error_line(res).startswith(
        f"error: --block-tokens {too_many}: request 0's prompt would be 16,777,218 tokens"
    )


def test_a_csv_file_is_told_a_trace_is_json_lines(tmp_path: Path) -> None:
    """The parser's words alone ("invalid literal, expected 'true'") left a CSV file's
    user guessing; a bad later line keeps the parser's message and offers the skip."""
    csv = tmp_path / "bad.csv"
    csv.write_text("timestamp,hash_ids\n1,2\n")
    res = kvwise("replay", str(csv), "-p", "lru", "--capacity", "4")
    assert res.returncode == 2
    assert one_error_line(res) == (
        f"error: {csv}:1: invalid JSON (invalid literal, expected 'true', column 1); a trace "
        "must be JSON Lines, one JSON object a line (Bailian or Mooncake)"
    )
    later = tmp_path / "later.jsonl"
    with gzip.open(SAMPLE, "rb") as f:
        later.write_bytes(f.readline() + b"nope\n")
    res = kvwise("replay", str(later), "-p", "lru", "--capacity", "4")
    assert one_error_line(res).endswith("column 1); --skip-bad-lines skips such lines")


@pytest.mark.parametrize("command", ["replay", "simulate", "trace stats"])
def test_a_malformed_line_offers_skip_bad_lines(tmp_path: Path, command: str) -> None:
    """One bad line in a long trace stopped the command with no word of the flag that
    reads past it; what no skipping reads past (a broken gzip stream) offers nothing."""
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 64, "hash_ids": [1, 2]}\n')
    res = kvwise(*command.split(), str(trace))
    assert res.returncode == 2
    assert one_error_line(res) == (
        f"error: {trace}:1: field 'output_length': missing; --skip-bad-lines skips such lines"
    )
    broken = tmp_path / "t.jsonl.gz"
    broken.write_bytes(SAMPLE.read_bytes()[:4000])
    res = kvwise(*command.split(), str(broken))
    assert res.returncode == 2 and "gzip stream" in one_error_line(res)
    assert "--skip-bad-lines" not in res.stderr


def test_error_lines_at_a_wide_terminal_wrap_at_80_columns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A 200-column terminal showed the --profile error in one line of 144 characters;
    where a program reads it (no terminal) it stays one line, as the tests above read."""
    from io import StringIO

    from rich.console import Console
    from typer.testing import CliRunner

    from controlplane.cli import app, common

    shown = StringIO()
    wide = Console(file=shown, force_terminal=True, width=200, color_system=None)
    monkeypatch.setattr(common, "err_console", wide)
    res = CliRunner().invoke(app, ["simulate", str(SAMPLE), "--profile", "nope"])
    assert res.exit_code == 2
    lines = shown.getvalue().splitlines()
    assert len(lines) > 1 and all(len(line) <= 80 for line in lines), lines
    assert " ".join(lines).startswith("error: --profile: unknown profile 'nope'")


MISSPELT = {
    "KVWISE_REFIT_INTERVAL": "30",  # for KVWISE_REFIT_INTERVAL_S
    "KVWISE_ENABLED": "1",  # for KVWISE_ENABLE: the vLLM plugin stayed off
    "KVWISE_REDIS_HOST": "redis.example",  # no such setting, none close
    "kvwise_refit_interval_s": "30",  # read: the settings ignore case
    "KVWISE_TEST_SOMETHING": "1",  # the test suite's own
}


NO_REDIS = {"KVWISE_REDIS_URL": "redis://127.0.0.1:1/0"}  # each command ends early


@pytest.mark.parametrize("command", ["config", "worker", "demo", "controller"])
def test_a_kvwise_variable_that_no_setting_reads_is_warned_of(command: str) -> None:
    """A misspelt variable was ignored without a word, its setting left at the default.
    Each command here then stops early: no trace, no Redis, a port taken."""
    port = free_port()
    args = {
        "config": ["config"],
        "worker": ["worker", "--trace", "no-such-trace.jsonl", "--capacity", "10"],
        "demo": ["demo", "--duration", "1"],
        "controller": ["controller", "--port", str(port)],
    }[command]
    with socket.create_server(("127.0.0.1", port)):
        res = kvwise(*args, env={**MISSPELT, **NO_REDIS})
    assert "Traceback" not in res.stderr, res.stderr
    said = [line for line in res.stderr.splitlines() if line.startswith("warning: ")]
    assert said == [
        "warning: KVWISE_ENABLED is not a kvwise setting: nothing reads it "
        "(did you mean KVWISE_ENABLE?)",
        "warning: KVWISE_REDIS_HOST is not a kvwise setting: nothing reads it "
        "(kvwise config lists them)",
        "warning: KVWISE_REFIT_INTERVAL is not a kvwise setting: nothing reads it "
        "(did you mean KVWISE_REFIT_INTERVAL_S?)",
    ], res.stderr


def test_demo_names_the_setting_behind_a_redis_that_does_not_answer(tmp_path: Path) -> None:
    """The line "Redis at redis://...:6390/0 does not answer" did not say that the URL came
    from the environment, nor that without it the demo finds or starts a Redis of its own."""
    url = f"redis://127.0.0.1:{free_port()}/0"
    res = kvwise("demo", "--duration", "1", env={"KVWISE_REDIS_URL": url}, tmp=tmp_path)
    assert res.returncode == 2
    line = one_error_line(res)
    assert line.startswith(f"error: Redis at {url} does not answer (KVWISE_REDIS_URL names it;")
    assert "else starts its own" in line


def test_demo_on_its_own_redis_ignores_a_cluster_setting(tmp_path: Path) -> None:
    """An exported ``KVWISE_REDIS_CLUSTER=true`` reached the demo's controller and workers,
    which then asked the single Redis the demo reused or started for its cluster slots:
    "the controller did not become ready in 30 s", and no word why."""
    env = {"KVWISE_REDIS_CLUSTER": "true"}
    res = kvwise("demo", "--duration", "1", "--json", env=env, tmp=tmp_path)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["redis_source"] in ("reused", "embedded")

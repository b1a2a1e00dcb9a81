"""``kvwise bench serve`` against a server and a controller that want bearer tokens, over
real HTTP: the toy OpenAI server behind an API key (as vLLM's ``--api-key``) and a real
controller with a read token. Each token is sent from its option or its environment
variables, a missing or wrong one is an error saying which token and how to give it, and
no token ever appears in what the command prints or writes."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import Result
from typer.testing import CliRunner

from controlplane.cli import app
from tests.conftest import delete_prefix
from tests.e2e.test_bench_serve import BLOCK, _trace_file
from tests.e2e.toy_openai_server import ToyServer, running_toy_server
from tests.integration.controller_fixtures import (
    RunningController,
    live_settings,
    running_controller,
)

pytestmark = pytest.mark.e2e
KEY = "sk-toy-5d1e9a"
WRITE, READ = "ctl-write-8c2f", "ctl-read-3b7e"
SECRETS = (KEY, WRITE, READ)
TOKEN_VARIABLES = ("OPENAI_API_KEY", "KVWISE_API_READ_TOKEN", "KVWISE_API_TOKEN")


@pytest.fixture
def keyed() -> Iterator[ToyServer]:
    with running_toy_server(ToyServer(block_size=BLOCK, api_key=KEY)) as server:
        yield server


@pytest.fixture(scope="module")
def ctl(redis_url: str) -> Iterator[RunningController]:
    prefix = f"kvwise-bench-auth-{uuid.uuid4().hex[:8]}:"
    settings = live_settings(
        redis_url=redis_url, key_prefix=prefix, api_token=WRITE, api_read_token=READ
    )
    with running_controller(settings) as rc:
        yield rc
    delete_prefix(redis_url, prefix)


def bench(*args: str, env: dict[str, str] | None = None) -> Result:
    """The command with only the token variables of ``env`` set (none of the caller's)."""
    unset: dict[str, str | None] = dict.fromkeys(TOKEN_VARIABLES)
    return CliRunner().invoke(
        app, ["bench", "serve", *args], env={**unset, "COLUMNS": "200", **(env or {})}
    )


def no_secret_in(res: Result, *files: Path) -> None:
    said = res.output + "".join(f.read_text() for f in files if f.exists())
    assert not [s for s in SECRETS if s in said]


@pytest.mark.parametrize(
    ("args", "env"),
    [([], {"OPENAI_API_KEY": KEY}), (["--api-key", KEY], {"OPENAI_API_KEY": "stale"})],
    ids=["OPENAI_API_KEY", "--api-key"],
)
def test_the_server_key_is_sent_from_openai_api_key_or_api_key(
    keyed: ToyServer, tmp_path: Path, args: list[str], env: dict[str, str]
) -> None:
    """No option sent a key and OPENAI_API_KEY was not read: ``/v1/models answered HTTP
    401`` against a server started with ``--api-key``."""
    path = _trace_file(tmp_path, [[1, 2], [1, 2], [1, 3]])
    out, lines = tmp_path / "a.json", tmp_path / "a.jsonl"
    res = bench(
        str(path), "--url", keyed.url, "--block-tokens", str(BLOCK), "--speed", "0",
        "-o", str(out), "--requests", str(lines), "--json", *args, env=env,
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    assert summary["requests"] == summary["ok"] == 3 and len(keyed.bodies) == 3
    assert summary["hit_ratio"] == pytest.approx(summary["server"]["hit_ratio"])
    no_secret_in(res, out, lines)


def test_a_missing_or_wrong_server_key_says_which_and_how_to_give_it(
    keyed: ToyServer, tmp_path: Path
) -> None:
    path = _trace_file(tmp_path, [[1, 2], [1, 3]])
    common = [str(path), "--url", keyed.url, "--block-tokens", str(BLOCK), "--speed", "0"]
    res = bench(*common)
    assert res.exit_code == 2, res.output
    said = " ".join(res.output.split())
    assert f"{keyed.url}/v1/models answered HTTP 401: the server wants an API key" in said
    assert "--api-key TOKEN or OPENAI_API_KEY=TOKEN" in said
    res = bench(*common, env={"OPENAI_API_KEY": "sk-wrong-41c0"})
    assert res.exit_code == 2, res.output
    said = " ".join(res.output.split())
    assert "the server refused the token from OPENAI_API_KEY" in said
    assert "sk-wrong-41c0" not in said
    # --model skips /v1/models: the refused requests are counted, then the hint comes.
    res = bench(*common, "--model", "toy-model", "--json")
    assert res.exit_code == 1, res.output
    assert json.loads(res.stdout)["top_errors"][0]["error"].startswith("HTTP 401")
    assert "hint: the server wants an API key: give it with --api-key" in res.stderr
    assert keyed.bodies == []
    no_secret_in(res)


def test_a_url_that_is_not_an_openai_server_says_what_url_is(
    keyed: ToyServer, tmp_path: Path
) -> None:
    """Only ``.../v1/models answered HTTP 404`` was said."""
    path = _trace_file(tmp_path, [[1, 2]])
    res = bench(str(path), "--url", f"{keyed.url}/api", "--api-key", KEY)
    assert res.exit_code == 2, res.output
    said = " ".join(res.output.split())
    assert f"{keyed.url}/api/v1/models answered HTTP 404: is this an OpenAI-compatible" in said
    assert "--url is the server's root" in said


@pytest.mark.parametrize(
    ("args", "env"),
    [
        ([], {"KVWISE_API_READ_TOKEN": READ}),
        ([], {"KVWISE_API_TOKEN": WRITE}),
        ([], {"KVWISE_API_READ_TOKEN": READ, "KVWISE_API_TOKEN": "not-this-one"}),
        (["--controller-token", READ], {"KVWISE_API_READ_TOKEN": "stale"}),
    ],
    ids=["read-token-variable", "api-token-variable", "read-token-first", "option"],
)
def test_the_controller_token_is_sent_and_the_versions_recorded(
    keyed: ToyServer, ctl: RunningController, tmp_path: Path, args: list[str], env: dict[str, str]
) -> None:
    """With the controller's read token set in bench's environment too, the report said
    ``/v1/policy answered HTTP 401`` and no version was recorded (exit code 0)."""
    path = _trace_file(tmp_path, [[1, 2], [1, 3]])
    out = tmp_path / "b.json"
    res = bench(
        str(path), "--url", keyed.url, "--api-key", KEY, "--block-tokens", str(BLOCK),
        "--speed", "0", "--controller", ctl.url, "-o", str(out), *args, env=env,
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    kvwise = json.loads(out.read_text())["kvwise"]
    assert "error" not in kvwise, kvwise
    policy = ctl.client.get("/v1/policy", headers={"Authorization": f"Bearer {READ}"}).json()
    assert kvwise["before"]["policy_version"] == kvwise["after"]["policy_version"]
    assert kvwise["after"]["policy_version"] == policy["version"]
    assert kvwise["after"]["agents"] == []
    assert "version report unavailable" not in res.output
    no_secret_in(res, out)


@pytest.mark.parametrize(
    ("env", "said"),
    [
        ({}, "the controller wants its read token"),
        (
            {"KVWISE_API_READ_TOKEN": "ctl-wrong-77aa"},
            "the controller refused the token from KVWISE_API_READ_TOKEN",
        ),
    ],
    ids=["missing", "wrong"],
)
def test_a_refused_controller_token_stops_the_command_before_any_load(
    keyed: ToyServer, ctl: RunningController, tmp_path: Path, env: dict[str, str], said: str
) -> None:
    path = _trace_file(tmp_path, [[1, 2]])
    res = bench(str(path), "--url", keyed.url, "--api-key", KEY, "--controller", ctl.url, env=env)
    assert res.exit_code == 2, res.output
    text = " ".join(res.output.split())
    assert f"--controller: {ctl.url}/v1/policy answered HTTP 401: {said}" in text
    assert "--controller-token TOKEN or KVWISE_API_READ_TOKEN=TOKEN" in text
    assert keyed.bodies == []  # nothing was sent
    assert "ctl-wrong-77aa" not in res.output
    no_secret_in(res)

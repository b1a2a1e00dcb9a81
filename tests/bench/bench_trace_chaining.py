"""Benchmark: what checking and re-chaining prefix ids costs on a million-request trace.

``kvwise trace synth`` writes at most 120,000 requests, so ``--write`` joins ``--pieces``
synthetic to-C traces (2,000 s at 30 requests a second each, seeds 3, 4, ...) end to end
into one Bailian-format file: each piece's ids, chat ids and times shifted past the
previous piece's, so the pieces share nothing and the joined ids stay prefix-chained.
Then, in this process: ``load_trace`` of the file (wall and CPU time, peak resident set),
``prefix_chained`` on the loaded trace (the check every load now runs: the trace passes)
``rechain_by_prefix`` (what a trace that fails it pays on top), and ``prefix_chained`` on
the same blocks folded onto a million ids (``FOLDED_IDS``), which fails the check.

    python -m tests.bench.bench_trace_chaining --write --pieces 17 /tmp/big.jsonl

Not collected by pytest (no ``test_`` prefix); results go in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import resource
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from controlplane.traces.chaining import prefix_chained, rechain_by_prefix
from controlplane.traces.model import Trace
from controlplane.traces.reader import load_trace
from controlplane.traces.synth import synthesize
from controlplane.traces.writer import write_bailian

PIECE_S = 2000.0
PIECE_QPS = 30.0
FOLDED_IDS = 1_000_000
"""The loaded blocks taken modulo this many ids: a trace whose ids repeat inside requests
and follow many blocks, so that ``prefix_chained`` takes its whole path (check, count,
re-chain)."""


def write_joined(path: Path, pieces: int) -> None:
    """``pieces`` synthetic to-C traces, one after the other, into one file at ``path``."""
    ids = chats = 0
    with open(path, "wb") as out:
        for k in range(pieces):
            piece = synthesize("to-c", duration_s=PIECE_S, qps=PIECE_QPS, seed=3 + k)
            shifted = _shifted(piece, ids, chats, k * PIECE_S)
            part = path.with_suffix(f".piece{k}")
            write_bailian(shifted, part)
            out.write(part.read_bytes())
            part.unlink()
            ids += int(piece.hashes.max()) + 1
            chats += int(piece.chat_ids.max()) + 1
            print(f"piece {k}: {piece.n_requests:,} requests", flush=True)


def _shifted(piece: Trace, ids: int, chats: int, seconds: float) -> Trace:
    parents = piece.parent_chat_ids
    return replace(
        piece,
        hashes=piece.hashes + ids,
        chat_ids=piece.chat_ids + chats,
        parent_chat_ids=np.where(parents >= 0, parents + chats, parents),
        timestamps=piece.timestamps + seconds,
    )


def _timed(what: str, run: object) -> object:
    wall, cpu = time.perf_counter(), time.process_time()
    result = run()  # type: ignore[operator]
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{what}: {wall:.2f} s wall, {cpu:.2f} s CPU, peak RSS so far {peak:,.0f} MiB")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", type=Path)
    parser.add_argument("--write", action="store_true", help="write the file first")
    parser.add_argument("--pieces", type=int, default=17)
    args = parser.parse_args()
    if args.write:
        write_joined(args.path, args.pieces)
    trace: Trace = _timed("load_trace", lambda: load_trace(args.path))  # type: ignore[assignment]
    print(f"{trace.n_requests:,} requests, {trace.n_accesses:,} blocks, {trace.n_unique:,} unique")
    assert trace.rechained is None
    _timed("prefix_chained (the check)", lambda: prefix_chained(trace))
    _timed("rechain_by_prefix", lambda: rechain_by_prefix(trace))
    folded = replace(trace, blocks=trace.blocks % FOLDED_IDS, hashes=np.arange(FOLDED_IDS))
    found: Trace = _timed("prefix_chained, folded", lambda: prefix_chained(folded))  # type: ignore[assignment]
    print(f"folded: {found.rechained}, {found.n_unique:,} unique after re-chaining")


if __name__ == "__main__":
    main()

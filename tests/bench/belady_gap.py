"""Where the hits that separate ``wa`` from Belady lie: hits by reuse gap and block kind.

Run (not collected by pytest)::

    python -m tests.bench.belady_gap --seed 7 --duration 1800 --frac 0.01

Replays one synthetic trace (``controlplane.traces.synth``: synthetic, not the real
traces) at one capacity through each policy of ``--policies`` and ``belady``, and counts
every policy's hits among the accesses of each row: by the time since the block's
previous access (the reuse gap; a first access is never a hit), and by the block's
kind, read with trace knowledge no engine has: *shared* when requests of two or more
conversations (``controlplane.replay.pace.conversations``) have used it by then, else *own*.
The replay's hits are prefixes: a request's first ``h`` blocks are hits. Prints a
Markdown table; progress goes to stderr.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor

import numpy as np
from numpy.typing import NDArray

from controlplane.replay import catalog
from controlplane.replay.engine import replay_hits
from controlplane.replay.options import ReplayOptions
from controlplane.replay.pace import conversations
from controlplane.traces.model import Trace
from controlplane.traces.synth import synthesize
from tests.bench.ablation import synthetic_trace_parser

GAP_EDGES_S = (1.0, 10.0, 60.0, 300.0)
"""Upper edges of the reuse-gap rows, in seconds (the last row is open)."""


def access_rows(trace: Trace) -> tuple[NDArray[np.int64], NDArray[np.bool_]]:
    """Per access, its reuse-gap row (-1 for a first access) and whether it is shared."""
    conv = conversations(trace)
    last_time: dict[int, float] = {}
    first_conv: dict[int, int] = {}
    shared: set[int] = set()
    gap_row = np.full(trace.n_accesses, -1, dtype=np.int64)
    is_shared = np.zeros(trace.n_accesses, dtype=np.bool_)
    offsets, times = trace.offsets.tolist(), trace.timestamps.tolist()
    blocks = trace.blocks.tolist()
    for r in range(trace.n_requests):
        now, c = times[r], conv[r]
        for i in range(offsets[r], offsets[r + 1]):
            block = blocks[i]
            seen_at = last_time.get(block)
            if seen_at is not None:
                gap_row[i] = int(np.searchsorted(GAP_EDGES_S, now - seen_at, side="right"))
                if block in shared or first_conv[block] != c:
                    shared.add(block)
                    is_shared[i] = True
            else:
                first_conv[block] = c
            last_time[block] = now
    return gap_row, is_shared


def hit_flags(trace: Trace, hits_per_request: NDArray[np.int64]) -> NDArray[np.bool_]:
    """Per access, whether it was a hit (its position in its request below the hits)."""
    lengths = np.diff(trace.offsets)
    position = np.arange(trace.n_accesses) - np.repeat(trace.offsets[:-1], lengths)
    flags: NDArray[np.bool_] = position < np.repeat(hits_per_request, lengths)
    return flags


def replayed(args: tuple[str, Trace, int]) -> NDArray[np.int64]:
    name, trace, capacity = args
    return replay_hits(trace, catalog.create(name, capacity, trace, ReplayOptions()), capacity)


def row_label(row: int) -> str:
    lo = 0.0 if row == 0 else GAP_EDGES_S[row - 1]
    return f"{lo:g}-{GAP_EDGES_S[row]:g} s" if row < len(GAP_EDGES_S) else f">= {lo:g} s"


def table(trace: Trace, names: Sequence[str], hits: dict[str, NDArray[np.int64]]) -> str:
    gap_row, is_shared = access_rows(trace)
    flags = {n: hit_flags(trace, hits[n]) for n in names}
    head = "| kind | reuse gap | accesses | " + " | ".join(names) + " |"
    lines = [head, "|---|---|---:|" + "---:|" * len(names)]
    for kind, mask in (("own", ~is_shared), ("shared", is_shared)):
        for row in range(len(GAP_EDGES_S) + 1):
            cell = mask & (gap_row == row)
            counts = " | ".join(f"{int(flags[n][cell].sum()):,}" for n in names)
            lines.append(f"| {kind} | {row_label(row)} | {int(cell.sum()):,} | {counts} |")
    totals = " | ".join(f"{int(flags[n].sum()):,}" for n in names)
    lines.append(f"| all | | {trace.n_accesses:,} | {totals} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    ap = synthetic_trace_parser(__doc__, seed=7, duration_s=1800.0)
    ap.add_argument("--profile", default="to-c")
    ap.add_argument("--frac", type=float, default=0.01, help="capacity, share of unique blocks")
    ap.add_argument("--policies", default="lru,wa", help="compared with belady, comma-separated")
    args = ap.parse_args(argv)
    trace = synthesize(args.profile, duration_s=args.duration, qps=args.qps, seed=args.seed)
    capacity = round(args.frac * trace.n_unique)
    names = [*[p for p in args.policies.split(",") if p], "belady"]
    print(f"{trace.name}: {capacity:,} blocks, replaying {', '.join(names)}", file=sys.stderr)
    with ProcessPoolExecutor(max(1, args.jobs)) as pool:
        results = pool.map(replayed, [(n, trace, capacity) for n in names])
        hits = dict(zip(names, results, strict=True))
    print(f"**{trace.name}, {args.frac:.0%} of unique blocks ({capacity:,})**: hits by row\n")
    print(table(trace, names, hits))


if __name__ == "__main__":
    main()

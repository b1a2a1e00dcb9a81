"""Benchmark: the time an agent's subscriber holds the GIL to check one policy document, for
documents of ``max_policy_bytes`` (2 MiB by default) shaped to cost the most per byte, and
for the largest legitimate ones.

Each document is checked as the subscriber checks it (``decode_policy`` with the agent's
default limits), ``--runs`` times. The check holds the GIL throughout, so its wall time is
what the engine's thread waits; the least CPU time is the figure least disturbed by other
work on a shared machine. The table gives both, and what came of the document.

    python -m tests.bench.bench_policy_decode [--runs 9]

Not collected by pytest; results go in docs/benchmarks.md ("Policy document check").
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from agent.wire import WireError, decode_policy, encode_policy
from tests.wire_samples import MAX_POLICY_BYTES, MAX_POLICY_CATEGORIES, filled, largest_policy

_DEEP = (MAX_POLICY_BYTES - 20) // 6
_BAD = b'{"rate":"x","p_reuse":"x","life_s":"x","samples":"x","fit_quality":"x","source":"x"}'

DOCUMENTS: dict[str, Callable[[], bytes]] = {
    "empty arrays in an unknown field": lambda: filled(b'{"version":1,"x":[', b"[]", b"]}"),
    "empty arrays as a category": lambda: filled(
        b'{"version":1,"categories":{"a":[', b"[]", b"]}}"
    ),
    "arrays nested 100 deep": lambda: filled(b'{"version":1,"x":[', b"[" * 100 + b"]" * 100, b"]}"),
    "empty objects in an unknown field": lambda: filled(b'{"version":1,"x":{', b'"a":{}', b"}}"),
    "objects nested as deep as fits": lambda: (
        b'{"version":1,"x":' + b'{"a":' * _DEEP + b"{}" + b"}" * _DEEP + b"}"
    ),
    "unknown fields": lambda: filled(b'{"version":1,', b'"k":0', b"}"),
    "categories of one number": lambda: filled(b'{"version":1,"categories":{', b'"a":0', b"}}"),
    "one category of many keys": lambda: filled(
        b'{"version":1,"categories":{"a":{', b'"k":0', b"}}}"
    ),
    "4096 categories, every parameter bad": lambda: (
        b'{"version":1,"categories":{'
        + b",".join(b'"c%d":%s' % (i, _BAD) for i in range(MAX_POLICY_CATEGORIES))
        + b"}}"
    ),
    "largest legitimate, ASCII names": lambda: encode_policy(largest_policy()),
    "largest legitimate, two-byte names": lambda: encode_policy(largest_policy("é")),
}
"""Each document's builder, by what it holds (all within ``MAX_POLICY_BYTES``)."""


def check(raw: bytes) -> str:
    """What came of ``raw``: accepted, or the head of the reason it was refused."""
    try:
        decode_policy(raw, max_bytes=MAX_POLICY_BYTES, max_categories=MAX_POLICY_CATEGORIES)
    except WireError as exc:
        return f"refused: {exc.reason[:60]}"
    return "accepted"


def measure(raw: bytes, runs: int) -> tuple[list[float], list[float]]:
    """Wall and CPU seconds of ``runs`` checks of ``raw``."""
    walls, cpus = [], []
    for _ in range(runs):
        wall, cpu = time.perf_counter(), time.process_time()
        check(raw)
        cpus.append(time.process_time() - cpu)
        walls.append(time.perf_counter() - wall)
    return walls, cpus


def run(runs: int) -> None:
    print("| document | bytes | wall median | wall max | CPU least | outcome |")
    print("|---|---|---|---|---|---|")
    for name, build in DOCUMENTS.items():
        raw = build()
        assert len(raw) <= MAX_POLICY_BYTES, (name, len(raw))
        walls, cpus = measure(raw, runs)
        print(
            f"| {name} | {len(raw):,} | {statistics.median(walls) * 1e3:.1f} ms "
            f"| {max(walls) * 1e3:.1f} ms | {min(cpus) * 1e3:.1f} ms | {check(raw)} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=9, help="checks of each document")
    run(parser.parse_args().runs)


if __name__ == "__main__":
    main()

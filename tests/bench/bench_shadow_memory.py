"""Benchmark: the shadow evaluator's memory per block of a worker's capacity.

One worker's synthetic to-C traffic, at a capacity of ``--share`` of the trace's unique
blocks (small enough that even the ladder's 4x miniatures fill), is applied to an
evaluator at the default settings (rate 0.05, four policies, five ladder steps), its
capacity known from the start (with ``--reuse-classes``, filing by reuse class with the
agent's default ghost, ``REUSE_GHOST_CAPACITIES`` capacities; with ``--supersede``, its
heartbeat says its eviction runs the document's ``supersede`` rule, as a vLLM or SGLang
worker's does, so the ``wa`` miniatures replay it and hold its links). Python's
allocations are traced (``tracemalloc``) from before the evaluator is made: what it holds
at the end, then what its miniature caches alone hold (the difference once they are let
go), per block they hold and per block of the worker's capacity.

    python -m tests.bench.bench_shadow_memory [--duration 3600] [--share 0.02]
        [--rate 0.05] [--reuse-classes] [--supersede]

``--duration``: the trace's seconds; ``--share``: the capacity, a share of its unique
blocks; ``--rate``: the shadow's sampling rate; ``--reuse-classes``: file by reuse class;
``--supersede``: the worker runs the ``supersede`` rule (the default document's ``tree``).

Not collected by pytest; results go in docs/shadow.md ("Its memory").
"""

from __future__ import annotations

import gc
import tracemalloc

from agent.reuse_classes import REUSE_GHOST_CAPACITIES
from controlplane.shadow.evaluator import ShadowEvaluator
from controlplane.shadow.settings import ShadowSettings
from controlplane.traces.synth import synthesize
from tests.agent_stream import agent_batches
from tests.bench.command_line import run_from_command_line


def _traced() -> int:
    gc.collect()
    return tracemalloc.get_traced_memory()[0]


def run(duration: float, share: float, rate: float, reuse_classes: bool, supersede: bool) -> None:
    trace = synthesize("to-c", duration_s=duration, qps=3, seed=12)
    capacity = trace.capacity_for(share)
    batches = agent_batches(trace, capacity)
    settings = ShadowSettings(shadow_rate=rate)
    tracemalloc.start()
    start = _traced()
    shadow = ShadowEvaluator(settings)
    ghost = REUSE_GHOST_CAPACITIES * capacity if reuse_classes else None
    shadow.set_capacities({"w1": capacity}, {"w1": True}, {"w1": ghost}, {"w1": supersede})
    for batch in batches:
        shadow.apply(batch)
    shadow.flush("w1")
    view = shadow.view()
    total = _traced() - start
    caches = shadow.miniatures("w1")
    held = sum(len(cache.policy) for cache in caches)
    ghosts = sum(len(c.classing.tracker._ghost) for c in caches if c.classing is not None)
    linked = sum(len(c.branches) for c in caches if c.branches is not None)
    nominal = sum(cache.capacity for cache in caches)
    worker = shadow._workers["w1"]
    kept = sum(len(r.blocks) for r in worker.buffer)
    count = len(caches)
    del caches
    worker.miniatures = None
    miniatures = total - (_traced() - start)
    tracemalloc.stop()
    group = view.groups[0]
    print(f"to-C {duration:.0f} s, {trace.n_unique:,} unique blocks; capacity {capacity:,}")
    print(f"  sampled accesses {group.sampled_accesses:,}; kept requests {len(worker.buffer):,}")
    print(f"  miniatures ({count}): hold {held:,} blocks, their ghosts {ghosts:,}")
    print(f"    of {nominal:,} they may ({nominal / capacity:.2f} per block of capacity)")
    print(f"    the supersede rule's links and marks: {linked:,} blocks")
    print(f"  evaluator: {total / 2**20:.1f} MiB; miniatures {miniatures / 2**20:.1f} MiB")
    print(f"    {miniatures / held:.0f} bytes per block held")
    print(f"    {miniatures / capacity:.0f} bytes per block of capacity")
    print(f"  the rest: {(total - miniatures) / 2**20:.1f} MiB ({kept:,} kept blocks)")


def main() -> None:
    run_from_command_line(
        __doc__,
        run,
        duration=3600.0,
        share=0.02,
        rate=0.05,
        reuse_classes=False,
        supersede=False,
    )


if __name__ == "__main__":
    main()

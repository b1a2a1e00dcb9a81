"""Run one libCacheSim policy over an object trace; print its hit counts as JSON.

Test-only helper for ``test_crosscheck_libcachesim.py``. libCacheSim is GPL, so nothing
in ``agent`` or ``controlplane`` may import it, and it aborts the whole process on bad
input, so the test runs this file in a subprocess:

    python -m tests.integration.libcachesim_hits TRACE.npy POLICY CAP[,CAP...] [--hits-out DIR]

``TRACE.npy`` holds int64 object ids, one access each, every object of size 1, so a
capacity in bytes is a capacity in objects. Prints ``{"CAP": hits, ...}``. With
``--hits-out`` it also writes the per-access hit flags of each capacity to
``DIR/CAP.npy`` (to locate the first divergence when a cross-check fails).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

POLICIES = {
    "lru": "LRU",
    "fifo": "FIFO",
    "s3fifo": "S3FIFO",
    "sieve": "Sieve",
    "arc": "ARC",
    "lfu": "LFU",
}


def run(ids: list[int], policy: str, capacity: int) -> np.ndarray:
    import libcachesim

    cache = getattr(libcachesim, POLICIES[policy])(capacity)
    req = libcachesim.Request()
    req.obj_size = 1
    get = cache.get
    hits = np.zeros(len(ids), dtype=np.bool_)
    for i, obj in enumerate(ids):
        # libCacheSim's hash table treats id 0 like any other, but shift to be safe.
        req.obj_id = obj + 1
        hits[i] = get(req)
    return hits


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("policy", choices=sorted(POLICIES))
    ap.add_argument("capacities")
    ap.add_argument("--hits-out")
    args = ap.parse_args()
    ids = np.load(args.trace).astype(np.int64).tolist()
    out: dict[str, int] = {}
    for cap in (int(c) for c in args.capacities.split(",")):
        hits = run(ids, args.policy, cap)
        out[str(cap)] = int(hits.sum())
        if args.hits_out:
            np.save(Path(args.hits_out) / f"{cap}.npy", hits)
    print(json.dumps(out))


if __name__ == "__main__":
    main()

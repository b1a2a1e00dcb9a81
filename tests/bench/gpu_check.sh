#!/usr/bin/env bash
# The device evictor on a CUDA machine, in one command (run from anywhere):
#   bash tests/bench/gpu_check.sh
# 1. the differential tests against the CPU `wa`, with the tensors on the GPU
#    (test_same_victims_as_wa_on_cuda; the CPU ones run too), and the device's bound
#    pass against wa's numpy pass on the GPU (test_device_bounds_are_the_numpy_bounds_on_cuda);
# 2. the evict(n) benchmark on cuda, against the CPU `wa` and vLLM's stock free queue.
# Needs the project installed with a CUDA build of torch (pip install -e '.[test]').
set -euo pipefail
cd "$(dirname "$0")/../.."
python -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else "no CUDA device")'
python -m pytest -q -p no:cacheprovider tests/unit/test_device_evictor.py tests/unit/test_device_bounds.py
python -m tests.bench.bench_device_evictor --device cuda --blocks 100000 1000000 --calls 200

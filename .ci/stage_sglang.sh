#!/usr/bin/env bash
# CI stage: the SGLang integration against the real sglang package (docs/integrations/sglang.md,
# "Tests"). Run from the repository root, after the vLLM stage.
#
# SGLang lives in its own virtualenv outside the checkout (KVWISE_SGLANG_VENV, default
# ~/.cache/kvwise/sglang-venv), created on first use and then reused. The route: torch 2.14.1
# (the version sglang 0.5.23 pins, with its CUDA libraries: its torchvision needs them even
# on a CPU) and torchvision 0.29.1, then sglang itself without its dependencies, then only
# the modules its radix cache imports; the GPU kernels, server and multimodal stacks that a
# full `pip install sglang` adds are left out. This checkout is installed editable there,
# with pytest, and the real-package tests run in that interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${KVWISE_SGLANG_VENV:-$HOME/.cache/kvwise/sglang-venv}"
PY="$VENV/bin/python"
PIP=("$PY" -m pip install --quiet --disable-pip-version-check)
TORCH=(torch==2.14.1 torchvision==0.29.1)
SGLANG=sglang==0.5.23
# What `import sglang.srt.mem_cache.radix_cache` needs beyond torch (found by importing it).
RADIX_DEPS=(numpy orjson psutil pybase64 requests packaging pillow starlette msgspec pydantic
  pyzmq tqdm ipython aiohttp dill gguf transformers==5.19.0 apache-tvm-ffi==0.1.11
  sentencepiece==0.2.1 compressed-tensors==0.18.0)
TEST_DEPS=(pytest pytest-timeout httpx)
# The test tools at the versions the main suite pins (tests/constraints.txt pins torch 2.13.0
# too, so only these lines of it apply here).
TEST_PINS="$(grep -E '^(pytest|pytest-timeout|httpx)==' tests/constraints.txt)"

want="$(printf '%s\n' "${TORCH[@]}" "$SGLANG" "${RADIX_DEPS[@]}" "$TEST_PINS" \
  "$PWD" "$(sha256sum pyproject.toml)")"
stamp="$VENV/kvwise-stamp"
if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]]; then
  start=$SECONDS
  [[ -x "$PY" ]] || python3 -m venv "$VENV"
  pins="$VENV/kvwise-pins.txt"
  printf '%s\n' "${TORCH[@]}" "$TEST_PINS" >"$pins"
  "${PIP[@]}" "${TORCH[@]}"
  "${PIP[@]}" --no-deps "$SGLANG"
  "${PIP[@]}" -c "$pins" "${RADIX_DEPS[@]}" "${TEST_DEPS[@]}"
  "${PIP[@]}" -c "$pins" -e .
  echo "$want" >"$stamp"
  echo "sglang stage: virtualenv $VENV ready in $((SECONDS - start)) s"
fi

KVWISE_TEST_SGLANG=1 "$PY" -m pytest -p no:cacheprovider -m sglang tests/integration/test_sglang_radix.py \
  tests/integration/test_sglang_superseded.py

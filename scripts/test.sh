#!/usr/bin/env bash
# Builds everything with the ci preset (-O2, assertions on, warnings as errors, -march=native,
# every public header compiled on its own) and runs the whole test suite; then builds the tests
# again for the baseline x86-64 ISA (preset portable: what a consumer gets without -march=native)
# and runs them (all but the packaging and compile-fail checks, which do not depend on the ISA).
#   GPT2_SMALL_WEIGHTS=/path/to/gpt2-small-h0-attention.safetensors scripts/test.sh
#     also runs the tests against the real GPT-2 layer-0 weights.
#   GPT2_JOBS=<n> (default 2): parallel compile and test jobs.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
jobs=${GPT2_JOBS:-2}

scripts/install-deps.sh

configure_args=()
if [[ -n ${GPT2_SMALL_WEIGHTS:-} ]]; then
  configure_args+=("-DGPT2_SMALL_WEIGHTS=${GPT2_SMALL_WEIGHTS}")
fi
cmake --preset ci "${configure_args[@]}"
cmake --build --preset ci --parallel "$jobs"
ctest --preset ci --output-on-failure -j "$jobs"

cmake --preset portable "${configure_args[@]}"
cmake --build --preset portable --parallel "$jobs"
ctest --preset portable --output-on-failure -j "$jobs"

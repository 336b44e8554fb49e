#!/usr/bin/env bash
# Builds the gpt2-attention CLI with the release preset (-O3, -march=native) and runs its demo.
#   scripts/demo.sh [demo args...]
# The build runs from the repository root; the demo runs from the caller's directory, so relative
# paths in the arguments (--weights model.safetensors) mean what they say.
# Progress goes to stderr: a "demo.sh:" line before each phase (dependencies, configure, build,
# run) and, while building, ninja's "[n/m]" line for each compile step (with the seconds elapsed);
# stdout carries the demo's output alone. GPT2_JOBS sets the number of compile jobs (default 2).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
jobs=${GPT2_JOBS:-2}
say() { printf 'demo.sh: %s\n' "$*" >&2; }
start=$SECONDS
(
  cd "$root"
  say "checking the build dependencies (scripts/install-deps.sh; apt-get only if one is missing)"
  scripts/install-deps.sh
  say "configuring build/release (cmake --preset release)"
  cmake --preset release
  say "building gpt2-attention with $jobs jobs (GPT2_JOBS); [n/m] is step n of m"
  NINJA_STATUS=${NINJA_STATUS:-"[%f/%t %es] "} \
    cmake --build --preset release --target gpt2-attention --parallel "$jobs"
) >&2
say "built in $((SECONDS - start)) s; running: gpt2-attention demo $*"
exec "$root/build/release/examples/gpt2-attention" demo "$@"

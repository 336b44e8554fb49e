#!/usr/bin/env bash
# Builds the gpt2-attention CLI with the release preset (-O3, -march=native) and runs its demo.
#   scripts/demo.sh [demo args...]
# The build runs from the repository root; the demo runs from the caller's directory, so relative
# paths in the arguments (--weights model.safetensors) mean what they say.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
(
  cd "$root"
  scripts/install-deps.sh
  cmake --preset release
  cmake --build --preset release --target gpt2-attention --parallel "${GPT2_JOBS:-2}"
) >&2
exec "$root/build/release/examples/gpt2-attention" demo "$@"

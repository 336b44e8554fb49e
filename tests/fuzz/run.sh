#!/usr/bin/env bash
# Runs the three libFuzzer targets of tests/fuzz for a bounded time each, all at once, starting
# from the committed seed corpus (tests/fuzz/corpus/<target>/; read only: new inputs go to
# <build>/fuzz-work/), and prints libFuzzer's final statistics of each. Fails when any target
# finds a crash, a sanitizer report, a leak, a timeout or an out-of-memory; the input is then in
# <build>/fuzz-work/artifacts/ (turn it into a regression: tests/fuzz/regressions/<target>/ and a
# test in tests/test_fuzz_regressions.cpp).
#   tests/fuzz/run.sh [BUILD_DIR [SECONDS]]     defaults: build/fuzz, GPT2_FUZZ_SECONDS or 60
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build=${1:-$here/../../build/fuzz}
seconds=${2:-${GPT2_FUZZ_SECONDS:-60}}
work=$build/fuzz-work
mkdir -p "$work/artifacts"

# target binary : corpus directory : dictionary
targets=(fuzz_safetensors:safetensors:safetensors.dict fuzz_npy:npy:npy.dict fuzz_cli_args:cli:cli.dict)

pids=()
for t in "${targets[@]}"; do
  IFS=: read -r bin name dict <<<"$t"
  mkdir -p "$work/corpus/$name"
  "$build/tests/fuzz/$bin" -max_total_time="$seconds" -print_final_stats=1 -max_len=8192 \
    -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024 -dict="$here/$dict" \
    -artifact_prefix="$work/artifacts/$name-" "$work/corpus/$name" "$here/corpus/$name" \
    >"$work/$name.log" 2>&1 &
  pids+=($!)
done

status=0
for i in "${!targets[@]}"; do
  IFS=: read -r bin name dict <<<"${targets[$i]}"
  if wait "${pids[$i]}"; then result=ok; else result=FAILED; status=1; fi
  runs=$(grep -Eo 'Done [0-9]+ runs in [0-9]+ second' "$work/$name.log" | tail -1 || true)
  execs=$(grep -E '^stat::number_of_executed_units' "$work/$name.log" | awk '{print $2}' || true)
  corpus=$(grep -Eo 'cov: [0-9]+ ft: [0-9]+ corp: [0-9]+/[0-9]+[a-zA-Z]*' "$work/$name.log" | tail -1 || true)
  echo "fuzz $bin: $result, ${execs:-?} executions in ${seconds} s (${runs:-no summary}; ${corpus:-})"
  if [[ $result == FAILED ]]; then
    echo "---- $work/$name.log (last 60 lines) ----"
    tail -60 "$work/$name.log"
  fi
done
exit $status

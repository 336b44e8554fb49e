#!/usr/bin/env bash
# The whole test suite, in four stages (each configures, builds what it runs, and runs it):
#   1. ci    (-O2, assertions on, warnings as errors, -march=native, every public header compiled
#            on its own): every ctest entry: unit and reference tests, CLI, examples, packaging,
#            compile-fail checks, benchmark smoke run.
#   2. asan  (clang, AddressSanitizer + UBSan, -O1, baseline x86-64 ISA: what a consumer gets
#            without -march=native, so results that depend on the vector width are caught too):
#            every test program again (all but the packaging and compile-fail checks, which do not
#            depend on the ISA or on memory safety, and the example programs, run by stage 1). This stage replaces the former portable stage (the
#            portable preset is still there: cmake --preset portable).
#   3. tsan  (ThreadSanitizer; OpenMP on for the thread count, the forwards on the library's own
#            threads, no OpenMP region): test_concurrency, test_paged_concurrency, test_threads,
#            test_kv_cache.
#   4. fuzz  (clang, libFuzzer + ASan + UBSan): each fuzz target for GPT2_FUZZ_SECONDS (default 60)
#            seconds, the three at once (tests/fuzz/run.sh), starting from tests/fuzz/corpus/.
#   The test presets run every entry with OMP_WAIT_POLICY=PASSIVE: ctest runs two at once, and
#   worker threads spinning between forwards would take the other entry's core (docs/hardening.md;
#   the library's worker teams follow that variable as OpenMP's threads do).
#   GPT2_SMALL_WEIGHTS=/path/to/gpt2-small-h0-attention.safetensors scripts/test.sh
#     also runs the tests against the real GPT-2 layer-0 weights.
#   GPT2_JOBS=<n> (default 2): parallel compile and test jobs.
#   GPT2_TEST_STAGES="ci asan tsan fuzz" (the default): the stages to run, in that order.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
jobs=${GPT2_JOBS:-2}
stages=${GPT2_TEST_STAGES:-ci asan tsan fuzz}

scripts/install-deps.sh

configure_args=()
if [[ -n ${GPT2_SMALL_WEIGHTS:-} ]]; then
  configure_args+=("-DGPT2_SMALL_WEIGHTS=${GPT2_SMALL_WEIGHTS}")
fi

stage_start=$SECONDS
stage_done() { echo "== scripts/test.sh: stage $1 passed in $((SECONDS - stage_start)) s"; stage_start=$SECONDS; }

for stage in $stages; do
  echo "== scripts/test.sh: stage $stage"
  case $stage in
    ci | asan)
      cmake --preset "$stage" "${configure_args[@]}"
      cmake --build --preset "$stage" --parallel "$jobs"
      ctest --preset "$stage" --output-on-failure -j "$jobs"
      ;;
    tsan)
      cmake --preset tsan
      cmake --build --preset tsan --parallel "$jobs"
      ctest --preset tsan --output-on-failure
      ;;
    fuzz)
      cmake --preset fuzz
      cmake --build --preset fuzz --parallel "$jobs"
      tests/fuzz/run.sh build/fuzz "${GPT2_FUZZ_SECONDS:-60}"
      ;;
    *)
      echo "scripts/test.sh: unknown stage '$stage' (expected ci, asan, tsan, fuzz)" >&2
      exit 2
      ;;
  esac
  stage_done "$stage"
done

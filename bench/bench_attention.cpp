// Google Benchmark suite for the attention sublayer, GPT-2 small (C = 768, 12 heads), fp32.
//   prefill/T:N          attention_forward over N tokens (allocation-free workspace)
//   decode/past:N        one token through a KV cache holding N positions (same weights each step)
//   baseline_eigen/T:N   the straightforward Eigen implementation (bench/baseline.hpp)
//   stage_qkv/T:N, stage_attention/T:N, stage_proj/T:N   the three stages of prefill
//   peak_fma             the machine's FMA peak on one core, to read results as a share of it
// Counters: FLOP/s (`flops`, iteration-invariant rate), tokens/s (items_per_second).
// Compare runs from --benchmark_format=json output, never by eye.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdlib>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "baseline.hpp"
#include "gpt2/attention.hpp"

namespace {

using gpt2::Index;
using gpt2::RowMatrix;
using gpt2::RowVector;

constexpr Index kC = 768, kHeads = 12, kHeadDim = 64;

struct Gpt2Small {
  RowMatrix<float> c_attn_w, c_proj_w;
  RowVector<float> c_attn_b, c_proj_b;
  Gpt2Small() {
    std::srand(1);
    c_attn_w = RowMatrix<float>::Random(kC, 3 * kC) * 0.05f;
    c_proj_w = RowMatrix<float>::Random(kC, kC) * 0.05f;
    c_attn_b = RowVector<float>::Random(3 * kC) * 0.1f;
    c_proj_b = RowVector<float>::Random(kC) * 0.1f;
  }
  gpt2::AttentionWeights<float> weights() const {
    return {{kC, kHeads}, gpt2::view(c_attn_w), gpt2::view(c_attn_b), gpt2::view(c_proj_w),
            gpt2::view(c_proj_b)};
  }
};

const Gpt2Small& model() {
  static const Gpt2Small m;
  return m;
}

// FLOP of one sublayer over T tokens: both projections plus the causal triangle of q k^T and att v.
double qkv_flop(Index T) { return 2.0 * T * kC * 3 * kC; }
double proj_flop(Index T) { return 2.0 * T * kC * kC; }
double attention_flop(Index T) { return 2.0 * 2.0 * kHeads * kHeadDim * T * (T + 1) / 2.0; }
double sublayer_flop(Index T) { return qkv_flop(T) + proj_flop(T) + attention_flop(T); }

void set_counters(benchmark::State& state, Index T, double flop) {
  state.counters["flops"] =
      benchmark::Counter(flop, benchmark::Counter::kIsIterationInvariantRate);
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * T);
}

RowMatrix<float> input(Index T) {
  std::srand(2);
  return RowMatrix<float>::Random(T, kC);
}

void prefill(benchmark::State& state) {
  const Index T = state.range(0);
  const gpt2::AttentionWeights<float> w = model().weights();
  const RowMatrix<float> x = input(T);
  RowMatrix<float> out(T, kC);
  gpt2::Workspace<float> ws(w.config(), T);
  for (auto _ : state) {
    gpt2::attention_forward<float>(w, x, ws, out);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  set_counters(state, T, sublayer_flop(T));
}

// One decode step: one new token attending to `past` cached positions plus itself. The cache is
// truncated back to `past` after each step, so every iteration does the same work.
void decode(benchmark::State& state) {
  const Index past = state.range(0);
  const gpt2::AttentionWeights<float> w = model().weights();
  const RowMatrix<float> x = input(past + 1);
  gpt2::KVCache<float> cache(w.config(), past + 1);
  gpt2::Workspace<float> ws(w.config(), std::max<Index>(past, 1), cache.capacity());
  RowMatrix<float> out(past + 1, kC);
  gpt2::attention_forward<float>(w, x.topRows(past), cache, ws, out.topRows(past));
  for (auto _ : state) {
    gpt2::attention_forward<float>(w, x.row(past), cache, ws, out.row(past));
    cache.truncate(past);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  set_counters(state, 1, qkv_flop(1) + proj_flop(1) + 2.0 * 2.0 * kHeads * kHeadDim * (past + 1));
}

void baseline_eigen(benchmark::State& state) {
  const Index T = state.range(0);
  const gpt2::AttentionWeights<float> w = model().weights();
  const RowMatrix<float> x = input(T);
  for (auto _ : state) {
    RowMatrix<float> out = gpt2::bench::baseline_attention(w, x);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  set_counters(state, T, sublayer_flop(T));
}

void stage_qkv(benchmark::State& state) {
  const Index T = state.range(0);
  const gpt2::AttentionWeights<float> w = model().weights();
  const RowMatrix<float> x = input(T);
  gpt2::Workspace<float> ws(w.config(), T);
  for (auto _ : state) {
    gpt2::qkv_projection<float>(w, x, ws.qkv.topRows(T), ws.qkv_gemm);
    benchmark::DoNotOptimize(ws.qkv.data());
    benchmark::ClobberMemory();
  }
  set_counters(state, T, qkv_flop(T));
}

void stage_attention(benchmark::State& state) {
  const Index T = state.range(0);
  const gpt2::AttentionWeights<float> w = model().weights();
  gpt2::Workspace<float> ws(w.config(), T);
  gpt2::qkv_projection<float>(w, input(T), ws.qkv.topRows(T), ws.qkv_gemm);
  const gpt2::ConstMatrixRef<float> qkv = ws.qkv.topRows(T);
  for (auto _ : state) {
    for (Index h = 0; h < kHeads; ++h)
      gpt2::causal_attention_head<float>(gpt2::q_view(qkv, w.config(), h),
                                         gpt2::k_view(qkv, w.config(), h),
                                         gpt2::v_view(qkv, w.config(), h),
                                         gpt2::head_slot(ws.merged.topRows(T), w.config(), h),
                                         ws.attention);
    benchmark::DoNotOptimize(ws.merged.data());
    benchmark::ClobberMemory();
  }
  set_counters(state, T, attention_flop(T));
}

void stage_proj(benchmark::State& state) {
  const Index T = state.range(0);
  const gpt2::AttentionWeights<float> w = model().weights();
  const RowMatrix<float> merged = input(T);
  RowMatrix<float> out(T, kC);
  gpt2::GemmScratch<float> gemm(T, kC, kC);
  for (auto _ : state) {
    gpt2::output_projection<float>(w, merged, out, gemm);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  set_counters(state, T, proj_flop(T));
}

// Independent FMA chains in registers: the one-core FMA peak this binary can reach.
void peak_fma(benchmark::State& state) {
#if defined(__AVX512F__)
  constexpr int kChains = 12;
  using V = __m512;
  constexpr int kLanes = 16;
  auto fma = [](V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); };
  const V mul = _mm512_set1_ps(0.999999f), add = _mm512_set1_ps(1e-7f);
  V acc[kChains];
  for (V& a : acc) a = _mm512_set1_ps(1.0f);
#elif defined(__FMA__)
  constexpr int kChains = 12;
  using V = __m256;
  constexpr int kLanes = 8;
  auto fma = [](V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); };
  const V mul = _mm256_set1_ps(0.999999f), add = _mm256_set1_ps(1e-7f);
  V acc[kChains];
  for (V& a : acc) a = _mm256_set1_ps(1.0f);
#else
  state.SkipWithError("built without FMA (configure with GPT2_ATTENTION_NATIVE=ON)");
  return;
#endif
#if defined(__AVX512F__) || defined(__FMA__)
  constexpr int kSteps = 1000;
  for (auto _ : state) {
    for (int s = 0; s < kSteps; ++s)
      for (V& a : acc) a = fma(a, mul, add);
    for (V& a : acc) benchmark::DoNotOptimize(a);
  }
  state.counters["flops"] = benchmark::Counter(2.0 * kLanes * kChains * kSteps,
                                               benchmark::Counter::kIsIterationInvariantRate);
#endif
}

const std::vector<int64_t> kTokens = {64, 256, 1024};

BENCHMARK(prefill)->Name("prefill")->ArgsProduct({kTokens})->ArgNames({"T"})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(decode)->Name("decode")->ArgsProduct({{0, 127, 1023}})->ArgNames({"past"})->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(baseline_eigen)->Name("baseline_eigen")->ArgsProduct({kTokens})->ArgNames({"T"})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(stage_qkv)->Name("stage_qkv")->ArgsProduct({kTokens})->ArgNames({"T"})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(stage_attention)->Name("stage_attention")->ArgsProduct({kTokens})->ArgNames({"T"})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(stage_proj)->Name("stage_proj")->ArgsProduct({kTokens})->ArgNames({"T"})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(peak_fma)->Name("peak_fma")->UseRealTime();

}  // namespace

BENCHMARK_MAIN();

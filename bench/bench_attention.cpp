// Google Benchmark suite for the attention sublayer, GPT-2 small (C = 768, 12 heads), fp32. Every
// benchmark takes the thread count as its last argument (threads:N, set with gpt2::set_num_threads).
//   prefill/T:N                 attention_forward over N tokens (allocation-free workspace)
//   decode/past:N               one token through a KV cache holding N positions (same weights and
//                               cache each step: they stay in the last-level cache)
//   decode_model/past:1023      one decode step per layer through the 12 layers of a GPT-2 small
//                               with distinct weights and caches, cycled (about 190 MB: they come
//                               from DRAM); time per layer. Counter `bytes`: bytes read per step
//   decode_batch/B:N/past:1023  one batched decode step of N sequences, each with its own cache (one
//                               layer): time per step, tokens_per_second counts the N tokens
//   baseline_eigen/T:N          the straightforward Eigen implementation (bench/baseline.hpp)
//   baseline_eigen_decode/past:N  the same for one decode step
//   stage_qkv/T:N, stage_attention/T:N, stage_proj/T:N   the three stages of prefill
//   peak_fma                    the machine's FMA peak on that many cores
//   bandwidth                   read bandwidth from DRAM on that many cores (`bytes_per_second`)
//   bandwidth_cached            the same over 16 MB, which stays in the last-level cache
// Counters: `flops` (FLOP/s) and `tokens_per_second`, both over wall-clock time (measured here:
// Google Benchmark's rate counters divide by the main thread's CPU time, and its real-time mode
// renames the benchmarks). Compare runs from --benchmark_format=json output (bench/compare.py).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "baseline.hpp"
#include "gpt2_small_layer.hpp"
#include "gpt2/attention.hpp"

namespace {

using gpt2::Index;
using gpt2::RowMatrix;
using gpt2::RowVector;

constexpr Index kC = 768, kHeads = 12, kHeadDim = 64, kLayers = 12;

using gpt2::bench::Gpt2SmallLayer;

const Gpt2SmallLayer& model() {
  static const Gpt2SmallLayer m(1);
  return m;
}

RowMatrix<float> input(Index T) {
  std::srand(2);
  return RowMatrix<float>::Random(T, kC);
}

// FLOP of one sublayer over T tokens: both projections plus the causal triangle of q k^T and att v.
double qkv_flop(Index T) { return 2.0 * T * kC * 3 * kC; }
double proj_flop(Index T) { return 2.0 * T * kC * kC; }
double attention_flop(Index T) { return 2.0 * 2.0 * kHeads * kHeadDim * T * (T + 1) / 2.0; }
double sublayer_flop(Index T) { return qkv_flop(T) + proj_flop(T) + attention_flop(T); }
double decode_flop(Index past) {
  return qkv_flop(1) + proj_flop(1) + 2.0 * 2.0 * kHeads * kHeadDim * (past + 1);
}

// Sets the thread count of the benchmark (its argument `arg`, the last one); false (and the
// benchmark skipped) when this build cannot run that many.
bool use_threads(benchmark::State& state, int arg = 1) {
  const int n = static_cast<int>(state.range(arg));
  if (gpt2::set_num_threads(n) != n) {
    state.SkipWithError("this build has no OpenMP: only threads:1 runs");
    return false;
  }
  Eigen::setNbThreads(n);  // the baseline's Eigen products
  return true;
}

// Wall-clock time of the timed loop, for counters that are rates over real time.
class WallClock {
 public:
  void start() { begin_ = std::chrono::steady_clock::now(); }
  void stop() { seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin_).count(); }
  double seconds() const { return seconds_; }

 private:
  std::chrono::steady_clock::time_point begin_;
  double seconds_ = 0;
};

// flops and tokens_per_second over the wall-clock time of the loop.
void set_counters(benchmark::State& state, const WallClock& clock, double tokens_per_iter,
                  double flop_per_iter) {
  const double iters = static_cast<double>(state.iterations());
  if (clock.seconds() <= 0 || iters == 0) return;
  state.counters["flops"] = flop_per_iter * iters / clock.seconds();
  state.counters["tokens_per_second"] = tokens_per_iter * iters / clock.seconds();
}

void prefill(benchmark::State& state) {
  if (!use_threads(state)) return;
  const Index T = state.range(0);
  const gpt2::AttentionWeights<float> w = model().weights();
  const RowMatrix<float> x = input(T);
  RowMatrix<float> out(T, kC);
  gpt2::Workspace<float> ws(w.config(), T);
  WallClock clock;
  clock.start();
  for (auto _ : state) {
    gpt2::attention_forward<float>(w, x, ws, out);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  clock.stop();
  set_counters(state, clock, T, sublayer_flop(T));
}

// One decode step: one new token attending to `past` cached positions plus itself. The cache is
// truncated back to `past` after each step, so every iteration does the same work.
void decode(benchmark::State& state) {
  if (!use_threads(state)) return;
  const Index past = state.range(0);
  const gpt2::AttentionWeights<float> w = model().weights();
  const RowMatrix<float> x = input(past + 1);
  gpt2::KVCache<float> cache(w.config(), past + 1);
  gpt2::Workspace<float> ws(w.config(), std::max<Index>(past, 1), cache.capacity());
  RowMatrix<float> out(past + 1, kC);
  gpt2::attention_forward<float>(w, x.topRows(past), cache, ws, out.topRows(past));
  WallClock clock;
  clock.start();
  for (auto _ : state) {
    gpt2::attention_forward<float>(w, x.row(past), cache, ws, out.row(past));
    cache.truncate(past);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  clock.stop();
  set_counters(state, clock, 1, decode_flop(past));
}

// One batched decode step of B sequences, each with its own cache of `past` positions (one layer,
// the same weights every step): one new token per sequence through the cached batched forward.
// The caches are truncated back after each step. B caches of past 1023 are 6.3 MB each, so at
// B = 16 they come from DRAM; the weights (9.4 MB) are shared by the batch.
void decode_batch(benchmark::State& state) {
  if (!use_threads(state, 2)) return;
  const Index B = state.range(0), past = state.range(1);
  const gpt2::AttentionWeights<float> w = model().weights();
  std::vector<gpt2::KVCache<float>> caches;
  gpt2::Workspace<float> ws(w.config(), std::max<Index>(past, B), past + 1);
  const RowMatrix<float> prompt = input(past);
  RowMatrix<float> prompt_out(past, kC);
  for (Index b = 0; b < B; ++b) {
    caches.emplace_back(w.config(), past + 1);
    gpt2::attention_forward<float>(w, prompt, caches.back(), ws, prompt_out);
  }
  const RowMatrix<float> x = input(B);
  RowMatrix<float> out(B, kC);
  const gpt2::BatchLayout step = gpt2::BatchLayout::full(B, 1);
  WallClock clock;
  clock.start();
  for (auto _ : state) {
    gpt2::attention_forward<float>(w, x, step, caches, ws, out);
    for (gpt2::KVCache<float>& cache : caches) cache.truncate(past);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  clock.stop();
  set_counters(state, clock, static_cast<double>(B), static_cast<double>(B) * decode_flop(past));
}

// The 12 attention layers of a GPT-2 small, each with its weights and a KV cache of `past`
// positions. Built once (about 190 MB for past 1023) and shared by the decode_model runs.
struct Model {
  std::vector<Gpt2SmallLayer> layers;
  std::vector<gpt2::KVCache<float>> caches;
  Index past = -1;
};

Model& decode_model_state(Index past) {
  static Model m;
  if (m.past == past) return m;
  m.layers.clear();
  m.caches.clear();
  const RowMatrix<float> x = input(past);
  RowMatrix<float> out(past, kC);
  gpt2::Workspace<float> ws(gpt2::AttentionConfig{kC, kHeads}, past, past + 1);
  for (Index l = 0; l < kLayers; ++l) {
    m.layers.emplace_back(static_cast<unsigned>(100 + l));
    m.caches.emplace_back(gpt2::AttentionConfig{kC, kHeads}, past + 1);
    gpt2::attention_forward<float>(m.layers.back().weights(), x, m.caches.back(), ws, out);
  }
  m.past = past;
  return m;
}

// One decode step per iteration, through layer (iteration mod 12): the weights and cache of the
// other 11 layers have pushed this one's out of the caches by then, as in a real model.
void decode_model(benchmark::State& state) {
  if (!use_threads(state)) return;
  const Index past = state.range(0);
  Model& m = decode_model_state(past);
  std::vector<gpt2::AttentionWeights<float>> weights;
  for (const Gpt2SmallLayer& layer : m.layers) weights.push_back(layer.weights());
  const RowMatrix<float> x = input(1);
  RowMatrix<float> out(1, kC);
  gpt2::Workspace<float> ws(weights[0].config(), 1, past + 1);
  Index layer = 0;
  WallClock clock;
  clock.start();
  for (auto _ : state) {
    const std::size_t l = static_cast<std::size_t>(layer);
    gpt2::attention_forward<float>(weights[l], x, m.caches[l], ws, out);
    m.caches[l].truncate(past);
    layer = (layer + 1) % kLayers;
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  clock.stop();
  set_counters(state, clock, 1, decode_flop(past));
  // Read per step: the layer's weights, and the keys and values of past + 1 positions.
  state.counters["bytes"] = Gpt2SmallLayer::bytes() + 2.0 * 4.0 * kC * (past + 1);
}

void baseline_eigen(benchmark::State& state) {
  if (!use_threads(state)) return;
  const Index T = state.range(0);
  const gpt2::AttentionWeights<float> w = model().weights();
  const RowMatrix<float> x = input(T);
  WallClock clock;
  clock.start();
  for (auto _ : state) {
    RowMatrix<float> out = gpt2::bench::baseline_attention(w, x);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  clock.stop();
  set_counters(state, clock, T, sublayer_flop(T));
}

void baseline_eigen_decode(benchmark::State& state) {
  if (!use_threads(state)) return;
  const Index past = state.range(0);
  const gpt2::AttentionWeights<float> w = model().weights();
  RowMatrix<float> K = input(past + 1), V = K * 0.5f;  // rows 0 .. past - 1 act as the cache
  const RowMatrix<float> x = input(1);
  WallClock clock;
  clock.start();
  for (auto _ : state) {
    RowMatrix<float> out = gpt2::bench::baseline_decode_step(w, x, K, V, past);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  clock.stop();
  set_counters(state, clock, 1, decode_flop(past));
}

void stage_qkv(benchmark::State& state) {
  if (!use_threads(state)) return;
  const Index T = state.range(0);
  const gpt2::AttentionWeights<float> w = model().weights();
  const RowMatrix<float> x = input(T);
  gpt2::Workspace<float> ws(w.config(), T);
  gpt2::MatrixRef<float> qkv = ws.qkv.topRows(T);
  const int n_threads = gpt2::detail::forward_threads(ws);
  WallClock clock;
  clock.start();
  for (auto _ : state) {
    gpt2::detail::projection_parallel<float>(x, w.c_attn_weight(), w.c_attn_bias(), qkv, ws,
                                             n_threads);
    benchmark::DoNotOptimize(ws.qkv.data());
    benchmark::ClobberMemory();
  }
  clock.stop();
  set_counters(state, clock, T, qkv_flop(T));
}

void stage_attention(benchmark::State& state) {
  if (!use_threads(state)) return;
  const Index T = state.range(0);
  const gpt2::AttentionWeights<float> w = model().weights();
  gpt2::Workspace<float> ws(w.config(), T);
  gpt2::qkv_projection<float>(w, input(T), ws.qkv.topRows(T));
  const gpt2::ConstMatrixRef<float> qkv = ws.qkv.topRows(T);
  gpt2::MatrixRef<float> merged = ws.merged.topRows(T);
  const gpt2::AttentionConfig& config = w.config();
  const int n_threads = gpt2::detail::forward_threads(ws);
  WallClock clock;
  clock.start();
  for (auto _ : state) {
    gpt2::detail::attend_heads<float>(
        config, qkv, [&](Index h) { return gpt2::k_view(qkv, config, h); },
        [&](Index h) { return gpt2::v_view(qkv, config, h); }, ws, merged, nullptr, n_threads);
    benchmark::DoNotOptimize(ws.merged.data());
    benchmark::ClobberMemory();
  }
  clock.stop();
  set_counters(state, clock, T, attention_flop(T));
}

void stage_proj(benchmark::State& state) {
  if (!use_threads(state)) return;
  const Index T = state.range(0);
  const gpt2::AttentionWeights<float> w = model().weights();
  const RowMatrix<float> merged = input(T);
  RowMatrix<float> out(T, kC);
  gpt2::MatrixRef<float> out_ref = out;
  gpt2::Workspace<float> ws(w.config(), T);
  const int n_threads = gpt2::detail::forward_threads(ws);
  WallClock clock;
  clock.start();
  for (auto _ : state) {
    gpt2::detail::projection_parallel<float>(merged, w.c_proj_weight(), w.c_proj_bias(), out_ref,
                                             ws, n_threads);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  clock.stop();
  set_counters(state, clock, T, proj_flop(T));
}

// Independent FMA chains in registers on every thread: the FMA peak this binary can reach on
// that many cores.
#if defined(__AVX512F__)
using Vec = __m512;
constexpr int kLanes = 16;
inline Vec vec_fma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
inline Vec vec_set(float x) { return _mm512_set1_ps(x); }
#elif defined(__FMA__)
using Vec = __m256;
constexpr int kLanes = 8;
inline Vec vec_fma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
inline Vec vec_set(float x) { return _mm256_set1_ps(x); }
#endif

#if defined(__AVX512F__) || defined(__FMA__)
constexpr int kChains = 12, kSteps = 1000;

void fma_chains(int repeats) {
  const Vec mul = vec_set(0.999999f), add = vec_set(1e-7f);
  Vec acc[kChains];
  for (Vec& a : acc) a = vec_set(1.0f);
  for (int r = 0; r < repeats; ++r)
    for (int s = 0; s < kSteps; ++s)
      for (Vec& a : acc) a = vec_fma(a, mul, add);
  for (Vec& a : acc) benchmark::DoNotOptimize(a);
}
#endif

void peak_fma(benchmark::State& state) {
  if (!use_threads(state, 0)) return;
#if defined(__AVX512F__) || defined(__FMA__)
  const int n = static_cast<int>(state.range(0));
  constexpr int kRepeats = 200;  // about 0.4 ms per thread per iteration
  WallClock clock;
  clock.start();
  for (auto _ : state) {
    gpt2::detail::parallel_tasks(n, n, [](Index, int) { fma_chains(kRepeats); });
  }
  clock.stop();
  set_counters(state, clock, 0, 2.0 * kLanes * kChains * kSteps * kRepeats * n);
  state.counters.erase("tokens_per_second");
#else
  state.SkipWithError("built without FMA (configure with GPT2_ATTENTION_NATIVE=ON)");
#endif
}

// Sums a buffer split over the threads: bytes_per_second is the read bandwidth.
void read_bandwidth(benchmark::State& state, const Eigen::VectorXf& buffer) {
  if (!use_threads(state, 0)) return;
  const int n = static_cast<int>(state.range(0));
  const Index size = buffer.size();
  std::vector<float> sums(static_cast<std::size_t>(n));
  WallClock clock;
  clock.start();
  for (auto _ : state) {
    gpt2::detail::parallel_tasks(n, n, [&](Index part, int) {
      const gpt2::detail::ColumnRange r = gpt2::detail::column_part(size, part, n, 1024);
      sums[static_cast<std::size_t>(part)] = buffer.segment(r.begin, r.size()).sum();
    });
    benchmark::DoNotOptimize(sums.data());
    benchmark::ClobberMemory();
  }
  clock.stop();
  state.counters["bytes_per_second"] =
      4.0 * static_cast<double>(size) * static_cast<double>(state.iterations()) / clock.seconds();
}

// From DRAM: a 512 MB buffer, far larger than the last-level cache (the bound of decode_model).
void bandwidth(benchmark::State& state) {
  static const Eigen::VectorXf buffer = Eigen::VectorXf::Ones(Index(128) << 20);
  read_bandwidth(state, buffer);
}

// From the caches: 16 MB, about what one decode step reads with a 1023-token cache (the bound of
// decode/past:1023, whose weights and cache stay cached from step to step).
void bandwidth_cached(benchmark::State& state) {
  static const Eigen::VectorXf buffer = Eigen::VectorXf::Ones(Index(4) << 20);
  read_bandwidth(state, buffer);
}

const std::vector<int64_t> kThreads = {1, 2};
const std::vector<int64_t> kPrefillTokens = {64, 128, 256, 512, 1024, 2048};
const std::vector<int64_t> kTokens = {64, 256, 1024};

BENCHMARK(prefill)->Name("prefill")->ArgsProduct({kPrefillTokens, kThreads})->ArgNames({"T", "threads"})->Unit(benchmark::kMillisecond);
BENCHMARK(decode)->Name("decode")->ArgsProduct({{0, 127, 1023}, kThreads})->ArgNames({"past", "threads"})->Unit(benchmark::kMicrosecond);
BENCHMARK(decode_batch)->Name("decode_batch")->ArgsProduct({{4, 16}, {1023}, kThreads})->ArgNames({"B", "past", "threads"})->Unit(benchmark::kMicrosecond);
BENCHMARK(decode_model)->Name("decode_model")->ArgsProduct({{1023}, kThreads})->ArgNames({"past", "threads"})->Unit(benchmark::kMicrosecond);
BENCHMARK(baseline_eigen)->Name("baseline_eigen")->ArgsProduct({kTokens, kThreads})->ArgNames({"T", "threads"})->Unit(benchmark::kMillisecond);
BENCHMARK(baseline_eigen_decode)->Name("baseline_eigen_decode")->ArgsProduct({{1023}, kThreads})->ArgNames({"past", "threads"})->Unit(benchmark::kMicrosecond);
BENCHMARK(stage_qkv)->Name("stage_qkv")->ArgsProduct({kTokens, kThreads})->ArgNames({"T", "threads"})->Unit(benchmark::kMillisecond);
BENCHMARK(stage_attention)->Name("stage_attention")->ArgsProduct({kTokens, kThreads})->ArgNames({"T", "threads"})->Unit(benchmark::kMillisecond);
BENCHMARK(stage_proj)->Name("stage_proj")->ArgsProduct({kTokens, kThreads})->ArgNames({"T", "threads"})->Unit(benchmark::kMillisecond);
BENCHMARK(peak_fma)->Name("peak_fma")->ArgsProduct({kThreads})->ArgNames({"threads"});
BENCHMARK(bandwidth)->Name("bandwidth")->ArgsProduct({kThreads})->ArgNames({"threads"})->Unit(benchmark::kMillisecond);
BENCHMARK(bandwidth_cached)->Name("bandwidth_cached")->ArgsProduct({kThreads})->ArgNames({"threads"})->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();

// Google Benchmark suite for the attention sublayer, GPT-2 small (C = 768, 12 heads), fp32. Every
// benchmark takes the thread count as its last argument (threads:N, set with gpt2::set_num_threads).
//   prefill/T:N                 attention_forward over N tokens (allocation-free workspace)
//   decode/past:N               one token through a KV cache holding N positions (same weights and
//                               cache each step: they stay in the last-level cache)
//   decode_model/past:1023      one decode step per layer through the 12 layers of a GPT-2 small
//                               with distinct weights and caches, cycled (about 190 MB: they come
//                               from DRAM); time per layer. Counter `bytes`: bytes read per step
//   decode_model_bf16/past:1023 the same with bf16 weights and a bf16 KV cache (KVCacheBF16);
//                               decode_model_bf16_f32cache: bf16 weights, float32 cache
//   decode_model_int8/past:1023 the same with int8 weights and an int8 KV cache (KVCacheInt8)
//   prefill_bf16, prefill_int8, decode_bf16, decode_int8, stage_qkv_bf16, stage_qkv_int8: prefill,
//                               decode and stage_qkv with bf16 or int8 weights (a float32 cache)
//   decode_batch/B:N/past:1023  one batched decode step of N sequences, each with its own cache (one
//                               layer): time per step, tokens_per_second counts the N tokens
//                               (also B:64/past:512, the contiguous twin of decode_shared_prefix)
//   decode_shared_prefix/seqs:64/prefix:512  the same step for 64 sequences forked from one
//                               512-token prompt in a paged KV cache (its blocks shared). Counters
//                               `cache_bytes` (the pool's blocks in use) and `contiguous_bytes`
//                               (64 separate KVCaches of the same positions)
//   decode_paged_unshared/seqs:64/prefix:512  the same step, each sequence with its own copy of
//                               the prompt in the pool (nothing shared): the cost of paging alone
//   baseline_eigen/T:N          the straightforward Eigen implementation (bench/baseline.hpp)
//   baseline_eigen_decode/past:N  the same for one decode step
//   stage_qkv/T:N, stage_attention/T:N, stage_proj/T:N   the three stages of prefill
//   peak_fma, peak_fma_ymm      the machine's FMA peak on that many cores, 512-bit and 256-bit
//   peak_dpbf16                 VDPBF16PS's peak (AVX512-BF16; 2 FLOPs per bf16 multiply-add)
// The suite runs at the kernel level the CPU's features choose (GPT2_ATTENTION_ISA forces one:
// run it once per level to compare levels; the level is in the context as `kernels`).
//   bandwidth                   read bandwidth from DRAM on that many cores (`bytes_per_second`)
//   bandwidth_cached            the same over 16 MB, which stays in the last-level cache
// Counters: `flops` (FLOP/s) and `tokens_per_second`, both over wall-clock time (measured here:
// Google Benchmark's rate counters divide by the main thread's CPU time, and its real-time mode
// renames the benchmarks). Compare runs from --benchmark_format=json output (bench/compare.py).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>
#include "gpt2/kernels/cpu.hpp"
#if GPT2_ATTENTION_X86
#include <immintrin.h>
#endif

#include "baseline.hpp"
#include "gpt2_small_layer.hpp"
#include "gpt2/attention.hpp"
#include "gpt2/paged_kv_cache.hpp"

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

// model()'s weights packed once (pack_weights), as the library's users run them.
const gpt2::AttentionWeights<float>& packed_model() {
  static const gpt2::AttentionWeights<float> w = model().packed();
  return w;
}

// The same weights packed in bf16 (pack_weights(w, WeightDtype::bf16)).
const gpt2::AttentionWeights<float>& bf16_model() {
  static const gpt2::AttentionWeights<float> w = pack_weights(model().weights(), gpt2::WeightDtype::bf16);
  return w;
}

// The same weights packed in int8 (pack_weights(w, WeightDtype::int8)).
const gpt2::AttentionWeights<float>& int8_model() {
  static const gpt2::AttentionWeights<float> w = pack_weights(model().weights(), gpt2::WeightDtype::int8);
  return w;
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

void run_prefill(benchmark::State& state, const gpt2::AttentionWeights<float>& w) {
  if (!use_threads(state)) return;
  const Index T = state.range(0);
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
  // the scratch the forward works in: qkv and merged [T, 4C], plus per thread the attention
  // core's tile buffer (independent of T) and the projections' packing buffers
  state.counters["workspace_bytes"] = static_cast<double>(ws.bytes());
}
void prefill(benchmark::State& state) { run_prefill(state, packed_model()); }
void prefill_bf16(benchmark::State& state) { run_prefill(state, bf16_model()); }
void prefill_int8(benchmark::State& state) { run_prefill(state, int8_model()); }

// One decode step: one new token attending to `past` cached positions plus itself. The cache is
// truncated back to `past` after each step, so every iteration does the same work.
void run_decode(benchmark::State& state, const gpt2::AttentionWeights<float>& w) {
  if (!use_threads(state)) return;
  const Index past = state.range(0);
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
void decode(benchmark::State& state) { run_decode(state, packed_model()); }
void decode_bf16(benchmark::State& state) { run_decode(state, bf16_model()); }
void decode_int8(benchmark::State& state) { run_decode(state, int8_model()); }

// One batched decode step of B sequences, each with its own cache of `past` positions (one layer,
// the same weights every step): one new token per sequence through the cached batched forward.
// The caches are truncated back after each step. B caches of past 1023 are 6.3 MB each, so at
// B = 16 they come from DRAM; the weights (9.4 MB) are shared by the batch.
void decode_batch(benchmark::State& state) {
  if (!use_threads(state, 2)) return;
  const Index B = state.range(0), past = state.range(1);
  const gpt2::AttentionWeights<float>& w = packed_model();
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

// One batched decode step of `seqs` sequences forked from one prompt of `prefix` tokens in a paged
// KV cache (paged_kv_cache.hpp): the prompt computed once, its blocks shared by every sequence,
// each new token written to a block of its sequence's own. The sequences are truncated back after
// each step (the new blocks go back to the pool). The same step as decode_batch/B:seqs/past:prefix
// on contiguous caches: compare their times. Counters: cache_bytes, the bytes of the pool's blocks
// in use during a step; contiguous_bytes, what `seqs` KVCaches of prefix + 1 positions hold.
void decode_shared_prefix(benchmark::State& state) {
  if (!use_threads(state, 2)) return;
  const Index S = state.range(0), prefix = state.range(1);
  const gpt2::AttentionWeights<float>& w = packed_model();
  const Index br = gpt2::kKVBlockRows;
  const Index own_blocks = (prefix + 1 + br - 1) / br - prefix / br;  // a copied partial block + new
  gpt2::KVBlockPool<float> pool(w.config(), (prefix + br - 1) / br + S * own_blocks);
  gpt2::PagedSequence<float> root(pool);
  gpt2::Workspace<float> ws(w.config(), std::max<Index>(prefix, S), prefix + 1);
  {
    const RowMatrix<float> prompt = input(prefix);
    RowMatrix<float> prompt_out(prefix, kC);
    gpt2::attention_forward<float>(w, prompt, root, ws, prompt_out);
  }
  std::vector<gpt2::PagedSequence<float>> seqs;
  std::vector<gpt2::PagedSequence<float>*> ptrs;
  for (Index s = 0; s < S; ++s) {
    seqs.push_back(root.fork());
    seqs.back().reserve(prefix + 1);
  }
  for (gpt2::PagedSequence<float>& s : seqs) ptrs.push_back(&s);
  const RowMatrix<float> x = input(S);
  RowMatrix<float> out(S, kC);
  const gpt2::BatchLayout step = gpt2::BatchLayout::full(S, 1);
  gpt2::attention_forward<float>(w, x, step, ptrs, ws, out);  // untimed: the blocks of a step
  const double cache_bytes = static_cast<double>(pool.used_bytes());
  for (gpt2::PagedSequence<float>& s : seqs) s.truncate(prefix);
  WallClock clock;
  clock.start();
  for (auto _ : state) {
    gpt2::attention_forward<float>(w, x, step, ptrs, ws, out);
    for (gpt2::PagedSequence<float>& s : seqs) s.truncate(prefix);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  clock.stop();
  set_counters(state, clock, static_cast<double>(S), static_cast<double>(S) * decode_flop(prefix));
  state.counters["cache_bytes"] = cache_bytes;
  state.counters["contiguous_bytes"] =
      static_cast<double>(S * gpt2::KVCache<float>(w.config(), prefix + 1).bytes());
}

// decode_shared_prefix without the sharing: every sequence prefilled with the prompt into blocks of
// its own (the pool then holds as much as the contiguous caches), so that the step against
// decode_batch's measures what reading through block tables costs, apart from what sharing saves.
void decode_paged_unshared(benchmark::State& state) {
  if (!use_threads(state, 2)) return;
  const Index S = state.range(0), prefix = state.range(1);
  const gpt2::AttentionWeights<float>& w = packed_model();
  const Index br = gpt2::kKVBlockRows;
  gpt2::KVBlockPool<float> pool(w.config(), S * ((prefix + 1 + br - 1) / br));
  gpt2::Workspace<float> ws(w.config(), std::max<Index>(prefix, S), prefix + 1);
  std::vector<gpt2::PagedSequence<float>> seqs;
  std::vector<gpt2::PagedSequence<float>*> ptrs;
  {
    const RowMatrix<float> prompt = input(prefix);
    RowMatrix<float> prompt_out(prefix, kC);
    for (Index s = 0; s < S; ++s) {
      seqs.emplace_back(pool, prefix + 1);
      gpt2::attention_forward<float>(w, prompt, seqs.back(), ws, prompt_out);
    }
  }
  for (gpt2::PagedSequence<float>& s : seqs) ptrs.push_back(&s);
  const RowMatrix<float> x = input(S);
  RowMatrix<float> out(S, kC);
  const gpt2::BatchLayout step = gpt2::BatchLayout::full(S, 1);
  WallClock clock;
  clock.start();
  for (auto _ : state) {
    gpt2::attention_forward<float>(w, x, step, ptrs, ws, out);
    for (gpt2::PagedSequence<float>& s : seqs) s.truncate(prefix);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  clock.stop();
  set_counters(state, clock, static_cast<double>(S), static_cast<double>(S) * decode_flop(prefix));
  state.counters["cache_bytes"] = static_cast<double>(pool.used_bytes());
}

// The 12 attention layers of a GPT-2 small, each with its weights and a KV cache of `past`
// positions. Built once (about 190 MB for past 1023) and shared by the decode_model runs.
struct Model {
  std::vector<Gpt2SmallLayer> layers;
  std::vector<gpt2::KVCache<float>> caches;
  std::vector<gpt2::KVCacheBF16> bf16_caches;  // the same positions, keys and values in bf16
  std::vector<gpt2::KVCacheInt8> int8_caches;  // and in int8
  Index past = -1;
};

Model& decode_model_state(Index past) {
  static Model m;
  if (m.past == past) return m;
  m.layers.clear();
  m.caches.clear();
  m.bf16_caches.clear();
  m.int8_caches.clear();
  const RowMatrix<float> x = input(past);
  RowMatrix<float> out(past, kC);
  gpt2::Workspace<float> ws(gpt2::AttentionConfig{kC, kHeads}, past, past + 1);
  for (Index l = 0; l < kLayers; ++l) {
    m.layers.emplace_back(static_cast<unsigned>(100 + l));
    m.caches.emplace_back(gpt2::AttentionConfig{kC, kHeads}, past + 1);
    gpt2::attention_forward<float>(m.layers.back().weights(), x, m.caches.back(), ws, out);
    m.bf16_caches.emplace_back(gpt2::AttentionConfig{kC, kHeads}, past + 1);
    gpt2::attention_forward<float>(m.layers.back().weights(), x, m.bf16_caches.back(), ws, out);
    m.int8_caches.emplace_back(gpt2::AttentionConfig{kC, kHeads}, past + 1);
    gpt2::attention_forward<float>(m.layers.back().weights(), x, m.int8_caches.back(), ws, out);
  }
  m.past = past;
  return m;
}

// One decode step per iteration, through layer (iteration mod 12): the weights and cache of the
// other 11 layers have pushed this one's out of the caches by then, as in a real model. With
// bf16 (int8) weights the KV cache is bf16 (int8) too, KVCacheBF16 (KVCacheInt8), unless
// float_cache is set.
void run_decode_model(benchmark::State& state, gpt2::WeightDtype dtype, bool float_cache = false) {
  if (!use_threads(state)) return;
  const Index past = state.range(0);
  Model& m = decode_model_state(past);
  std::vector<gpt2::AttentionWeights<float>> weights;
  for (const Gpt2SmallLayer& layer : m.layers) weights.push_back(pack_weights(layer.weights(), dtype));
  const RowMatrix<float> x = input(1);
  RowMatrix<float> out(1, kC);
  gpt2::Workspace<float> ws(weights[0].config(), 1, past + 1);
  Index layer = 0;
  WallClock clock;
  clock.start();
  const bool bf16_cache = dtype == gpt2::WeightDtype::bf16 && !float_cache;
  const bool int8_cache = dtype == gpt2::WeightDtype::int8 && !float_cache;
  for (auto _ : state) {
    const std::size_t l = static_cast<std::size_t>(layer);
    if (int8_cache) {
      gpt2::attention_forward<float>(weights[l], x, m.int8_caches[l], ws, out);
      m.int8_caches[l].truncate(past);
    } else if (bf16_cache) {
      gpt2::attention_forward<float>(weights[l], x, m.bf16_caches[l], ws, out);
      m.bf16_caches[l].truncate(past);
    } else {
      gpt2::attention_forward<float>(weights[l], x, m.caches[l], ws, out);
      m.caches[l].truncate(past);
    }
    layer = (layer + 1) % kLayers;
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  clock.stop();
  set_counters(state, clock, 1, decode_flop(past));
  // Read per step: the layer's weights (their packed copies in bf16 or int8, with the int8 scales;
  // float32 biases), and the keys and values of past + 1 positions (2 bytes each in a bf16 cache;
  // 1 in an int8 cache, plus a float32 scale per position and head).
  const double weight_bytes = dtype != gpt2::WeightDtype::float32
                                  ? static_cast<double>(weights[0].packed_bytes()) + 4.0 * 4 * kC
                                  : Gpt2SmallLayer::bytes();
  const double row_bytes = int8_cache   ? 1.0 * kC + 4.0 * kHeads
                           : bf16_cache ? 2.0 * kC
                                        : 4.0 * kC;
  state.counters["bytes"] = weight_bytes + 2.0 * row_bytes * (past + 1);
}
void decode_model(benchmark::State& state) { run_decode_model(state, gpt2::WeightDtype::float32); }
void decode_model_bf16(benchmark::State& state) { run_decode_model(state, gpt2::WeightDtype::bf16); }
void decode_model_int8(benchmark::State& state) { run_decode_model(state, gpt2::WeightDtype::int8); }
void decode_model_bf16_f32cache(benchmark::State& state) {
  run_decode_model(state, gpt2::WeightDtype::bf16, true);
}

void baseline_eigen(benchmark::State& state) {
  if (!use_threads(state)) return;
  const Index T = state.range(0);
  const gpt2::AttentionWeights<float>& w = packed_model();
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
  const gpt2::AttentionWeights<float>& w = packed_model();
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

void run_stage_qkv(benchmark::State& state, const gpt2::AttentionWeights<float>& w) {
  if (!use_threads(state)) return;
  const Index T = state.range(0);
  const RowMatrix<float> x = input(T);
  gpt2::Workspace<float> ws(w.config(), T);
  gpt2::MatrixRef<float> qkv = ws.qkv.topRows(T);
  const int n_threads = gpt2::detail::forward_threads(ws);
  const auto sub = gpt2::detail::SublayerTraits<gpt2::AttentionWeights<float>>::of(w);
  const gpt2::kernels::Kernels<float>& k = gpt2::kernels::table<float>();
  gpt2::detail::reserve_for(sub, T, T, ws);
  WallClock clock;
  clock.start();
  for (auto _ : state) {
    gpt2::detail::project_parallel<float>(k, x, sub.c_attn, 3 * kC, qkv, ws, n_threads);
    benchmark::DoNotOptimize(ws.qkv.data());
    benchmark::ClobberMemory();
  }
  clock.stop();
  set_counters(state, clock, T, qkv_flop(T));
}
void stage_qkv(benchmark::State& state) { run_stage_qkv(state, packed_model()); }
void stage_qkv_bf16(benchmark::State& state) { run_stage_qkv(state, bf16_model()); }
void stage_qkv_int8(benchmark::State& state) { run_stage_qkv(state, int8_model()); }

void stage_attention(benchmark::State& state) {
  if (!use_threads(state)) return;
  const Index T = state.range(0);
  const gpt2::AttentionWeights<float>& w = packed_model();
  gpt2::Workspace<float> ws(w.config(), T);
  gpt2::qkv_projection<float>(w, input(T), ws.qkv.topRows(T));
  const gpt2::ConstMatrixRef<float> qkv = ws.qkv.topRows(T);
  gpt2::MatrixRef<float> merged = ws.merged.topRows(T);
  const int n_threads = gpt2::detail::forward_threads(ws);
  const auto sub = gpt2::detail::SublayerTraits<gpt2::AttentionWeights<float>>::of(w);
  const gpt2::kernels::Kernels<float>& k = gpt2::kernels::table<float>();
  gpt2::detail::reserve_for(sub, T, T, ws);
  const gpt2::detail::NoCache none;
  WallClock clock;
  clock.start();
  for (auto _ : state) {
    gpt2::detail::attend_sequence<float>(k, sub, qkv, none, ws, merged, nullptr, n_threads);
    benchmark::DoNotOptimize(ws.merged.data());
    benchmark::ClobberMemory();
  }
  clock.stop();
  set_counters(state, clock, T, attention_flop(T));
}

void stage_proj(benchmark::State& state) {
  if (!use_threads(state)) return;
  const Index T = state.range(0);
  const gpt2::AttentionWeights<float>& w = packed_model();
  const RowMatrix<float> merged = input(T);
  RowMatrix<float> out(T, kC);
  gpt2::MatrixRef<float> out_ref = out;
  gpt2::Workspace<float> ws(w.config(), T);
  const int n_threads = gpt2::detail::forward_threads(ws);
  const auto sub = gpt2::detail::SublayerTraits<gpt2::AttentionWeights<float>>::of(w);
  const gpt2::kernels::Kernels<float>& k = gpt2::kernels::table<float>();
  gpt2::detail::reserve_for(sub, T, T, ws);
  WallClock clock;
  clock.start();
  for (auto _ : state) {
    gpt2::detail::project_parallel<float>(k, merged, sub.c_proj, kC, out_ref, ws, n_threads);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  clock.stop();
  set_counters(state, clock, T, proj_flop(T));
}

// Independent FMA chains in registers on every thread: the FMA peak of 512-bit (zmm) and 256-bit
// (ymm) vectors on that many cores, compiled with target attributes like the kernels (no -m flag
// needed) and run only where the CPU has the instructions.
constexpr int kChains = 12, kSteps = 1000;
constexpr int kRepeats = 200;  // about 0.4 ms per thread per iteration

#if GPT2_ATTENTION_X86
__attribute__((target("avx512f"))) void fma_chains_zmm(int repeats) {
  const __m512 mul = _mm512_set1_ps(0.999999f), add = _mm512_set1_ps(1e-7f);
  __m512 acc[kChains];
  for (__m512& a : acc) a = _mm512_set1_ps(1.0f);
  for (int r = 0; r < repeats; ++r)
    for (int s = 0; s < kSteps; ++s)
#pragma GCC unroll 12
      for (int c = 0; c < kChains; ++c) acc[c] = _mm512_fmadd_ps(acc[c], mul, add);
  float sink = 0;
  for (int c = 0; c < kChains; ++c) sink += _mm512_reduce_add_ps(acc[c]);
  benchmark::DoNotOptimize(sink);
}

// The same with VDPBF16PS (AVX512-BF16): 32 multiply-adds (two per float32 lane) per instruction.
__attribute__((target("avx512f,avx512bf16"))) void dpbf16_chains_zmm(int repeats) {
  const __m512bh a = reinterpret_cast<__m512bh>(_mm512_set1_epi32(0x3f803f80));  // (1, 1) in bf16
  const __m512bh b = reinterpret_cast<__m512bh>(_mm512_set1_epi32(0x33d633d6));  // (1e-7, 1e-7)
  __m512 acc[kChains];
  for (__m512& x : acc) x = _mm512_set1_ps(1.0f);
  for (int r = 0; r < repeats; ++r)
    for (int s = 0; s < kSteps; ++s)
#pragma GCC unroll 12
      for (int c = 0; c < kChains; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], a, b);
  float sink = 0;
  for (int c = 0; c < kChains; ++c) sink += _mm512_reduce_add_ps(acc[c]);
  benchmark::DoNotOptimize(sink);
}

__attribute__((target("avx2,fma"))) void fma_chains_ymm(int repeats) {
  const __m256 mul = _mm256_set1_ps(0.999999f), add = _mm256_set1_ps(1e-7f);
  __m256 acc[kChains];
  for (__m256& a : acc) a = _mm256_set1_ps(1.0f);
  for (int r = 0; r < repeats; ++r)
    for (int s = 0; s < kSteps; ++s)
#pragma GCC unroll 12
      for (int c = 0; c < kChains; ++c) acc[c] = _mm256_fmadd_ps(acc[c], mul, add);
  alignas(32) float lanes[8];
  float sink = 0;
  for (int c = 0; c < kChains; ++c) {
    _mm256_store_ps(lanes, acc[c]);
    for (float l : lanes) sink += l;
  }
  benchmark::DoNotOptimize(sink);
}
#endif

// The instruction a peak benchmark runs.
enum class PeakKind { fma_zmm, fma_ymm, dpbf16_zmm };

// peak_fma (zmm, where the CPU has AVX-512), peak_fma_ymm (AVX2 + FMA) and peak_dpbf16 (VDPBF16PS,
// AVX512-BF16): FLOP/s counting 2 per multiply-add.
void peak(benchmark::State& state, PeakKind kind) {
  if (!use_threads(state, 0)) return;
#if GPT2_ATTENTION_X86
  const gpt2::kernels::CpuFeatures& f = gpt2::kernels::cpu_features();
  const bool has = kind == PeakKind::fma_zmm   ? f.avx512f
                   : kind == PeakKind::fma_ymm ? f.avx2 && f.fma
                                               : f.avx512f && f.avx512_bf16;
  if (!has) {
    state.SkipWithError(kind == PeakKind::fma_zmm   ? "skipped: the CPU has no avx512"
                        : kind == PeakKind::fma_ymm ? "skipped: the CPU has no avx2"
                                                    : "skipped: the CPU has no avx512_bf16");
    return;
  }
  const int n = static_cast<int>(state.range(0));
  const double per_instruction = kind == PeakKind::fma_zmm ? 16 : kind == PeakKind::fma_ymm ? 8 : 32;
  WallClock clock;
  clock.start();
  for (auto _ : state) {
    gpt2::detail::parallel_tasks(n, n, [kind](Index, int) {
      if (kind == PeakKind::fma_zmm)
        fma_chains_zmm(kRepeats);
      else if (kind == PeakKind::fma_ymm)
        fma_chains_ymm(kRepeats);
      else
        dpbf16_chains_zmm(kRepeats);
    });
  }
  clock.stop();
  set_counters(state, clock, 0, 2.0 * per_instruction * kChains * kSteps * kRepeats * n);
  state.counters.erase("tokens_per_second");
#else
  (void)kind;
  state.SkipWithError("skipped: not an x86 build");
#endif
}
void peak_fma(benchmark::State& state) { peak(state, PeakKind::fma_zmm); }
void peak_dpbf16(benchmark::State& state) { peak(state, PeakKind::dpbf16_zmm); }
void peak_fma_ymm(benchmark::State& state) { peak(state, PeakKind::fma_ymm); }

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
BENCHMARK(prefill_bf16)->Name("prefill_bf16")->ArgsProduct({{64, 256, 1024, 2048}, kThreads})->ArgNames({"T", "threads"})->Unit(benchmark::kMillisecond);
BENCHMARK(prefill_int8)->Name("prefill_int8")->ArgsProduct({{64, 256, 1024}, kThreads})->ArgNames({"T", "threads"})->Unit(benchmark::kMillisecond);
BENCHMARK(decode_int8)->Name("decode_int8")->ArgsProduct({{0, 1023}, kThreads})->ArgNames({"past", "threads"})->Unit(benchmark::kMicrosecond);
BENCHMARK(decode_bf16)->Name("decode_bf16")->ArgsProduct({{0, 1023}, kThreads})->ArgNames({"past", "threads"})->Unit(benchmark::kMicrosecond);
BENCHMARK(decode_model_int8)->Name("decode_model_int8")->ArgsProduct({{1023}, kThreads})->ArgNames({"past", "threads"})->Unit(benchmark::kMicrosecond);
BENCHMARK(decode_model_bf16)->Name("decode_model_bf16")->ArgsProduct({{1023}, kThreads})->ArgNames({"past", "threads"})->Unit(benchmark::kMicrosecond);
BENCHMARK(decode_model_bf16_f32cache)->Name("decode_model_bf16_f32cache")->ArgsProduct({{1023}, kThreads})->ArgNames({"past", "threads"})->Unit(benchmark::kMicrosecond);
BENCHMARK(decode)->Name("decode")->ArgsProduct({{0, 127, 1023}, kThreads})->ArgNames({"past", "threads"})->Unit(benchmark::kMicrosecond);
BENCHMARK(decode_batch)->Name("decode_batch")->ArgsProduct({{4, 16}, {1023}, kThreads})->ArgNames({"B", "past", "threads"})->Unit(benchmark::kMicrosecond);
BENCHMARK(decode_batch)->Name("decode_batch")->ArgsProduct({{64}, {512}, kThreads})->ArgNames({"B", "past", "threads"})->Unit(benchmark::kMicrosecond);
BENCHMARK(decode_shared_prefix)->Name("decode_shared_prefix")->ArgsProduct({{64}, {512}, kThreads})->ArgNames({"seqs", "prefix", "threads"})->Unit(benchmark::kMicrosecond);
BENCHMARK(decode_paged_unshared)->Name("decode_paged_unshared")->ArgsProduct({{64}, {512}, kThreads})->ArgNames({"seqs", "prefix", "threads"})->Unit(benchmark::kMicrosecond);
BENCHMARK(decode_model)->Name("decode_model")->ArgsProduct({{1023}, kThreads})->ArgNames({"past", "threads"})->Unit(benchmark::kMicrosecond);
BENCHMARK(baseline_eigen)->Name("baseline_eigen")->ArgsProduct({kTokens, kThreads})->ArgNames({"T", "threads"})->Unit(benchmark::kMillisecond);
BENCHMARK(baseline_eigen_decode)->Name("baseline_eigen_decode")->ArgsProduct({{1023}, kThreads})->ArgNames({"past", "threads"})->Unit(benchmark::kMicrosecond);
BENCHMARK(stage_qkv_bf16)->Name("stage_qkv_bf16")->ArgsProduct({{64, 1024}, kThreads})->ArgNames({"T", "threads"})->Unit(benchmark::kMillisecond);
BENCHMARK(stage_qkv_int8)->Name("stage_qkv_int8")->ArgsProduct({{64, 1024}, kThreads})->ArgNames({"T", "threads"})->Unit(benchmark::kMillisecond);
BENCHMARK(stage_qkv)->Name("stage_qkv")->ArgsProduct({kTokens, kThreads})->ArgNames({"T", "threads"})->Unit(benchmark::kMillisecond);
BENCHMARK(stage_attention)->Name("stage_attention")->ArgsProduct({kTokens, kThreads})->ArgNames({"T", "threads"})->Unit(benchmark::kMillisecond);
BENCHMARK(stage_proj)->Name("stage_proj")->ArgsProduct({kTokens, kThreads})->ArgNames({"T", "threads"})->Unit(benchmark::kMillisecond);
BENCHMARK(peak_fma)->Name("peak_fma")->ArgsProduct({kThreads})->ArgNames({"threads"});
BENCHMARK(peak_dpbf16)->Name("peak_dpbf16")->ArgsProduct({kThreads})->ArgNames({"threads"});
BENCHMARK(peak_fma_ymm)->Name("peak_fma_ymm")->ArgsProduct({kThreads})->ArgNames({"threads"});
BENCHMARK(bandwidth)->Name("bandwidth")->ArgsProduct({kThreads})->ArgNames({"threads"})->Unit(benchmark::kMillisecond);
BENCHMARK(bandwidth_cached)->Name("bandwidth_cached")->ArgsProduct({kThreads})->ArgNames({"threads"})->Unit(benchmark::kMicrosecond);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  gpt2::KernelInfo info;
  try {
    info = gpt2::kernel_info();  // a bad GPT2_ATTENTION_ISA is an error here
  } catch (const gpt2::Error& e) {
    std::fprintf(stderr, "gpt2_bench: %s\n", e.what());
    return 2;
  }
  benchmark::AddCustomContext("kernels", info.level);
  benchmark::AddCustomContext("cpu_features", info.cpu);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

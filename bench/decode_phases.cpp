// gpt2_decode_phases [threads] [steps] [f32|bf16] [layers]: where the time of a decode step from DRAM goes.
// One token through the 12 attention layers of a GPT-2 small (C = 768, 12 heads, fp32, a 1023-position KV
// cache each; distinct weights and caches, cycled as in the decode_model benchmark, so they come
// from DRAM), timed phase by phase with the library's own steps: the QKV projection, the cache
// append, the attention of the 12 heads, the output projection. Prints the mean time of each phase
// and the rate at which it reads its bytes. bf16: bf16 weights and a bf16 KV cache (KVCacheBF16),
// as the decode_model_bf16 benchmark runs them. layers (default 12): fewer cycle through less
// memory (1: the layer's weights and cache stay in L2/L3, as in the decode benchmark).
//   build/release/bench/gpt2_decode_phases 1 && build/release/bench/gpt2_decode_phases 2
// A diagnostic beside the benchmarks (gpt2_bench's decode_model is the figure of record).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "gpt2/attention.hpp"
#include "gpt2_small_layer.hpp"

namespace {

using gpt2::ConstMatrixRef;
using gpt2::Index;
using gpt2::MatrixRef;
using gpt2::RowMatrix;
using Clock = std::chrono::steady_clock;

constexpr Index kC = 768, kHeads = 12, kPast = 1023;

using Layer = gpt2::bench::Gpt2SmallLayer;

double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 1;
  const int steps = argc > 2 ? std::atoi(argv[2]) : 2400;
  const std::string dtype = argc > 3 ? argv[3] : "f32";
  const Index n_layers = argc > 4 ? std::atoi(argv[4]) : 12;
  if (threads < 1 || n_layers < 1 || steps <= 2 * n_layers || (dtype != "f32" && dtype != "bf16")) {
    std::fprintf(stderr,
                 "usage: gpt2_decode_phases [threads >= 1] [steps > 2 layers] [f32|bf16] [layers >= 1]\n");
    return 2;
  }
  const bool bf16 = dtype == "bf16";
  gpt2::set_num_threads(threads);
  const gpt2::AttentionConfig config{kC, kHeads};

  // The 12 layers, each with a cache holding kPast positions.
  std::vector<Layer> layers;
  std::vector<gpt2::KVCache<float>> caches;
  std::vector<gpt2::KVCacheBF16> bf16_caches;
  std::srand(2);
  const RowMatrix<float> prompt = RowMatrix<float>::Random(kPast, kC);
  RowMatrix<float> prompt_out(kPast, kC);
  gpt2::Workspace<float> prefill_ws(config, kPast, kPast + 1);
  for (Index l = 0; l < n_layers; ++l) {
    layers.emplace_back(static_cast<unsigned>(100 + l));
    caches.emplace_back(config, kPast + 1);
    gpt2::attention_forward<float>(layers.back().weights(), prompt, caches.back(), prefill_ws,
                                   prompt_out);
    bf16_caches.emplace_back(config, kPast + 1);
    gpt2::attention_forward<float>(layers.back().weights(), prompt, bf16_caches.back(),
                                   prefill_ws, prompt_out);
  }

  const RowMatrix<float> x = RowMatrix<float>::Random(1, kC);
  RowMatrix<float> out(1, kC);
  gpt2::Workspace<float> ws(config, 1, kPast + 1);
  const int n_threads = gpt2::detail::forward_threads(ws);
  std::vector<gpt2::AttentionWeights<float>> packed;  // the layers' weights packed once
  for (const auto& layer : layers)
    packed.push_back(bf16 ? gpt2::pack_weights(layer.weights(), gpt2::WeightDtype::bf16)
                          : layer.packed());
  const gpt2::kernels::Kernels<float>& k = gpt2::kernels::table<float>();
  double total[4] = {0, 0, 0, 0};
  int timed = 0;
  for (int step = 0; step < steps; ++step) {
    const std::size_t l = static_cast<std::size_t>(step % n_layers);
    const gpt2::AttentionWeights<float>& w = packed[l];
    gpt2::KVCache<float>& cache = caches[l];
    gpt2::KVCacheBF16& bf16_cache = bf16_caches[l];
    MatrixRef<float> qkv = ws.qkv.topRows(1), merged = ws.merged.topRows(1);
    MatrixRef<float> y = out;
    const auto sub = gpt2::detail::SublayerTraits<gpt2::AttentionWeights<float>>::of(w);
    if (step == 0) gpt2::detail::reserve_for(sub, 1, kPast + 1, ws);
    const Clock::time_point t0 = Clock::now();
    gpt2::detail::project_parallel<float>(k, x, sub.c_attn, 3 * kC, qkv, ws, n_threads);
    const Clock::time_point t1 = Clock::now();
    if (bf16)
      bf16_cache.append(qkv.middleCols(kC, kC), qkv.middleCols(2 * kC, kC));
    else
      cache.append(qkv.middleCols(kC, kC), qkv.middleCols(2 * kC, kC));
    const Clock::time_point t2 = Clock::now();
    const ConstMatrixRef<float> qkv_read = qkv;
    if (bf16)
      gpt2::detail::attend_sequence<float>(k, sub, qkv_read, bf16_cache, ws, merged, nullptr,
                                           n_threads);
    else
      gpt2::detail::attend_sequence<float>(k, sub, qkv_read, cache, ws, merged, nullptr,
                                           n_threads);
    const Clock::time_point t3 = Clock::now();
    const ConstMatrixRef<float> merged_read = merged;
    gpt2::detail::project_parallel<float>(k, merged_read, sub.c_proj, kC, y, ws, n_threads);
    const Clock::time_point t4 = Clock::now();
    cache.truncate(kPast);
    bf16_cache.truncate(kPast);
    if (step < 2 * n_layers) continue;  // warm-up: two passes over the layers
    total[0] += seconds(t0, t1);
    total[1] += seconds(t1, t2);
    total[2] += seconds(t2, t3);
    total[3] += seconds(t3, t4);
    ++timed;
  }

  const double w_bytes = bf16 ? 2.0 : 4.0;  // per weight, and per cached key or value
  const double bytes[4] = {w_bytes * kC * 3 * kC, w_bytes * 2 * kC,
                           w_bytes * 2 * kC * (kPast + 1), w_bytes * kC * kC};
  const char* names[4] = {"qkv projection", "cache append", "attention", "output projection"};
  double sum = 0;
  std::printf("decode step, %s, %d thread(s), %d timed steps (%ld layers cycled):\n",
              bf16 ? "bf16 weights and KV cache" : "float32", n_threads, timed, static_cast<long>(n_layers));
  for (int i = 0; i < 4; ++i) {
    const double us = total[i] / timed * 1e6;
    sum += us;
    std::printf("  %-18s %8.1f us  reads %6.2f MB  %6.1f GB/s\n", names[i], us, bytes[i] / 1e6,
                bytes[i] / (us * 1e3));
  }
  std::printf("  %-18s %8.1f us\n", "total", sum);
  return 0;
}

// bench/compile_time.py's consumer: what an inference program does with the library in one file.
// The layer-0 weights of a GPT-2 .safetensors (io), x = ln_1(wpe[0 .. T)) (layer_norm), a prefill
// through a KVCache, then decode steps, and the attention probabilities of the prefill.
//   consumer <model.safetensors> [T]    (prints the forward's time per call at T, no cache)
#include <gpt2/attention.hpp>
#include <gpt2/layer_norm.hpp>
#include <gpt2/safetensors.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

int main(int argc, char** argv) try {
  if (argc < 2) {
    std::fprintf(stderr, "usage: consumer <model.safetensors> [T]\n");
    return 2;
  }
  const gpt2::Index T = argc > 2 ? std::atoi(argv[2]) : 64;
  const gpt2::safetensors::File file = gpt2::safetensors::File::open(argv[1]);
  const auto layer = gpt2::safetensors::load_attention<float>(file, 0);
  const gpt2::AttentionWeights<float>& w = layer.weights();
  const gpt2::Index C = w.n_embd();

  // x = ln_1(wpe[0 .. T)): the positions' embeddings through the layer's LayerNorm.
  const auto wpe = file.matrix<float>("wpe.weight");
  const auto g = file.vector<float>("h.0.ln_1.weight");
  const auto b = file.vector<float>("h.0.ln_1.bias");
  gpt2::RowMatrix<float> x(T + 4, C);
  gpt2::layer_norm(wpe.topRows(T + 4), g, b, 1e-5f, x);

  // Prefill T positions through a cache (with the probabilities), then 4 decode steps.
  gpt2::KVCache<float> cache(w.config(), T + 4);
  gpt2::Workspace<float> ws(w.config(), T);
  gpt2::RowMatrix<float> y(T + 4, C), probs(w.n_head() * T, T);
  gpt2::attention_forward<float>(w, x.topRows(T), cache, ws, y.topRows(T), probs);
  for (gpt2::Index t = T; t < T + 4; ++t)
    gpt2::attention_forward<float>(w, x.middleRows(t, 1), cache, ws, y.middleRows(t, 1));

  // The same positions in one forward without a cache: the same rows.
  gpt2::RowMatrix<float> y_all(T + 4, C);
  gpt2::attention_forward<float>(w, x, ws, y_all);
  const float diff = (y - y_all).cwiseAbs().maxCoeff();

  // Time per forward at T (no cache), for the optimised-or-not check of bench/compile_time.py.
  gpt2::RowMatrix<float> out(T, C);
  const auto t0 = std::chrono::steady_clock::now();
  int calls = 0;
  do {
    gpt2::attention_forward<float>(w, x.topRows(T), ws, out);
    ++calls;
  } while (std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(300));
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / calls;
  std::printf("T = %td: forward %.3f ms/call; max |cached - uncached| = %g; kernels %s\n", T, ms,
              static_cast<double>(diff), gpt2::kernel_info().summary().c_str());
  return y.allFinite() && diff <= 1e-5f * y_all.cwiseAbs().maxCoeff() ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "consumer: %s\n", e.what());
  return 1;
}

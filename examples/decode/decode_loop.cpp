// gpt2_decode_loop: decoding token by token through a gpt2::KVCache, as an inference loop does.
//
//   gpt2_decode_loop [WEIGHTS.safetensors | -] [TOTAL [PROMPT]]    (defaults: 64 tokens, 16 prompt)
//
// Layer 0 of the checkpoint named by the argument or by $GPT2_SMALL_WEIGHTS, on x = ln_1(wpe[:T]);
// with neither (or "-"): pseudo-random weights of GPT-2 small's shape. Prefills the prompt as one
// chunk, then feeds one row per step. Exit status 1 if that differs from one forward over all T
// rows by more than 1e-5 (max relative difference).
#include <gpt2/attention.hpp>
#include <gpt2/safetensors.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

using gpt2::Index;
using gpt2::RowMatrix;

// x = ln_1(wpe[:T]) [T, C]: layer 0's input when only the positions are known.
RowMatrix<float> position_input(const gpt2::safetensors::File& f, Index T) {
  const auto name = [&](const std::string& n) { return f.contains(n) ? n : "transformer." + n; };
  const gpt2::ConstMatrixMap<float> wpe = f.matrix<float>(name("wpe.weight"));  // [n_ctx, C]
  if (wpe.rows() < T) throw gpt2::ShapeError("wpe.weight: fewer than T = " + std::to_string(T));
  RowMatrix<float> x(T, wpe.cols());
  gpt2::layer_norm<float>(wpe.topRows(T), f.vector<float>(name("h.0.ln_1.weight")),
                          f.vector<float>(name("h.0.ln_1.bias")), 1e-5f, x);
  return x;
}

// Runs x [T, C] (its first `prompt` rows are the prompt) through a cache; prints; exit status.
int decode(const gpt2::AttentionWeights<float>& views, const RowMatrix<float>& x, Index prompt) {
  // One copy of the two weight matrices into the kernels' panel layout, made once: the
  // projections of every step then read it instead of packing the weights again.
  const gpt2::AttentionWeights<float> w = gpt2::pack_weights(views);
  const Index T = x.rows(), C = w.n_embd(), steps = T - prompt;
  // Everything up front: keys, values [n_head, T, head_dim]; scratch for chunks of <= prompt rows
  // attending to <= T positions; out [T, C] (row t: the output at position t); step times.
  gpt2::KVCache<float> cache(w.config(), T);
  gpt2::Workspace<float> ws(w.config(), prompt, cache.capacity());
  RowMatrix<float> out(T, C);
  std::vector<double> step_ms(steps);

  // Prefill: x[0:P] [P, C] -> out[0:P] [P, C]; the cache goes from 0 to P positions.
  gpt2::attention_forward<float>(w, x.topRows(prompt), cache, ws, out.topRows(prompt));

  // Decode: x[t] [1, C] -> out[t] [1, C], attending to positions 0 .. t; the cache gains one.
  // (In a model x[t] would come from the token sampled from out[t - 1].) No allocation here.
  for (Index t = prompt; t < T; ++t) {
    const auto start = std::chrono::steady_clock::now();
    gpt2::attention_forward<float>(w, x.middleRows(t, 1), cache, ws, out.middleRows(t, 1));
    const std::chrono::duration<double, std::milli> took = std::chrono::steady_clock::now() - start;
    step_ms[t - prompt] = took.count();
  }

  // Check: one forward over all T rows, no cache: [T, C] -> [T, C].
  const RowMatrix<float> full = gpt2::attention(w, x);
  const float rel = (out - full).cwiseAbs().maxCoeff() / full.cwiseAbs().maxCoeff();
  const bool ok = rel <= 1e-5f;  // false for NaN too
  std::nth_element(step_ms.begin(), step_ms.begin() + steps / 2, step_ms.end());
  std::printf("prefill: %td tokens as one chunk, then %td one-token steps; cache %td -> %td\n",
              prompt, steps, prompt, cache.n_past());
  std::printf("step time: %.3f ms (median of %td)\n", steps ? step_ms[steps / 2] : 0.0, steps);
  std::printf("max |decoded - full forward| / max |full forward| = %.2e (limit 1e-5): %s\n",
              static_cast<double>(rel), ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}

int main(int argc, char** argv) try {
  const char* env = std::getenv("GPT2_SMALL_WEIGHTS");
  const std::string path = argc > 1 ? argv[1] : env ? env : "";
  const Index T = argc > 2 ? std::atol(argv[2]) : 64, prompt = argc > 3 ? std::atol(argv[3]) : 16;
  if (prompt < 1 || prompt > T) throw std::invalid_argument("need 1 <= PROMPT <= TOTAL");
  if (!path.empty() && path != "-") {
    const gpt2::safetensors::File file = gpt2::safetensors::File::open(path);  // mmap, validated
    const auto layer0 = gpt2::safetensors::load_attention<float>(file, 0);      // views into it
    std::printf("weights: %s, layer 0 (C = %td, %td heads; zero copy: %s); x = ln_1(wpe[:%td])\n",
                path.c_str(), layer0.weights().n_embd(), layer0.weights().n_head(),
                layer0.zero_copy() ? "yes" : "no", T);
    return decode(layer0.weights(), position_input(file, T), prompt);
  }
  // C = 768, 12 heads of 64; weights uniform in +-0.05, x in +-1 (a shape, not a trained model).
  RowMatrix<float> c_attn_w(768, 2304), c_proj_w(768, 768), x(T, 768);
  gpt2::RowVector<float> c_attn_b(2304), c_proj_b(768);
  std::mt19937 gen(5489);  // its output is fixed by the C++ standard: the same numbers everywhere
  const auto fill = [&gen](auto& m, float scale) {  // uniform in [-scale, scale]
    for (Index i = 0; i < m.size(); ++i)
      m.data()[i] = scale * (static_cast<float>(gen()) / 2147483648.0f - 1.0f);
  };
  fill(c_attn_w, 0.05f), fill(c_attn_b, 0.05f), fill(c_proj_w, 0.05f), fill(c_proj_b, 0.05f);
  fill(x, 1.0f);
  const gpt2::AttentionWeights<float> w({768, 12}, gpt2::view(c_attn_w), gpt2::view(c_attn_b),
                                        gpt2::view(c_proj_w), gpt2::view(c_proj_b));
  std::printf("weights: built in (C = 768, 12 heads; pseudo-random); x [%td, 768] too\n", T);
  return decode(w, x, prompt);
} catch (const std::exception& e) {  // gpt2::Error (file, shapes), bad sizes, bad_alloc
  std::fprintf(stderr, "gpt2_decode_loop: %s\n", e.what());
  return 1;
}

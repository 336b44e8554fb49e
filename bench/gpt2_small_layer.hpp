// One attention layer of a GPT-2 small (C = 768, 12 heads) with random fp32 weights, for the
// benchmarks and bench tools: the same seed gives the same weights in every program.
#pragma once

#include <cstdlib>

#include "gpt2/types.hpp"
#include "gpt2/weights.hpp"

namespace gpt2::bench {

struct Gpt2SmallLayer {
  static constexpr Index kC = 768, kHeads = 12;
  RowMatrix<float> c_attn_w, c_proj_w;  // [C, 3C], [C, C]
  RowVector<float> c_attn_b, c_proj_b;  // [3C], [C]
  explicit Gpt2SmallLayer(unsigned seed) {
    std::srand(seed);
    c_attn_w = RowMatrix<float>::Random(kC, 3 * kC) * 0.05f;
    c_proj_w = RowMatrix<float>::Random(kC, kC) * 0.05f;
    c_attn_b = RowVector<float>::Random(3 * kC) * 0.1f;
    c_proj_b = RowVector<float>::Random(kC) * 0.1f;
  }
  // Views of the four tensors (valid while this object lives).
  AttentionWeights<float> weights() const {
    return {{kC, kHeads}, view(c_attn_w), view(c_attn_b), view(c_proj_w), view(c_proj_b)};
  }
  // The same with c_attn.weight and c_proj.weight packed once (gpt2::pack_weights): what the
  // library's users run, and what the suite measures.
  AttentionWeights<float> packed() const { return pack_weights(weights()); }
  // Bytes of the four tensors: what a decode step reads of the layer's weights.
  static constexpr double bytes() { return 4.0 * (kC * 3 * kC + 3 * kC + kC * kC + kC); }
};

}  // namespace gpt2::bench

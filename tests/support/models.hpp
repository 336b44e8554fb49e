// Small attention models for tests: owning weight buffers in checkpoint layout and the
// AttentionWeights views over them.
#pragma once

#include <cmath>
#include <cstdlib>

#include "gpt2/weights.hpp"

namespace gpt2::test {

// c_attn.weight [C, 3C], c_attn.bias [3C], c_proj.weight [C, C], c_proj.bias [C], owned.
template <class T>
struct Model {
  AttentionConfig config;
  RowMatrix<T> c_attn_w, c_proj_w;
  RowVector<T> c_attn_b, c_proj_b;

  // Views over this model's buffers (valid while the model lives).
  AttentionWeights<T> weights() const {
    return {config, view(c_attn_w), view(c_attn_b), view(c_proj_w), view(c_proj_b)};
  }
};

// Uniform random weights (std::rand, seeded): c_attn ~ 4/sqrt(C) so the attention is neither
// uniform nor one-hot, c_proj ~ 1/sqrt(C), biases ~ 0.1.
template <class T>
Model<T> random_model(Index C, Index n_head, unsigned seed) {
  std::srand(seed);
  const double s = 1.0 / std::sqrt(double(C));
  return {{C, n_head},
          (RowMatrix<double>::Random(C, 3 * C) * (4 * s)).cast<T>(),
          (RowMatrix<double>::Random(C, C) * s).cast<T>(),
          (RowVector<double>::Random(3 * C) * 0.1).cast<T>(),
          (RowVector<double>::Random(C) * 0.1).cast<T>()};
}

// All-zero weights of the right shapes (for tests of shape checks).
template <class T>
Model<T> zero_model(Index C, Index n_head) {
  return {{C, n_head}, RowMatrix<T>::Zero(C, 3 * C), RowMatrix<T>::Zero(C, C),
          RowVector<T>::Zero(3 * C), RowVector<T>::Zero(C)};
}

// x [T, C], uniform in [-1, 1] (std::rand, seeded).
template <class T>
RowMatrix<T> random_input(Index T_, Index C, unsigned seed) {
  std::srand(seed);
  return RowMatrix<double>::Random(T_, C).cast<T>();
}

}  // namespace gpt2::test

// A program that builds gpt2-attention as part of itself (add_subdirectory). It runs one attention
// sublayer on a small config and fails unless the output is [T, C] and finite.
#include <gpt2/attention.hpp>

#include <cstdio>

int main() {
  const gpt2::AttentionConfig config{64, 4};  // n_embd, n_head
  const gpt2::Index T = 5;
  const gpt2::RowMatrix<float> c_attn_w = gpt2::RowMatrix<float>::Random(64, 192);
  const gpt2::RowVector<float> c_attn_b = gpt2::RowVector<float>::Zero(192);
  const gpt2::RowMatrix<float> c_proj_w = gpt2::RowMatrix<float>::Random(64, 64);
  const gpt2::RowVector<float> c_proj_b = gpt2::RowVector<float>::Zero(64);
  const gpt2::RowMatrix<float> x = gpt2::RowMatrix<float>::Random(T, 64);

  const gpt2::AttentionWeights<float> weights(config, gpt2::view(c_attn_w), gpt2::view(c_attn_b),
                                              gpt2::view(c_proj_w), gpt2::view(c_proj_b));
  const gpt2::RowMatrix<float> y = gpt2::attention(weights, x);

  if (y.rows() != T || y.cols() != config.n_embd) {
    std::fprintf(stderr, "y: expected shape [%td, %td], got [%td, %td]\n", T, config.n_embd,
                 y.rows(), y.cols());
    return 1;
  }
  if (!y.allFinite()) {
    std::fprintf(stderr, "y: not finite\n");
    return 1;
  }
  std::printf("add_subdirectory consumer: y [%td, %td] ok\n", y.rows(), y.cols());
  return 0;
}

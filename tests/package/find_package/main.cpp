// A program built against an installed gpt2-attention (find_package). It runs one attention
// sublayer on a small config and fails unless the output is [T, C] and finite.
#include <gpt2/attention.hpp>
#include <gpt2/version.hpp>

#include <cstdio>

static_assert(gpt2::version_major == EXPECTED_VERSION_MAJOR &&
                  gpt2::version_minor == EXPECTED_VERSION_MINOR &&
                  gpt2::version_patch == EXPECTED_VERSION_PATCH,
              "installed version.hpp disagrees with gpt2_attentionConfigVersion.cmake");

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
  std::printf("find_package consumer: y [%td, %td] ok\n", y.rows(), y.cols());
  return 0;
}

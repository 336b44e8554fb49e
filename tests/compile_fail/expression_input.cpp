// Must NOT compile: an unevaluated expression would be evaluated into a hidden temporary.
#include <gpt2/attention.hpp>

int main() {
  const gpt2::RowMatrix<float> w3 = gpt2::RowMatrix<float>::Zero(8, 24), w1 = gpt2::RowMatrix<float>::Zero(8, 8);
  const gpt2::RowVector<float> b3 = gpt2::RowVector<float>::Zero(24), b1 = gpt2::RowVector<float>::Zero(8);
  const gpt2::AttentionWeights<float> w({8, 2}, gpt2::view(w3), gpt2::view(b3), gpt2::view(w1), gpt2::view(b1));
  const gpt2::RowMatrix<float> x = gpt2::RowMatrix<float>::Zero(3, 8);
  gpt2::RowMatrix<float> qkv(3, 24);
  gpt2::qkv_projection<float>(w, x * 2.0f, qkv);
}

// Must NOT compile: a head view of a temporary qkv matrix would dangle.
#include <gpt2/attention.hpp>

int main() {
  const gpt2::AttentionConfig config{8, 2};
  const gpt2::ConstMatrixRef<float> q = gpt2::q_view(gpt2::RowMatrix<float>(gpt2::RowMatrix<float>::Zero(3, 24)), config, 0);
  return q.rows() == 3 ? 0 : 1;
}

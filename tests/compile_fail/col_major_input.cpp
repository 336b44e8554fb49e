// Must NOT compile: a column-major input would be copied behind the caller's back.
#include <gpt2/attention.hpp>

int main() {
  const gpt2::RowMatrix<float> w3 = gpt2::RowMatrix<float>::Zero(8, 24), w1 = gpt2::RowMatrix<float>::Zero(8, 8);
  const gpt2::RowVector<float> b3 = gpt2::RowVector<float>::Zero(24), b1 = gpt2::RowVector<float>::Zero(8);
  const gpt2::AttentionWeights<float> w({8, 2}, gpt2::view(w3), gpt2::view(b3), gpt2::view(w1), gpt2::view(b1));
  const Eigen::MatrixXf x = Eigen::MatrixXf::Zero(3, 8);  // column-major
  gpt2::Workspace<float> ws(w.config(), 3);
  gpt2::RowMatrix<float> out(3, 8);
  gpt2::attention_forward<float>(w, x, ws, out);
}

// Must NOT compile: head_slot of a const matrix would write through const.
#include <gpt2/attention.hpp>

int main() {
  const gpt2::AttentionConfig config{8, 2};
  const gpt2::RowMatrix<float> merged = gpt2::RowMatrix<float>::Zero(3, 8);
  gpt2::head_slot(merged, config, 0).setOnes();
}

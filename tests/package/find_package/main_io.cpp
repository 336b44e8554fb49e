// A program built against an installed gpt2-attention with the io component (find_package
// COMPONENTS io): both io headers compile, and a .npy written by gpt2::npy::write reads back
// bit for bit.
//   consumer_io <scratch .npy path>
#include <gpt2/attention.hpp>
#include <gpt2/npy.hpp>
#include <gpt2/safetensors.hpp>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "../common/small_model.hpp"

int main(int argc, char** argv) {
  const std::string path = argc > 1 ? argv[1] : "roundtrip.npy";

  const gpt2::RowMatrix<float> y = consumer::small_forward();
  if (consumer::check_output(y, "find_package io consumer") != 0) return 1;

  gpt2::npy::write<float>(path, y);
  const gpt2::npy::Array array = gpt2::npy::read(path);
  const std::vector<std::int64_t> expected_shape{consumer::kT, consumer::kConfig.n_embd};
  if (array.dtype != gpt2::npy::Dtype::F32 || array.shape != expected_shape) {
    std::fprintf(stderr, "%s: expected <f4 [%td, %td], got %s of rank %zu\n", path.c_str(), consumer::kT,
                 consumer::kConfig.n_embd, gpt2::npy::dtype_descr(array.dtype), array.shape.size());
    return 1;
  }
  const gpt2::RowMatrix<float> y_read = array.to_matrix<float>();
  if (y_read != y) {
    std::fprintf(stderr, "%s: values differ after the round trip\n", path.c_str());
    return 1;
  }
  std::printf("find_package io consumer: %s round-trips y [%td, %td]\n", path.c_str(), y.rows(),
              y.cols());
  return 0;
}

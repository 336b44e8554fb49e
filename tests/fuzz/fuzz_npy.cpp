// libFuzzer target: gpt2::npy::parse on arbitrary bytes (the reader of npy::read: the same header
// checks against the same file size), then the conversions a caller makes of an array that parsed.
// Any gpt2::Error is a correct rejection; anything else is a bug.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "gpt2/npy.hpp"

namespace gpt2::fuzz {

// One input; the same as LLVMFuzzerTestOneInput below (tests/test_fuzz_regressions.cpp calls it).
inline int npy_input(const std::uint8_t* data, std::size_t size) {
  try {
    const gpt2::npy::Array a = gpt2::npy::parse(data, size, "fuzz");
    const std::vector<float> f = a.to_vector<float>();
    const std::vector<double> d = a.to_vector<double>();
    if (a.shape.size() == 2) {
      const gpt2::RowMatrix<float> m = a.to_matrix<float>();
      volatile float sink = m.size() > 0 ? m(m.rows() - 1, m.cols() - 1) : 0.0f;
      (void)sink;
    }
    volatile double sink = d.empty() ? 0.0 : d.back() + f.back();
    (void)sink;
  } catch (const gpt2::Error&) {
  }
  return 0;
}

}  // namespace gpt2::fuzz

#ifndef GPT2_FUZZ_NO_ENTRY_POINT
extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return gpt2::fuzz::npy_input(data, size);
}
#endif

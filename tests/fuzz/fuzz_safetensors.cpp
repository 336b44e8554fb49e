// libFuzzer target: gpt2::safetensors::File::parse on arbitrary bytes, then everything a caller
// does with a file that parsed: every tensor's views and converting copies, and load_attention.
// Any gpt2::Error is a correct rejection; anything else (a crash, a sanitizer report, another
// exception type, an allocation beyond libFuzzer's limits) is a bug.
#include <cstddef>
#include <cstdint>
#include <string>

#include "gpt2/safetensors.hpp"

namespace gpt2::fuzz::safetensors_detail {

template <class T>
void touch_tensor(const gpt2::safetensors::File& file, const std::string& name) {
  try {
    const std::vector<T> values = file.to_vector<T>(name);
    volatile T sink = values.empty() ? T(0) : values.front();
    (void)sink;
  } catch (const gpt2::Error&) {
  }
  if (file.can_view<T>(name)) {
    const gpt2::safetensors::TensorInfo& info = file.tensor(name);
    try {
      if (info.shape.size() == 2) {
        const auto m = file.matrix<T>(name);
        volatile T sink = m.size() > 0 ? m(m.rows() - 1, m.cols() - 1) : T(0);
        (void)sink;
      } else if (info.shape.size() == 1) {
        const auto v = file.vector<T>(name);
        volatile T sink = v.size() > 0 ? v(v.size() - 1) : T(0);
        (void)sink;
      }
    } catch (const gpt2::Error&) {
    }
  }
}

template <class T>
void touch_attention(const gpt2::safetensors::File& file, int layer, gpt2::Index n_head) {
  try {
    const gpt2::safetensors::LoadedAttention<T> loaded =
        gpt2::safetensors::load_attention<T>(file, layer, n_head);
    volatile T sink = loaded.weights().c_proj_bias()(0);
    (void)sink;
  } catch (const gpt2::Error&) {
  }
}

}  // namespace gpt2::fuzz::safetensors_detail

namespace gpt2::fuzz {

// One input; the same as LLVMFuzzerTestOneInput below (tests/test_fuzz_regressions.cpp calls it).
inline int safetensors_input(const std::uint8_t* data, std::size_t size) {
  try {
    const gpt2::safetensors::File file = gpt2::safetensors::File::parse(data, size, "fuzz");
    for (const std::string& name : file.names()) {
      safetensors_detail::touch_tensor<float>(file, name);
      safetensors_detail::touch_tensor<double>(file, name);
    }
    safetensors_detail::touch_attention<float>(file, 0, 0);  // n_head = C / 64
    safetensors_detail::touch_attention<float>(file, 0, 1);  // any C
    safetensors_detail::touch_attention<double>(file, 0, 2);
  } catch (const gpt2::Error&) {
  }
  return 0;
}

}  // namespace gpt2::fuzz

#ifndef GPT2_FUZZ_NO_ENTRY_POINT
extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return gpt2::fuzz::safetensors_input(data, size);
}
#endif

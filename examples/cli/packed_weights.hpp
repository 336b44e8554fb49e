// The CLI computes on weights packed once into the kernels' layout (gpt2::pack_weights: one copy
// of c_attn.weight and c_proj.weight at load, float only; double reads the views). --dtype bf16
// makes that copy in bfloat16 (WeightDtype::bf16): the forwards then run bf16 projections, with
// float32 inputs, outputs, biases, q, k, v, attention and KV cache.
#pragma once

#include <string>
#include <type_traits>

#include <gpt2/attention.hpp>

namespace gpt2::cli {

// w packed for the kernels in `dtype` (float); double: the views themselves (float32 only:
// parse_precision never pairs bf16 with double).
template <class T>
AttentionWeights<T> packed_for_kernels(const AttentionWeights<T>& w,
                                       WeightDtype dtype = WeightDtype::float32) {
  if constexpr (std::is_same<T, float>::value) {
    return pack_weights(w, dtype);
  } else {
    if (dtype != WeightDtype::float32)
      throw ConfigError(std::string("packed_for_kernels: ") + dtype_name(dtype) +
                        " weights need float (got double)");
    return w;
  }
}

}  // namespace gpt2::cli

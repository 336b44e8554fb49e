// The CLI computes on weights packed once into the kernels' layout (gpt2::pack_weights: one copy
// of c_attn.weight and c_proj.weight at load, float only; double reads the views).
#pragma once

#include <type_traits>

#include <gpt2/attention.hpp>

namespace gpt2::cli {

template <class T>
AttentionWeights<T> packed_for_kernels(const AttentionWeights<T>& w) {
  if constexpr (std::is_same<T, float>::value)
    return pack_weights(w);
  else
    return w;
}

}  // namespace gpt2::cli

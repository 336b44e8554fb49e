// AttentionWeights<T>: zero-copy views over the four tensors of one attention sublayer, in the
// checkpoint's own layout (row-major, Conv1D [in, out]). The caller owns the buffers and must keep
// them alive while the views are used; nothing is copied or transposed.
//
// pack_weights(w) (float) adds the one documented copy: c_attn.weight and c_proj.weight in the
// vector kernels' panel layout (kernels/pack.hpp), made once, so that the projections stop packing
// B on every call. pack_weights(w, WeightDtype::bf16) makes that copy in bfloat16 instead (half
// the bytes; the projections then read it at every level, and compute in bf16 where the level
// has bf16 instructions).
//
// The weight precision is a property of the packed copy, not of the type: a forward on
// AttentionWeights<float> runs bf16 projections exactly when its weights were packed to bf16
// (weight_dtype()). Biases, inputs, outputs, q, k and v stay float32, and so does the attention
// core's arithmetic (at the avx512_bf16 and amx levels its products run in bf16 too); the KV
// cache's storage is the cache's own choice (KVCache<bfloat16>: kv_cache.hpp).
#pragma once

#include <memory>
#include <string>
#include <type_traits>

#include "gpt2/config.hpp"
#include "gpt2/error.hpp"
#include "gpt2/kernels/pack.hpp"
#include "gpt2/types.hpp"

namespace gpt2 {

template <class T>
class AttentionWeights {
  static_assert(std::is_floating_point<T>::value, "AttentionWeights<T>: T must be float or double");

 public:
  // Shapes (C = config.n_embd):
  //   c_attn_weight [C, 3C]  columns are three contiguous blocks q | k | v
  //   c_attn_bias   [3C]
  //   c_proj_weight [C, C]
  //   c_proj_bias   [C]
  // Validates the config and every shape; throws ConfigError / ShapeError naming the tensor, the
  // expected and the actual shape. Only the pointers are kept.
  AttentionWeights(const AttentionConfig& config, const ConstMatrixMap<T>& c_attn_weight,
                   const ConstVectorMap<T>& c_attn_bias, const ConstMatrixMap<T>& c_proj_weight,
                   const ConstVectorMap<T>& c_proj_bias)
      : config_(config),
        c_attn_weight_(c_attn_weight.data()),
        c_attn_bias_(c_attn_bias.data()),
        c_proj_weight_(c_proj_weight.data()),
        c_proj_bias_(c_proj_bias.data()) {
    config_.validate();
    const Index C = config_.n_embd;
    detail::check_shape("c_attn.weight", {C, 3 * C}, {c_attn_weight.rows(), c_attn_weight.cols()});
    detail::check_shape("c_attn.bias", {3 * C}, {c_attn_bias.size()});
    detail::check_shape("c_proj.weight", {C, C}, {c_proj_weight.rows(), c_proj_weight.cols()});
    detail::check_shape("c_proj.bias", {C}, {c_proj_bias.size()});
    check_not_null("c_attn.weight", c_attn_weight_);
    check_not_null("c_attn.bias", c_attn_bias_);
    check_not_null("c_proj.weight", c_proj_weight_);
    check_not_null("c_proj.bias", c_proj_bias_);
  }

  // The validated shape: n_embd C, n_head, head_dim = C / n_head.
  const AttentionConfig& config() const { return config_; }
  Index n_embd() const { return config_.n_embd; }
  Index n_head() const { return config_.n_head; }
  Index head_dim() const { return config_.head_dim(); }

  // Read-only views of the caller's buffers (no copy; valid while those buffers are):
  //   c_attn_weight [C, 3C], c_attn_bias [3C], c_proj_weight [C, C], c_proj_bias [C].
  ConstMatrixMap<T> c_attn_weight() const { return {c_attn_weight_, n_embd(), 3 * n_embd()}; }
  ConstVectorMap<T> c_attn_bias() const { return {c_attn_bias_, 3 * n_embd()}; }
  ConstMatrixMap<T> c_proj_weight() const { return {c_proj_weight_, n_embd(), n_embd()}; }
  ConstVectorMap<T> c_proj_bias() const { return {c_proj_bias_, n_embd()}; }

  // The packed copies made by pack_weights (null when these weights are views only): read by the
  // projections at the vector levels, instead of the views.
  const PackedMatrix* packed_c_attn_weight() const { return packed_ ? &packed_->c_attn : nullptr; }
  const PackedMatrix* packed_c_proj_weight() const { return packed_ ? &packed_->c_proj : nullptr; }
  bool is_packed() const { return packed_ != nullptr; }
  // The packed copies' precision (float32 for views only).
  WeightDtype weight_dtype() const { return packed_ ? packed_->c_attn.dtype() : WeightDtype::float32; }
  // Bytes of the packed copies (0 for views only).
  Index packed_bytes() const { return packed_ ? packed_->c_attn.bytes() + packed_->c_proj.bytes() : 0; }

 private:
  template <class U>
  friend AttentionWeights<float> pack_weights(const AttentionWeights<U>& w, WeightDtype dtype);

  struct Packed {
    PackedMatrix c_attn, c_proj;
  };
  std::shared_ptr<const Packed> packed_;  // shared by the copies of packed weights

  static void check_not_null(const char* name, const T* p) {
    if (p == nullptr) throw ShapeError(std::string(name) + ": expected a buffer, got a null pointer");
  }

  AttentionConfig config_;
  const T* c_attn_weight_;
  const T* c_attn_bias_;
  const T* c_proj_weight_;
  const T* c_proj_bias_;
};

// The same weights with c_attn.weight [C, 3C] and c_proj.weight [C, C] also copied once into the
// vector kernels' panel layout (the one copy this library makes of a checkpoint: 4 C^2 floats,
// 9.4 MB for GPT-2 small; owned by the result and shared by its copies). At the avx2 and avx512
// levels the projections read the packed copy, with bitwise the results of the views; the generic
// level reads the views. The views (and the biases) still point at the caller's buffers, which
// must outlive the result as before (pages of a memory-mapped file that are not read again cost
// no memory once the OS drops them). float only: double runs Eigen's GEMM at every level.
//
// dtype bf16: the copy is c_attn.weight and c_proj.weight rounded to bfloat16 (nearest, ties to
// even: exact for a checkpoint stored in BF16, which the safetensors loader widens to float32;
// F16 values are rounded), 2 C^2 + 32 pad rows' worth of bf16 (4.7 MB for GPT-2 small), in the
// bf16 panel layout (kernels/layout.hpp). Every level then reads the bf16 copy, never the views: a
// projection's result depends on the level (docs/kernels.md), each level's rows stay exact
// (decode == prefill, bitwise).
template <class U>
AttentionWeights<float> pack_weights(const AttentionWeights<U>& w,
                                     WeightDtype dtype = WeightDtype::float32) {
  static_assert(std::is_same<U, float>::value,
                "gpt2::pack_weights: packed weights are float only (double runs Eigen's GEMM)");
  AttentionWeights<float> packed = w;
  auto p = std::make_shared<typename AttentionWeights<float>::Packed>();
  p->c_attn = PackedMatrix(w.c_attn_weight(), dtype);
  p->c_proj = PackedMatrix(w.c_proj_weight(), dtype);
  packed.packed_ = std::move(p);
  return packed;
}

}  // namespace gpt2

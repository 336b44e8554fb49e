// Workspace<T>: all the scratch of attention_forward, allocated once and reused, so repeated
// forwards over at most capacity() tokens allocate nothing.
#pragma once

#include "gpt2/causal_attention.hpp"
#include "gpt2/config.hpp"
#include "gpt2/gemm.hpp"
#include "gpt2/types.hpp"

namespace gpt2 {

// Owns: qkv [max_tokens, 3C], merged [max_tokens, C], the attention score tile and the GEMM
// packing buffers. Not thread-safe: give each thread its own Workspace (weights can be shared).
template <class T>
class Workspace {
 public:
  explicit Workspace(const AttentionConfig& config, Index max_tokens = 0) : config_(config) {
    config_.validate();
    reserve(max_tokens);
  }

  const AttentionConfig& config() const { return config_; }
  Index capacity() const { return qkv.rows(); }

  // Grows every buffer to hold max_tokens tokens. Allocates only when max_tokens > capacity().
  void reserve(Index max_tokens) {
    if (max_tokens < 0)
      throw ShapeError("max_tokens: expected a non-negative count, got " +
                       std::to_string(max_tokens));
    if (max_tokens <= capacity()) return;
    const Index C = config_.n_embd;
    qkv.resize(max_tokens, 3 * C);
    merged.resize(max_tokens, C);
    attention.reserve(max_tokens, config_.head_dim());
    qkv_gemm.reserve(max_tokens, 3 * C, C);
    proj_gemm.reserve(max_tokens, C, C);
  }

  RowMatrix<T> qkv;     // [capacity, 3C]
  RowMatrix<T> merged;  // [capacity, C]
  AttentionScratch<T> attention;
  GemmScratch<T> qkv_gemm;
  GemmScratch<T> proj_gemm;

 private:
  AttentionConfig config_;
};

}  // namespace gpt2

// Workspace<T>: all the scratch of attention_forward, allocated once and reused, so repeated
// forwards over at most capacity() tokens allocate nothing.
#pragma once

#include <algorithm>
#include <string>
#include <utility>

#include "gpt2/causal_attention.hpp"
#include "gpt2/config.hpp"
#include "gpt2/gemm.hpp"
#include "gpt2/types.hpp"

namespace gpt2 {

// Owns: qkv [capacity, 3C], merged [capacity, C], the attention score tile and the GEMM packing
// buffers. Not thread-safe: give each thread its own Workspace (weights can be shared).
// The buffers are public so that the steps can be run one by one (and inspected); their sizes are
// the Workspace's business: grow them with reserve(), never resize them directly.
template <class T>
class Workspace {
 public:
  // Room for forwards over up to max_tokens tokens that attend to up to max_keys positions (cached
  // ones included; default max_tokens, enough without a KV cache). For decoding through a cache:
  // Workspace(config, 1, cache.capacity()).
  explicit Workspace(const AttentionConfig& config, Index max_tokens = 0, Index max_keys = -1)
      : config_(config) {
    config_.validate();
    reserve(max_tokens, max_keys);
  }

  // Moving leaves the source empty (capacity 0) and still usable: it grows again on demand.
  Workspace(Workspace&& other) noexcept
      : qkv(std::move(other.qkv)),
        merged(std::move(other.merged)),
        attention(std::move(other.attention)),
        qkv_gemm(std::move(other.qkv_gemm)),
        proj_gemm(std::move(other.proj_gemm)),
        config_(other.config_),
        capacity_(std::exchange(other.capacity_, 0)),
        key_capacity_(std::exchange(other.key_capacity_, 0)) {}
  Workspace& operator=(Workspace&& other) noexcept {
    if (&other != this) {
      Workspace moved(std::move(other));
      swap(moved);
    }
    return *this;
  }
  void swap(Workspace& other) noexcept {
    qkv.swap(other.qkv);
    merged.swap(other.merged);
    std::swap(attention, other.attention);
    std::swap(qkv_gemm, other.qkv_gemm);
    std::swap(proj_gemm, other.proj_gemm);
    std::swap(config_, other.config_);
    std::swap(capacity_, other.capacity_);
    std::swap(key_capacity_, other.key_capacity_);
  }

  const AttentionConfig& config() const { return config_; }
  Index capacity() const { return capacity_; }          // tokens per forward
  Index key_capacity() const { return key_capacity_; }  // positions attended to

  // Bytes of all the buffers held (what a forward needs beyond its inputs, outputs and cache).
  Index bytes() const {
    return (qkv.size() + merged.size()) * static_cast<Index>(sizeof(T)) + attention.bytes() +
           qkv_gemm.bytes() + proj_gemm.bytes();
  }

  // Grows the buffers to hold max_tokens tokens attending to max_keys positions (default
  // max_tokens). Allocates only when one of them is above the current capacity.
  // Strong guarantee: everything is allocated before anything is replaced, so if an allocation
  // throws (std::bad_alloc) the workspace is unchanged and still usable.
  void reserve(Index max_tokens, Index max_keys = -1) {
    if (max_keys < -1)
      throw ShapeError("max_keys: expected a non-negative count (or -1: max_tokens), got " +
                       std::to_string(max_keys));
    if (max_keys == -1) max_keys = max_tokens;
    if (max_tokens < 0)
      throw ShapeError("max_tokens: expected a non-negative count, got " +
                       std::to_string(max_tokens));
    if (max_keys < max_tokens)
      throw ShapeError("max_keys: expected at least max_tokens (" + std::to_string(max_tokens) +
                       "), got " + std::to_string(max_keys));
    if (max_tokens <= capacity_ && max_keys <= key_capacity_) return;
    max_tokens = std::max(max_tokens, capacity_);
    max_keys = std::max(max_keys, key_capacity_);
    const Index C = config_.n_embd;
    RowMatrix<T> grown_qkv(max_tokens, 3 * C), grown_merged(max_tokens, C);
    AttentionScratch<T> grown_attention(max_keys, config_.head_dim());
    GemmScratch<T> grown_qkv_gemm(max_tokens, 3 * C, C), grown_proj_gemm(max_tokens, C, C);
    qkv.swap(grown_qkv);
    merged.swap(grown_merged);
    attention = std::move(grown_attention);
    qkv_gemm = std::move(grown_qkv_gemm);
    proj_gemm = std::move(grown_proj_gemm);
    capacity_ = max_tokens;
    key_capacity_ = max_keys;
  }

  RowMatrix<T> qkv;     // [capacity, 3C]
  RowMatrix<T> merged;  // [capacity, C]
  AttentionScratch<T> attention;
  GemmScratch<T> qkv_gemm;
  GemmScratch<T> proj_gemm;

 private:
  AttentionConfig config_;
  Index capacity_ = 0;
  Index key_capacity_ = 0;
};

}  // namespace gpt2

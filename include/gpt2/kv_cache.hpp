// KVCache<T>: the keys and values of the positions a sequence has already been through, for one
// layer, so that a forward over new tokens attends to them without recomputing them.
//
// Layout: per head, contiguous: keys [n_head][capacity][head_dim], values likewise (Hugging
// Face's past_key_values order, [n_head, n_past, head_dim] per sequence). Why: a decode step reads
// every cached key and value of a head once; with head h's n_past rows back to back that read is
// one contiguous stream of n_past * head_dim scalars, the score product q k^T is a plain
// matrix-vector product over it, and appending a token writes n_head short rows. (The qkv layout
// [capacity, C] would make every head's read a strided walk over all heads' data.)
#pragma once

#include <limits>
#include <string>
#include <utility>

#include "gpt2/config.hpp"
#include "gpt2/error.hpp"
#include "gpt2/types.hpp"

namespace gpt2 {

// Owns keys and values [n_head, capacity, head_dim]; rows 0 .. n_past - 1 of each head are the
// cached positions. Allocates only in its constructor and in copy(). Not thread-safe: one
// sequence, one thread at a time. Copying is explicit (copy(), copy_from()): a cache is megabytes.
template <class T>
class KVCache {
 public:
  // Room for max_tokens positions: 2 * n_head * max_tokens * head_dim scalars.
  KVCache(const AttentionConfig& config, Index max_tokens) : config_(config) {
    config_.validate();
    if (max_tokens < 0)
      throw ShapeError("max_tokens: expected a non-negative count, got " +
                       std::to_string(max_tokens));
    if (max_tokens > std::numeric_limits<Index>::max() / config_.n_embd)
      throw CapacityError("KV cache: " + std::to_string(max_tokens) + " positions of n_embd " +
                          std::to_string(config_.n_embd) + " overflow the index type");
    capacity_ = max_tokens;
    keys_.resize(config_.n_head * capacity_, config_.head_dim());
    values_.resize(config_.n_head * capacity_, config_.head_dim());
  }

  // No implicit copies (a cache is megabytes): copy() and copy_from() are the explicit ones.
  KVCache(const KVCache&) = delete;
  KVCache& operator=(const KVCache&) = delete;
  // Moving leaves the source empty (capacity 0, nothing cached).
  KVCache(KVCache&& other) noexcept
      : config_(other.config_),
        capacity_(std::exchange(other.capacity_, 0)),
        n_past_(std::exchange(other.n_past_, 0)),
        keys_(std::move(other.keys_)),
        values_(std::move(other.values_)) {
    other.keys_.resize(0, config_.head_dim());  // Eigen leaves it 0 x 0; keys(h) needs the width
    other.values_.resize(0, config_.head_dim());
  }
  KVCache& operator=(KVCache&& other) noexcept {
    if (&other != this) {
      config_ = other.config_;
      capacity_ = std::exchange(other.capacity_, 0);
      n_past_ = std::exchange(other.n_past_, 0);
      keys_ = std::move(other.keys_);
      values_ = std::move(other.values_);
      other.keys_.resize(0, other.keys_.cols());  // Eigen's move assignment swaps: free ours
      other.values_.resize(0, other.values_.cols());
    }
    return *this;
  }

  // A deep copy (allocates a cache of the same capacity; copies the n_past cached rows).
  KVCache copy() const {
    KVCache c(config_, capacity_);
    c.copy_from(*this);
    return c;
  }

  // Makes this cache hold what `other` holds, reusing this cache's storage (no allocation), e.g. to
  // fork a beam. Needs the same config and a capacity of at least other.n_past().
  void copy_from(const KVCache& other) {
    if (&other == this) return;
    check_same_config(other.config_, "copy_from: the source cache");
    if (other.n_past_ > capacity_)
      throw CapacityError("KV cache: cannot copy " + std::to_string(other.n_past_) +
                          " cached tokens into a cache with capacity " + std::to_string(capacity_));
    for (Index h = 0; h < config_.n_head; ++h) {
      block(keys_, h).topRows(other.n_past_) = other.keys(h);
      block(values_, h).topRows(other.n_past_) = other.values(h);
    }
    n_past_ = other.n_past_;
  }

  const AttentionConfig& config() const { return config_; }
  Index capacity() const { return capacity_; }          // positions it has room for in all
  Index n_past() const { return n_past_; }              // positions cached
  // Bytes of the key and value storage (allocated in full by the constructor).
  Index bytes() const { return (keys_.size() + values_.size()) * static_cast<Index>(sizeof(T)); }
  Index remaining() const { return capacity_ - n_past_; }  // positions that still fit

  // Forgets every position (keeps the storage).
  void reset() { n_past_ = 0; }

  // Keeps the first n positions and forgets the rest, 0 <= n <= n_past (e.g. to roll back
  // rejected speculative tokens).
  void truncate(Index n) {
    if (n < 0 || n > n_past_)
      throw ShapeError("truncate: expected a length in [0, " + std::to_string(n_past_) +
                       "] (the cached positions), got " + std::to_string(n));
    n_past_ = n;
  }

  // Head h's cached keys / values [n_past, head_dim] (views into the cache, valid until it is
  // moved from or destroyed; their contents change with append, reset and copy_from).
  ConstMatrixRef<T> keys(Index h) const { return block(keys_, check_head(h)).topRows(n_past_); }
  ConstMatrixRef<T> values(Index h) const {
    return block(values_, check_head(h)).topRows(n_past_);
  }

  // Throws CapacityError unless `count` more positions fit. Changes nothing.
  void check_room(Index count) const {
    if (count < 0 || count > remaining())
      throw CapacityError("KV cache: " + std::to_string(n_past_) + " cached + " +
                          std::to_string(count) + " new tokens exceed its capacity of " +
                          std::to_string(capacity_) + " tokens");
  }

  // Appends positions n_past .. n_past + n - 1:
  //   k, v [n, C]: every head's key (value) rows side by side, head h at columns h*head_dim, i.e.
  //   the k (v) block of a qkv matrix: qkv.middleCols(C, C) (qkv.middleCols(2 * C, C)).
  // Throws CapacityError (cache unchanged) when they do not fit. Allocates nothing.
  template <class DK, class DV>
  void append(const Eigen::MatrixBase<DK>& k_in, const Eigen::MatrixBase<DV>& v_in) {
    const ConstMatrixRef<T> k = detail::as_view<T>(k_in);
    const ConstMatrixRef<T> v = detail::as_view<T>(v_in);
    const Index n = k.rows(), C = config_.n_embd, hd = config_.head_dim();
    detail::check_shape("k", {n, C}, {k.rows(), k.cols()});
    detail::check_shape("v", {n, C}, {v.rows(), v.cols()});
    check_room(n);
    if (n == 0) return;  // an empty k may have no storage: no views into it (null + offset is UB)
    for (Index h = 0; h < config_.n_head; ++h) {
      block(keys_, h).middleRows(n_past_, n) = k.middleCols(h * hd, hd);
      block(values_, h).middleRows(n_past_, n) = v.middleCols(h * hd, hd);
    }
    n_past_ += n;
  }

  // Appends n positions given head by head, as Hugging Face's past_key_values hold them:
  //   k, v [n_head * n, head_dim]: the row-major [n_head, n, head_dim] tensors of one sequence
  //   (layer_past[0][b], layer_past[1][b]); rows h*n .. h*n + n - 1 are head h's.
  // Throws CapacityError (cache unchanged) when they do not fit. Allocates nothing.
  template <class DK, class DV>
  void append_past(const Eigen::MatrixBase<DK>& k_in, const Eigen::MatrixBase<DV>& v_in) {
    const ConstMatrixRef<T> k = detail::as_view<T>(k_in);
    const ConstMatrixRef<T> v = detail::as_view<T>(v_in);
    const Index H = config_.n_head, hd = config_.head_dim();
    if (k.rows() % H != 0 || k.cols() != hd)
      throw ShapeError("k: expected shape [n_head * n, " + std::to_string(hd) + "] with n_head " +
                       std::to_string(H) + ", got " + detail::shape_string({k.rows(), k.cols()}));
    const Index n = k.rows() / H;
    detail::check_shape("v", {H * n, hd}, {v.rows(), v.cols()});
    check_room(n);
    if (n == 0) return;  // as in append
    for (Index h = 0; h < H; ++h) {
      block(keys_, h).middleRows(n_past_, n) = k.middleRows(h * n, n);
      block(values_, h).middleRows(n_past_, n) = v.middleRows(h * n, n);
    }
    n_past_ += n;
  }

  // The whole storage of keys / values [n_head * capacity, head_dim] (row h*capacity + p holds
  // head h's position p), read-only views into the cache (valid while it is neither moved from nor
  // destroyed): for overlap checks and inspection. Rows from n_past on are free space (they may
  // hold what a rolled-back forward wrote). Fill the cache with append().
  ConstMatrixRef<T> key_storage() const { return keys_; }
  ConstMatrixRef<T> value_storage() const { return values_; }

 private:
  template <class M>
  auto block(M& storage, Index h) const {
    return storage.middleRows(h * capacity_, capacity_);
  }
  Index check_head(Index h) const {
    if (h < 0 || h >= config_.n_head)
      throw ShapeError("head: expected an index in [0, " + std::to_string(config_.n_head) +
                       "), got " + std::to_string(h));
    return h;
  }
  void check_same_config(const AttentionConfig& other, const std::string& what) const {
    if (other.n_embd != config_.n_embd || other.n_head != config_.n_head)
      throw ConfigError(what + ": expected n_embd " + std::to_string(config_.n_embd) +
                        ", n_head " + std::to_string(config_.n_head) + ", got n_embd " +
                        std::to_string(other.n_embd) + ", n_head " + std::to_string(other.n_head));
  }

  AttentionConfig config_;
  Index capacity_ = 0;
  Index n_past_ = 0;
  RowMatrix<T> keys_;    // [n_head * capacity, head_dim]
  RowMatrix<T> values_;  // [n_head * capacity, head_dim]
};

}  // namespace gpt2

// KVCacheBF16: a KV cache (kv_cache.hpp) that holds the keys and values in bfloat16, for float
// forwards: half the bytes of a KVCache<float>, so half the bytes a decode step reads from it.
//
// What is rounded: a key or value is rounded to bf16 once, as it is appended (nearest, ties to even,
// kernels/bf16.hpp). The attention widens the cached bf16 back to float32 (exact) and runs the float
// core on it: a forward through a KVCacheBF16 gives bitwise what the same forward gives through a
// KVCache<float> whose keys and values were rounded to bf16 (tests/test_kv_cache_bf16.cpp), so
// every chunking of a sequence through it gives the same bits, as with a float cache. The new
// tokens' own keys and values are the rounded ones too (as in PyTorch with a bf16 cache): a forward
// through a KVCacheBF16 differs from the cache-free forward by that rounding (docs/bf16.md).
//
// Layout as KVCache's: per head, contiguous, keys [n_head][capacity][head_dim] (bf16 bits),
// values likewise.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <utility>

#include "gpt2/config.hpp"
#include "gpt2/error.hpp"
#include "gpt2/kernels/bf16.hpp"
#include "gpt2/types.hpp"

namespace gpt2 {

// Owns keys and values [n_head, capacity, head_dim] as bf16 bits; rows 0 .. n_past - 1 of each
// head are the cached positions. Allocates only in its constructor and in copy(). Not
// thread-safe: one sequence, one thread at a time. Copying is explicit (copy(), copy_from()).
class KVCacheBF16 {
 public:
  using Bits = std::uint16_t;
  using BitsMatrix = Eigen::Matrix<Bits, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using ConstBitsRef = Eigen::Ref<const BitsMatrix>;

  // Room for max_tokens positions: 2 * n_head * max_tokens * head_dim bf16 values.
  KVCacheBF16(const AttentionConfig& config, Index max_tokens) : config_(config) {
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

  KVCacheBF16(const KVCacheBF16&) = delete;
  KVCacheBF16& operator=(const KVCacheBF16&) = delete;
  // Moving leaves the source empty (capacity 0, nothing cached).
  KVCacheBF16(KVCacheBF16&& other) noexcept
      : config_(other.config_),
        capacity_(std::exchange(other.capacity_, 0)),
        n_past_(std::exchange(other.n_past_, 0)),
        keys_(std::move(other.keys_)),
        values_(std::move(other.values_)) {
    other.keys_.resize(0, config_.head_dim());
    other.values_.resize(0, config_.head_dim());
  }
  KVCacheBF16& operator=(KVCacheBF16&& other) noexcept {
    if (&other != this) {
      config_ = other.config_;
      capacity_ = std::exchange(other.capacity_, 0);
      n_past_ = std::exchange(other.n_past_, 0);
      keys_ = std::move(other.keys_);
      values_ = std::move(other.values_);
      other.keys_.resize(0, other.keys_.cols());
      other.values_.resize(0, other.values_.cols());
    }
    return *this;
  }

  // A deep copy (allocates a cache of the same capacity; copies the n_past cached rows).
  KVCacheBF16 copy() const {
    KVCacheBF16 c(config_, capacity_);
    c.copy_from(*this);
    return c;
  }

  // Makes this cache hold what `other` holds, reusing this cache's storage (no allocation). Needs
  // the same config and a capacity of at least other.n_past().
  void copy_from(const KVCacheBF16& other) {
    if (&other == this) return;
    if (other.config_.n_embd != config_.n_embd || other.config_.n_head != config_.n_head)
      throw ConfigError("copy_from: the source cache: expected n_embd " +
                        std::to_string(config_.n_embd) + ", n_head " +
                        std::to_string(config_.n_head) + ", got n_embd " +
                        std::to_string(other.config_.n_embd) + ", n_head " +
                        std::to_string(other.config_.n_head));
    if (other.n_past_ > capacity_)
      throw CapacityError("KV cache: cannot copy " + std::to_string(other.n_past_) +
                          " cached tokens into a cache with capacity " + std::to_string(capacity_));
    for (Index h = 0; h < config_.n_head; ++h) {
      block(keys_, h).topRows(other.n_past_) = other.key_bits(h);
      block(values_, h).topRows(other.n_past_) = other.value_bits(h);
    }
    n_past_ = other.n_past_;
  }

  const AttentionConfig& config() const { return config_; }
  Index capacity() const { return capacity_; }
  Index n_past() const { return n_past_; }
  // Bytes of the key and value storage (allocated in full by the constructor): half a
  // KVCache<float>'s.
  Index bytes() const {
    return (keys_.size() + values_.size()) * static_cast<Index>(sizeof(Bits));
  }
  Index remaining() const { return capacity_ - n_past_; }

  void reset() { n_past_ = 0; }

  // Keeps the first n positions, 0 <= n <= n_past.
  void truncate(Index n) {
    if (n < 0 || n > n_past_)
      throw ShapeError("truncate: expected a length in [0, " + std::to_string(n_past_) +
                       "] (the cached positions), got " + std::to_string(n));
    n_past_ = n;
  }

  // Head h's cached keys / values [n_past, head_dim] as bf16 bits (views into the cache).
  ConstBitsRef key_bits(Index h) const { return block(keys_, check_head(h)).topRows(n_past_); }
  ConstBitsRef value_bits(Index h) const {
    return block(values_, check_head(h)).topRows(n_past_);
  }

  // Head h's cached keys / values [n_past, head_dim] widened to float32 (exact): a new matrix
  // (allocates: named apart from KVCache's views; for inspection and tests, the forwards widen in
  // registers or in their workspace).
  RowMatrix<float> widened_keys(Index h) const { return widened(key_bits(h)); }
  RowMatrix<float> widened_values(Index h) const { return widened(value_bits(h)); }

  void check_room(Index count) const {
    if (count < 0 || count > remaining())
      throw CapacityError("KV cache: " + std::to_string(n_past_) + " cached + " +
                          std::to_string(count) + " new tokens exceed its capacity of " +
                          std::to_string(capacity_) + " tokens");
  }

  // Appends positions n_past .. n_past + n - 1, each key and value rounded to bf16:
  //   k, v [n, C] float: every head's rows side by side (the k and v blocks of a qkv matrix).
  // Throws CapacityError (cache unchanged) when they do not fit. Allocates nothing.
  template <class DK, class DV>
  void append(const Eigen::MatrixBase<DK>& k_in, const Eigen::MatrixBase<DV>& v_in) {
    const ConstMatrixRef<float> k = detail::as_view<float>(k_in);
    const ConstMatrixRef<float> v = detail::as_view<float>(v_in);
    const Index n = k.rows(), C = config_.n_embd, hd = config_.head_dim();
    detail::check_shape("k", {n, C}, {k.rows(), k.cols()});
    detail::check_shape("v", {n, C}, {v.rows(), v.cols()});
    check_room(n);
    for (Index h = 0; h < config_.n_head; ++h)
      for (Index i = 0; i < n; ++i) {
        round_row(k.row(i).data() + h * hd, hd, row_of(keys_, h, n_past_ + i));
        round_row(v.row(i).data() + h * hd, hd, row_of(values_, h, n_past_ + i));
      }
    n_past_ += n;
  }

  // Appends n positions given head by head (Hugging Face's past_key_values of one sequence):
  //   k, v [n_head * n, head_dim] float; rows h*n .. h*n + n - 1 are head h's. Rounded to bf16.
  template <class DK, class DV>
  void append_past(const Eigen::MatrixBase<DK>& k_in, const Eigen::MatrixBase<DV>& v_in) {
    const ConstMatrixRef<float> k = detail::as_view<float>(k_in);
    const ConstMatrixRef<float> v = detail::as_view<float>(v_in);
    const Index H = config_.n_head, hd = config_.head_dim();
    if (k.rows() % H != 0 || k.cols() != hd)
      throw ShapeError("k: expected shape [n_head * n, " + std::to_string(hd) + "] with n_head " +
                       std::to_string(H) + ", got " + detail::shape_string({k.rows(), k.cols()}));
    const Index n = k.rows() / H;
    detail::check_shape("v", {H * n, hd}, {v.rows(), v.cols()});
    check_room(n);
    for (Index h = 0; h < H; ++h)
      for (Index i = 0; i < n; ++i) {
        round_row(k.row(h * n + i).data(), hd, row_of(keys_, h, n_past_ + i));
        round_row(v.row(h * n + i).data(), hd, row_of(values_, h, n_past_ + i));
      }
    n_past_ += n;
  }

  // The whole storage of keys / values [n_head * capacity, head_dim] (bf16 bits; row h*capacity
  // + p is head h's position p): for overlap checks and inspection.
  ConstBitsRef key_storage() const { return keys_; }
  ConstBitsRef value_storage() const { return values_; }

 private:
  BitsMatrix::RowsBlockXpr block(BitsMatrix& storage, Index h) const {
    return storage.middleRows(h * capacity_, capacity_);
  }
  BitsMatrix::ConstRowsBlockXpr block(const BitsMatrix& storage, Index h) const {
    return storage.middleRows(h * capacity_, capacity_);
  }
  Bits* row_of(BitsMatrix& storage, Index h, Index p) {
    return storage.data() + (h * capacity_ + p) * config_.head_dim();
  }
  static void round_row(const float* x, Index n, Bits* out) {
    for (Index d = 0; d < n; ++d) out[d] = kernels::round_to_bf16(x[d]);
  }
  static RowMatrix<float> widened(const ConstBitsRef& bits) {
    RowMatrix<float> out(bits.rows(), bits.cols());
    for (Index i = 0; i < bits.rows(); ++i)
      for (Index d = 0; d < bits.cols(); ++d) out(i, d) = kernels::bf16_to_float(bits(i, d));
    return out;
  }
  Index check_head(Index h) const {
    if (h < 0 || h >= config_.n_head)
      throw ShapeError("head: expected an index in [0, " + std::to_string(config_.n_head) +
                       "), got " + std::to_string(h));
    return h;
  }

  AttentionConfig config_;
  Index capacity_ = 0;
  Index n_past_ = 0;
  BitsMatrix keys_;    // [n_head * capacity, head_dim] bf16 bits
  BitsMatrix values_;  // [n_head * capacity, head_dim] bf16 bits
};

}  // namespace gpt2

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
// values likewise, and the keys again transposed in 64-position blocks (bf16 bits).
#pragma once

#include <cstdint>

#include "gpt2/config.hpp"
#include "gpt2/error.hpp"
#include "gpt2/kernels/bf16.hpp"
#include "gpt2/kv_cache.hpp"
#include "gpt2/types.hpp"

namespace gpt2 {

// Owns keys and values [n_head, capacity, head_dim] as bf16 bits; rows 0 .. n_past - 1 of each
// head are the cached positions. Allocates only in its constructor and in copy(). Not
// thread-safe: one sequence, one thread at a time. Copying is explicit (copy(), copy_from()).
// config(), capacity(), n_past(), bytes() (half a KVCache<float>'s), remaining(), reset(),
// truncate(n), check_room(n), key_storage(), value_storage() (the bits): detail::KVStorage's
// (kv_cache.hpp), as KVCache's.
class KVCacheBF16 : public detail::KVStorage<std::uint16_t> {
  using Base = detail::KVStorage<std::uint16_t>;

 public:
  using Bits = std::uint16_t;
  using BitsMatrix = Base::Storage;
  using ConstBitsRef = ConstMatrixRef<Bits>;

  // Room for max_tokens positions: 2 * n_head * max_tokens * head_dim bf16 values, and the
  // transposed key blocks (n_head * ceil(max_tokens / 64) * 64 * head_dim more).
  KVCacheBF16(const AttentionConfig& config, Index max_tokens) : Base(config, max_tokens) {}

  KVCacheBF16(KVCacheBF16&&) noexcept = default;             // leaves the source empty
  KVCacheBF16& operator=(KVCacheBF16&&) noexcept = default;  // (capacity 0, nothing cached)

  // A deep copy (allocates a cache of the same capacity; copies the n_past cached rows).
  KVCacheBF16 copy() const {
    KVCacheBF16 c(config(), capacity());
    c.copy_from(*this);
    return c;
  }

  // Makes this cache hold what `other` holds, reusing this cache's storage (no allocation). Needs
  // the same config and a capacity of at least other.n_past().
  void copy_from(const KVCacheBF16& other) { copy_rows_from(other); }

  // Head h's cached keys / values [n_past, head_dim] as bf16 bits (views into the cache).
  ConstBitsRef key_bits(Index h) const { return head_keys(h); }
  ConstBitsRef value_bits(Index h) const { return head_values(h); }

  // Head h's cached keys / values [n_past, head_dim] widened to float32 (exact): a new matrix
  // (allocates: named apart from KVCache's views; for inspection and tests, the forwards widen in
  // registers or in their workspace).
  RowMatrix<float> widened_keys(Index h) const { return widened(key_bits(h)); }
  RowMatrix<float> widened_values(Index h) const { return widened(value_bits(h)); }

  // Appends positions n_past .. n_past + n - 1, each key and value rounded to bf16:
  //   k, v [n, C] float: every head's rows side by side (the k and v blocks of a qkv matrix).
  // Throws CapacityError (cache unchanged) when they do not fit. Allocates nothing.
  template <class DK, class DV>
  void append(const Eigen::MatrixBase<DK>& k, const Eigen::MatrixBase<DV>& v) {
    append_rows<float>(detail::as_view<float>(k), detail::as_view<float>(v), round_row);
  }

  // Appends n positions given head by head (Hugging Face's past_key_values of one sequence):
  //   k, v [n_head * n, head_dim] float; rows h*n .. h*n + n - 1 are head h's. Rounded to bf16.
  template <class DK, class DV>
  void append_past(const Eigen::MatrixBase<DK>& k, const Eigen::MatrixBase<DV>& v) {
    append_head_rows<float>(detail::as_view<float>(k), detail::as_view<float>(v), round_row);
  }

 private:
  friend struct detail::KVCacheAccess;
  static void round_row(const float* x, Index n, Bits* out) {
    for (Index d = 0; d < n; ++d) out[d] = kernels::round_to_bf16(x[d]);
  }
  static constexpr auto put_row = round_row;  // how a row is stored (detail::KVCacheAccess)
  static RowMatrix<float> widened(const ConstBitsRef& bits) {
    RowMatrix<float> out(bits.rows(), bits.cols());
    for (Index i = 0; i < bits.rows(); ++i)
      for (Index d = 0; d < bits.cols(); ++d) out(i, d) = kernels::bf16_to_float(bits(i, d));
    return out;
  }
};

}  // namespace gpt2

// KVCache<T>: the keys and values of the positions a sequence has already been through, for one
// layer, so that a forward over new tokens attends to them without recomputing them.
//
// Layout: per head, contiguous: keys [n_head][capacity][head_dim], values likewise (Hugging
// Face's past_key_values order, [n_head, n_past, head_dim] per sequence). Why: a decode step reads
// every cached key and value of a head once; with head h's n_past rows back to back that read is
// one contiguous stream of n_past * head_dim scalars, the score product q k^T is a plain
// matrix-vector product over it, and appending a token writes n_head short rows. (The qkv layout
// [capacity, C] would make every head's read a strided walk over all heads' data.)
//
// Float and bf16 caches also keep every key a second time, transposed in blocks of 64 positions
// (transposed_key_blocks(h)): a decode step's scores run over the keys with the positions in the
// vector lanes (kernels/attention_tile.hpp), and from the rows the kernels would transpose every
// block in registers, reading each row 16 times in 64-byte pieces; from the blocks they stream
// them. The keys are kept twice: bytes() adds n_head * ceil(capacity / 64) * 64 * head_dim elements
// to the keys and values (1.5x them for a capacity well above 64; more for small ones: 65
// positions take two blocks).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>

#include "gpt2/config.hpp"
#include "gpt2/detail/aligned_matrix.hpp"
#include "gpt2/error.hpp"
#include "gpt2/kernels/attention_tile.hpp"
#include "gpt2/types.hpp"

namespace gpt2 {

namespace detail {

// What KVCache<T> and KVCacheBF16 (kv_cache_bf16.hpp) share: keys and values [n_head, capacity,
// head_dim] of element type E, as [n_head * capacity, head_dim] row-major matrices (head h's
// position p at row h * capacity + p), the count of cached positions and the bookkeeping around
// it. The caches add what differs: how a key or value is stored (copied, or rounded to bf16) and
// how it is read back. Allocates only in its constructor.
template <class E>
class KVStorage {
 public:
  using Storage = AlignedMatrix<E>;  // 64-byte aligned (detail/aligned_matrix.hpp)
  // Whether the keys are also kept in transposed blocks: float32 and bf16 bits (the vector levels'
  // decode kernels read them); not double (the generic level's, which reads rows).
  static constexpr bool kKeepsKeyBlocks = !std::is_same<E, double>::value;
  static constexpr Index kKeyBlock = kernels::kKeyBlock;

  const AttentionConfig& config() const { return config_; }
  Index capacity() const { return capacity_; }          // positions it has room for in all
  Index n_past() const { return n_past_; }              // positions cached
  // Bytes of the key and value storage (allocated in full by the constructor), the transposed key
  // blocks included.
  Index bytes() const {
    return (keys_.size() + values_.size() + keys_t_.size()) * static_cast<Index>(sizeof(E));
  }
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

  // Throws CapacityError unless `count` more positions fit. Changes nothing.
  void check_room(Index count) const {
    if (count < 0 || count > remaining())
      throw CapacityError("KV cache: " + std::to_string(n_past_) + " cached + " +
                          std::to_string(count) + " new tokens exceed its capacity of " +
                          std::to_string(capacity_) + " tokens");
  }

  // The whole storage of keys / values [n_head * capacity, head_dim] (row h*capacity + p holds
  // head h's position p), read-only views into the cache (valid while it is neither moved from nor
  // destroyed): for overlap checks and inspection. Rows from n_past on are free space (they may
  // hold what a rolled-back forward wrote). Fill the cache with append().
  ConstMatrixRef<E> key_storage() const { return keys_.map(); }
  ConstMatrixRef<E> value_storage() const { return values_.map(); }

  // Head h's cached keys transposed in blocks of kKeyBlock positions: block b (positions 64 b ..
  // 64 b + 63) at transposed_key_blocks(h) + b * head_dim * kKeyBlock, [head_dim][kKeyBlock]
  // row-major (element (d, j) is head h's key 64 b + j, component d). Positions from n_past on
  // hold zeros or what a rolled-back forward wrote. Null for a double cache (which keeps none).
  const E* transposed_key_blocks(Index h) const {
    if constexpr (!kKeepsKeyBlocks) {
      (void)check_head(h);
      return nullptr;
    } else {
      return keys_t_.data() + check_head(h) * key_blocks() * config_.head_dim() * kKeyBlock;
    }
  }

 protected:
  // Room for max_tokens positions: 2 * n_head * max_tokens * head_dim elements, and the transposed
  // key blocks (n_head * ceil(max_tokens / 64) * 64 * head_dim; none for double).
  KVStorage(const AttentionConfig& config, Index max_tokens) : config_(config) {
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
    if constexpr (kKeepsKeyBlocks) {
      keys_t_.resize(config_.n_head * key_blocks() * config_.head_dim(), kKeyBlock);
      keys_t_.setZero();  // the lanes of positions not yet cached are read (and masked)
    } else {
      keys_t_.resize(0, kKeyBlock);
    }
  }

  // No implicit copies (a cache is megabytes): the caches' copy() and copy_from() are the
  // explicit ones.
  KVStorage(const KVStorage&) = delete;
  KVStorage& operator=(const KVStorage&) = delete;
  // Moving leaves the source empty (capacity 0, nothing cached).
  KVStorage(KVStorage&& other) noexcept
      : config_(other.config_),
        capacity_(std::exchange(other.capacity_, 0)),
        n_past_(std::exchange(other.n_past_, 0)),
        keys_(std::move(other.keys_)),
        values_(std::move(other.values_)),
        keys_t_(std::move(other.keys_t_)) {}  // (the storages leave other's 0 x their width)
  KVStorage& operator=(KVStorage&& other) noexcept {
    if (&other != this) {
      config_ = other.config_;
      capacity_ = std::exchange(other.capacity_, 0);
      n_past_ = std::exchange(other.n_past_, 0);
      keys_ = std::move(other.keys_);
      values_ = std::move(other.values_);
      keys_t_ = std::move(other.keys_t_);  // (our old storage freed; other's left 0 x width)
    }
    return *this;
  }
  ~KVStorage() = default;

  // Head h's cached keys / values [n_past, head_dim] (views into the storage).
  ConstMatrixRef<E> head_keys(Index h) const { return block(keys_, check_head(h)).topRows(n_past_); }
  ConstMatrixRef<E> head_values(Index h) const {
    return block(values_, check_head(h)).topRows(n_past_);
  }

  // This storage made to hold what `other` holds, reusing it (no allocation). Needs the same
  // config and a capacity of at least other.n_past().
  void copy_rows_from(const KVStorage& other) {
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
    const Index hd = config_.head_dim();
    const Index used = (other.n_past_ + kKeyBlock - 1) / kKeyBlock * hd * kKeyBlock;
    for (Index h = 0; h < config_.n_head; ++h) {
      block(keys_, h).topRows(other.n_past_) = other.head_keys(h);
      block(values_, h).topRows(other.n_past_) = other.head_values(h);
      if constexpr (kKeepsKeyBlocks)
        std::copy_n(other.transposed_key_blocks(h), used, key_blocks_of(h));
    }
    n_past_ = other.n_past_;
  }

  // Appends positions n_past .. n_past + n - 1 from k, v [n, C] (every head's rows side by side,
  // head h at columns h * head_dim: the k and v blocks of a qkv matrix), each row of head_dim
  // scalars stored by put(src, head_dim, dst). CapacityError (nothing changed) when they do not
  // fit. Allocates nothing.
  template <class S, class Put>
  void append_rows(const ConstMatrixRef<S>& k, const ConstMatrixRef<S>& v, Put put) {
    const Index n = k.rows(), C = config_.n_embd;
    check_shape("k", {n, C}, {k.rows(), k.cols()});
    check_shape("v", {n, C}, {v.rows(), v.cols()});
    check_room(n);
    for (Index h = 0; h < config_.n_head; ++h) put_head_rows<S>(h, n_past_, k, v, put);
    n_past_ += n;
  }

  // append_rows in two steps, for a forward that writes the heads on several threads: grow(n)
  // counts n more positions as cached (CapacityError, nothing changed, when they do not fit), then
  // put_head_rows(h, p, k, v, put) writes head h's rows of positions p .. p + n - 1 from k, v
  // [n, C] (shapes checked by the caller), heads on any threads. Until a head's rows are written
  // they hold whatever was there: nothing may read them before.
  void grow(Index n) {
    check_room(n);
    n_past_ += n;
  }
  template <class S, class Put>
  void put_head_rows(Index h, Index p, const ConstMatrixRef<S>& k, const ConstMatrixRef<S>& v,
                     Put put) {
    const Index hd = config_.head_dim();
    for (Index i = 0; i < k.rows(); ++i) {
      put(k.row(i).data() + h * hd, hd, row_of(keys_, h, p + i));
      put(v.row(i).data() + h * hd, hd, row_of(values_, h, p + i));
      transpose_key(h, p + i);
    }
  }

  // The same from k, v [n_head * n, head_dim] given head by head (Hugging Face's past_key_values
  // of one sequence: rows h*n .. h*n + n - 1 are head h's).
  template <class S, class Put>
  void append_head_rows(const ConstMatrixRef<S>& k, const ConstMatrixRef<S>& v, Put put) {
    const Index H = config_.n_head, hd = config_.head_dim();
    if (k.rows() % H != 0 || k.cols() != hd)
      throw ShapeError("k: expected shape [n_head * n, " + std::to_string(hd) + "] with n_head " +
                       std::to_string(H) + ", got " + shape_string({k.rows(), k.cols()}));
    const Index n = k.rows() / H;
    check_shape("v", {H * n, hd}, {v.rows(), v.cols()});
    check_room(n);
    for (Index h = 0; h < H; ++h)
      for (Index i = 0; i < n; ++i) {
        put(k.row(h * n + i).data(), hd, row_of(keys_, h, n_past_ + i));
        put(v.row(h * n + i).data(), hd, row_of(values_, h, n_past_ + i));
        transpose_key(h, n_past_ + i);
      }
    n_past_ += n;
  }

  Index check_head(Index h) const {
    if (h < 0 || h >= config_.n_head)
      throw ShapeError("head: expected an index in [0, " + std::to_string(config_.n_head) +
                       "), got " + std::to_string(h));
    return h;
  }

 private:
  auto block(Storage& storage, Index h) { return storage.middleRows(h * capacity_, capacity_); }
  auto block(const Storage& storage, Index h) const {
    return storage.middleRows(h * capacity_, capacity_);
  }
  E* row_of(Storage& storage, Index h, Index p) {
    return storage.data() + (h * capacity_ + p) * config_.head_dim();
  }
  Index key_blocks() const { return (capacity_ + kKeyBlock - 1) / kKeyBlock; }
  E* key_blocks_of(Index h) { return keys_t_.data() + h * key_blocks() * config_.head_dim() * kKeyBlock; }
  // Head h's stored key at position p copied into its transposed block (column p % kKeyBlock).
  void transpose_key(Index h, Index p) {
    if constexpr (kKeepsKeyBlocks) {
      const Index hd = config_.head_dim();
      const E* key = row_of(keys_, h, p);
      E* col = key_blocks_of(h) + (p / kKeyBlock) * hd * kKeyBlock + p % kKeyBlock;
      for (Index d = 0; d < hd; ++d) col[d * kKeyBlock] = key[d];
    } else {
      (void)h, (void)p;
    }
  }

  AttentionConfig config_;
  Index capacity_ = 0;
  Index n_past_ = 0;
  Storage keys_;    // [n_head * capacity, head_dim]
  Storage values_;  // [n_head * capacity, head_dim]
  Storage keys_t_;  // [n_head * key_blocks * head_dim, kKeyBlock] (empty for double)
};

}  // namespace detail

namespace detail {
struct KVCacheAccess;  // below
}  // namespace detail

// Owns keys and values [n_head, capacity, head_dim]; rows 0 .. n_past - 1 of each head are the
// cached positions. Allocates only in its constructor and in copy(). Not thread-safe: one
// sequence, one thread at a time. Copying is explicit (copy(), copy_from()): a cache is megabytes.
// config(), capacity(), n_past(), bytes(), remaining(), reset(), truncate(n), check_room(n),
// key_storage(), value_storage(): detail::KVStorage's, above.
template <class T>
class KVCache : public detail::KVStorage<T> {
  using Base = detail::KVStorage<T>;

 public:
  // Room for max_tokens positions: 2 * n_head * max_tokens * head_dim scalars (and in float the
  // transposed key blocks, n_head * ceil(max_tokens / 64) * 64 * head_dim more).
  KVCache(const AttentionConfig& config, Index max_tokens) : Base(config, max_tokens) {}

  KVCache(KVCache&&) noexcept = default;             // leaves the source empty
  KVCache& operator=(KVCache&&) noexcept = default;  // (capacity 0, nothing cached)

  // A deep copy (allocates a cache of the same capacity; copies the n_past cached rows).
  KVCache copy() const {
    KVCache c(this->config(), this->capacity());
    c.copy_from(*this);
    return c;
  }

  // Makes this cache hold what `other` holds, reusing this cache's storage (no allocation), e.g. to
  // fork a beam. Needs the same config and a capacity of at least other.n_past().
  void copy_from(const KVCache& other) { this->copy_rows_from(other); }

  // Head h's cached keys / values [n_past, head_dim] (views into the cache, valid until it is
  // moved from or destroyed; their contents change with append, reset and copy_from).
  ConstMatrixRef<T> keys(Index h) const { return this->head_keys(h); }
  ConstMatrixRef<T> values(Index h) const { return this->head_values(h); }

  // Appends positions n_past .. n_past + n - 1:
  //   k, v [n, C]: every head's key (value) rows side by side, head h at columns h*head_dim, i.e.
  //   the k (v) block of a qkv matrix: qkv.middleCols(C, C) (qkv.middleCols(2 * C, C)).
  // Throws CapacityError (cache unchanged) when they do not fit. Allocates nothing.
  template <class DK, class DV>
  void append(const Eigen::MatrixBase<DK>& k, const Eigen::MatrixBase<DV>& v) {
    this->template append_rows<T>(detail::as_view<T>(k), detail::as_view<T>(v), copy_row);
  }

  // Appends n positions given head by head, as Hugging Face's past_key_values hold them:
  //   k, v [n_head * n, head_dim]: the row-major [n_head, n, head_dim] tensors of one sequence
  //   (layer_past[0][b], layer_past[1][b]); rows h*n .. h*n + n - 1 are head h's.
  // Throws CapacityError (cache unchanged) when they do not fit. Allocates nothing.
  template <class DK, class DV>
  void append_past(const Eigen::MatrixBase<DK>& k, const Eigen::MatrixBase<DV>& v) {
    this->template append_head_rows<T>(detail::as_view<T>(k), detail::as_view<T>(v), copy_row);
  }

 private:
  friend struct detail::KVCacheAccess;
  static void copy_row(const T* src, Index n, T* dst) { std::copy_n(src, n, dst); }
  static constexpr auto put_row = copy_row;  // how a row is stored (detail::KVCacheAccess)
};

namespace detail {

// What the cached forwards (incremental.hpp, incremental_bf16.hpp) use to append a decode step's
// keys and values head by head on the threads that attend those heads: KVStorage::grow and
// put_head_rows, with the cache's own way of storing a row (Cache::put_row). S: the scalar of k, v.
struct KVCacheAccess {
  template <class Cache>
  static void grow(Cache& cache, Index n) {
    cache.grow(n);
  }
  template <class S, class Cache>
  static void put_head_rows(Cache& cache, Index h, Index p, const ConstMatrixRef<S>& k,
                            const ConstMatrixRef<S>& v) {
    cache.template put_head_rows<S>(h, p, k, v, Cache::put_row);
  }
};

}  // namespace detail

}  // namespace gpt2

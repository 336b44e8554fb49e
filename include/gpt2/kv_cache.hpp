// KV caches: the keys and values of the positions a sequence has already been through, for one
// layer, so that a forward over new tokens attends to them without recomputing them.
//
// The cache concept. The forwards (sublayer.hpp, batch.hpp) take any cache type C that has:
//   C::Scalar, C::Element      the forwards' scalar (float or double) and what the cache stores
//                              (Scalar, std::uint16_t: bfloat16 bits, or std::int8_t: int8 values
//                              with a float32 scale per row)
//   config()                   n_embd and n_head of its heads (the weights' heads)
//   n_past()                   positions held (before a forward: its new rows' first position)
//   check_append(n)            throws CapacityError / ShapeError unless n more positions can be
//                              appended; changes nothing
//   begin_append(n) -> p       counts n more positions as held, from p = n_past() on (their rows
//                              are written next); may throw CapacityError, nothing changed
//   write_head(h, p, k, v)     head h's rows of positions p .. p + n - 1 from k, v [n, C] (every
//                              head's rows side by side: a qkv matrix's k and v blocks), stored as
//                              Element; distinct heads may be written on different threads
//   rollback(p)                back to p positions (undoes begin_append)
//   head_pages(h)              HeadPages<Element>: head h's keys and values in pages, as the fused
//                              core reads them (kernels/attention_tile.hpp)
//   check_disjoint(what, view) ShapeError "<what>: must not overlap the ..." when a matrix view
//                              overlaps its storage
//   label()                    how errors name it ("cache", "sequence")
// Models: KVCache<S> (below; S = float, double, bfloat16 or int8), PagedSequence<S> and PagedLayer<S>
// (paged_kv_cache.hpp). A new storage type is one more model, not another forward.
//
// KVCache<S>'s layout: per head, contiguous: keys [n_head][capacity][head_dim], values likewise
// (Hugging Face's past_key_values order): a decode step reads each head's cached keys and values as
// one stream each, and appending writes n_head short rows. Float and bf16 caches also keep every
// key a second time, transposed in blocks of 64 positions (transposed_key_blocks(h)): the vector
// levels' decode steps then stream the keys with the positions in the vector lanes instead of
// transposing rows (bytes() counts them: n_head * ceil(capacity / 64) * 64 * head_dim more
// elements).
//
// KVCache<bfloat16> (KVCacheBF16) holds keys and values in bfloat16, for float forwards: half the
// bytes of a KVCache<float>. Each key and value is rounded to bf16 once, as it is appended
// (nearest, ties to even); the attention reads them widened (exact), so a forward through it gives
// bitwise what the same forward gives through a KVCache<float> holding the rounded values, and any
// chunking of a sequence gives the same bits (docs/bf16.md).
//
// KVCache<int8> (KVCacheInt8) holds keys and values as int8, for float forwards: a quarter of the
// bytes of a KVCache<float> (transposed key blocks included) plus one float32 scale per (position,
// head) for the keys and another for the values. Each key (value) row of a head, head_dim values, is
// quantized as one block when it is appended (kernels/int8.hpp's quantize_block: scale =
// max |x| / 127, q = nearbyint(x * 127 / max |x|)); the attention reads float(q) * scale (one
// float32 multiply, kernels/int8_dequant.hpp), so a forward through it gives bitwise what the same
// forward gives through a KVCache<float> holding those values, and any chunking of a sequence
// gives the same bits (docs/kv_cache_int8.md).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "gpt2/config.hpp"
#include "gpt2/detail/aligned_matrix.hpp"
#include "gpt2/error.hpp"
#include "gpt2/kernels/attention_tile.hpp"
#include "gpt2/kernels/int8.hpp"
#include "gpt2/kernels/layout.hpp"
#include "gpt2/types.hpp"

namespace gpt2 {

// The storage type of caches that hold keys and values in bfloat16 (for float forwards):
// KVCache<bfloat16>, KVBlockPool<bfloat16>, PagedSequence<bfloat16>.
struct bfloat16 {};

// The storage type of caches that hold keys and values as int8 with a float32 scale per row (for
// float forwards): KVCache<int8>, KVBlockPool<int8>, PagedSequence<int8>.
struct int8 {};

namespace detail {

// What a cache of storage type S stores and how: Scalar (the forwards' type), Element (what its
// memory holds), put (a row of Scalar stored as Element), kScaled (whether each row also has a
// float32 scale: put returns it).
template <class S>
struct KVStorageTraits {
  static_assert(std::is_same<S, float>::value || std::is_same<S, double>::value,
                "gpt2: a KV cache stores float, double, bfloat16 or int8");
  using Scalar = S;
  using Element = S;
  static constexpr bool kScaled = false;
  static void put(const S* src, Index n, S* dst) { std::copy_n(src, n, dst); }
};
template <>
struct KVStorageTraits<bfloat16> {
  using Scalar = float;
  using Element = std::uint16_t;
  static constexpr bool kScaled = false;
  static void put(const float* src, Index n, std::uint16_t* dst) {
    for (Index d = 0; d < n; ++d) dst[d] = kernels::round_to_bf16(src[d]);
  }
};
template <>
struct KVStorageTraits<int8> {
  using Scalar = float;
  using Element = std::int8_t;
  static constexpr bool kScaled = true;
  // The row quantized as one block; returns its scale.
  static float put(const float* src, Index n, std::int8_t* dst) {
    return kernels::quantize_block(src, n, dst);
  }
};

// Stores row src[0, n) of storage type S at dst, and its scale at *scale where S has one.
template <class S>
void put_row(const typename KVStorageTraits<S>::Scalar* src, Index n,
             typename KVStorageTraits<S>::Element* dst, float* scale) {
  if constexpr (KVStorageTraits<S>::kScaled)
    *scale = KVStorageTraits<S>::put(src, n, dst);
  else
    (void)scale, KVStorageTraits<S>::put(src, n, dst);
}

// CapacityError unless n_past + count <= capacity (count >= 0).
inline void check_room(Index n_past, Index count, Index capacity) {
  if (count < 0 || count > capacity - n_past)
    throw CapacityError("KV cache: " + std::to_string(n_past) + " cached + " +
                        std::to_string(count) + " new tokens exceed its capacity of " +
                        std::to_string(capacity) + " tokens");
}

inline Index check_head_index(Index h, Index n_head) {
  if (h < 0 || h >= n_head)
    throw ShapeError("head: expected an index in [0, " + std::to_string(n_head) + "), got " +
                     std::to_string(h));
  return h;
}

}  // namespace detail

// Owns keys and values [n_head, capacity, head_dim] of storage type S (float, double, bfloat16,
// int8; int8 with scales [n_head, capacity] for each);
// rows 0 .. n_past - 1 of each head are the cached positions. Allocates only in its constructor and
// in copy(). Not thread-safe: one sequence, one thread at a time. Copying is explicit (copy(),
// copy_from()): a cache is megabytes. Moving leaves the source empty (capacity 0).
template <class S>
class KVCache {
  using Traits = detail::KVStorageTraits<S>;

 public:
  using Scalar = typename Traits::Scalar;    // the forwards' scalar
  using Element = typename Traits::Element;  // what the storage holds
  static constexpr Index kKeyBlock = kernels::kKeyBlock;
  // Whether the keys are also kept in transposed blocks: float, bf16 and int8 (the vector levels'
  // decode steps read them; int8 ones dequantized a chunk at a time, detail/pipeline.hpp); not
  // double (the generic level's, which reads rows).
  static constexpr bool kKeepsKeyBlocks = !std::is_same<Element, double>::value;
  // Whether each row has a float32 scale (int8).
  static constexpr bool kScaled = Traits::kScaled;

  // Room for max_tokens positions: 2 * n_head * max_tokens * head_dim elements, the transposed
  // key blocks (not double), and (int8) 2 * n_head * max_tokens scales, rounded up to key blocks.
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
    if constexpr (kKeepsKeyBlocks) {
      keys_t_.resize(config_.n_head * key_blocks() * config_.head_dim(), kKeyBlock);
      keys_t_.setZero();  // the lanes of positions not yet cached are read (and masked)
    } else {
      keys_t_.resize(0, kKeyBlock);
    }
    if constexpr (kScaled) {  // room to the end of the last key block: its lanes are read
      key_scales_.resize(config_.n_head, key_blocks() * kKeyBlock);
      value_scales_.resize(config_.n_head, key_blocks() * kKeyBlock);
      key_scales_.setZero();
      value_scales_.setZero();
    }
    pages_.resize(2 * static_cast<std::size_t>(config_.n_head));
    scale_pages_.resize(2 * static_cast<std::size_t>(config_.n_head));
    for (Index h = 0; h < config_.n_head; ++h) {
      pages_[2 * static_cast<std::size_t>(h)] = keys_.data() + h * capacity_ * config_.head_dim();
      pages_[2 * static_cast<std::size_t>(h) + 1] =
          values_.data() + h * capacity_ * config_.head_dim();
      if constexpr (kScaled) {
        scale_pages_[2 * static_cast<std::size_t>(h)] = scales_of(key_scales_, h);
        scale_pages_[2 * static_cast<std::size_t>(h) + 1] = scales_of(value_scales_, h);
      }
    }
  }

  KVCache(KVCache&& other) noexcept
      : config_(other.config_),
        capacity_(std::exchange(other.capacity_, 0)),
        n_past_(std::exchange(other.n_past_, 0)),
        keys_(std::move(other.keys_)),
        values_(std::move(other.values_)),
        keys_t_(std::move(other.keys_t_)),
        key_scales_(std::move(other.key_scales_)),
        value_scales_(std::move(other.value_scales_)),
        pages_(std::move(other.pages_)),
        scale_pages_(std::move(other.scale_pages_)) {}
  KVCache& operator=(KVCache&& other) noexcept {
    if (&other != this) {
      config_ = other.config_;
      capacity_ = std::exchange(other.capacity_, 0);
      n_past_ = std::exchange(other.n_past_, 0);
      keys_ = std::move(other.keys_);
      values_ = std::move(other.values_);
      keys_t_ = std::move(other.keys_t_);
      key_scales_ = std::move(other.key_scales_);
      value_scales_ = std::move(other.value_scales_);
      pages_ = std::move(other.pages_);
      scale_pages_ = std::move(other.scale_pages_);
    }
    return *this;
  }
  KVCache(const KVCache&) = delete;
  KVCache& operator=(const KVCache&) = delete;

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
      block(keys_, h).topRows(other.n_past_) = other.keys(h);
      block(values_, h).topRows(other.n_past_) = other.values(h);
      if constexpr (kKeepsKeyBlocks)
        std::copy_n(other.transposed_key_blocks(h), used, key_blocks_of(h));
      if constexpr (kScaled) {
        std::copy_n(other.scale_pages_[2 * static_cast<std::size_t>(h)], other.n_past_,
                    scales_of(key_scales_, h));
        std::copy_n(other.scale_pages_[2 * static_cast<std::size_t>(h) + 1], other.n_past_,
                    scales_of(value_scales_, h));
      }
    }
    n_past_ = other.n_past_;
  }

  const AttentionConfig& config() const { return config_; }
  Index capacity() const { return capacity_; }             // positions it has room for in all
  Index n_past() const { return n_past_; }                 // positions cached
  Index remaining() const { return capacity_ - n_past_; }  // positions that still fit
  // Bytes of the key and value storage (allocated in full by the constructor), the transposed key
  // blocks and the scales included.
  Index bytes() const {
    return (keys_.size() + values_.size() + keys_t_.size()) * static_cast<Index>(sizeof(Element)) +
           (key_scales_.size() + value_scales_.size()) * static_cast<Index>(sizeof(float));
  }

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
  void check_room(Index count) const { detail::check_room(n_past_, count, capacity_); }

  // Head h's cached keys / values [n_past, head_dim] (views into the cache, valid until it is moved
  // from or destroyed; bf16 bits for a bf16 cache, int8 values for an int8 one).
  ConstMatrixRef<Element> keys(Index h) const { return block(keys_, check_head(h)).topRows(n_past_); }
  ConstMatrixRef<Element> values(Index h) const {
    return block(values_, check_head(h)).topRows(n_past_);
  }

  // An int8 cache's scales of head h's cached keys / values [n_past] (views, as keys(h)): key row
  // p stands for float(keys(h)(p, d)) * key_scales(h)[p].
  ConstVectorMap<float> key_scales(Index h) const {
    static_assert(kScaled, "gpt2: only an int8 cache has scales");
    return {scale_pages_[2 * static_cast<std::size_t>(check_head(h))], n_past_};
  }
  ConstVectorMap<float> value_scales(Index h) const {
    static_assert(kScaled, "gpt2: only an int8 cache has scales");
    return {scale_pages_[2 * static_cast<std::size_t>(check_head(h)) + 1], n_past_};
  }

  // A bf16 cache's keys / values of head h widened to float (exact), an int8 cache's dequantized
  // (float(q) * scale, the values its forwards read): new matrices (allocate; for inspection and
  // tests: the forwards read the cache in place).
  RowMatrix<Scalar> widened_keys(Index h) const { return widened(keys(h), 2 * h); }
  RowMatrix<Scalar> widened_values(Index h) const { return widened(values(h), 2 * h + 1); }

  // The whole storage of keys / values [n_head * capacity, head_dim] (row h * capacity + p holds
  // head h's position p): for overlap checks and inspection. Rows from n_past on are free space.
  ConstMatrixRef<Element> key_storage() const { return keys_.map(); }
  ConstMatrixRef<Element> value_storage() const { return values_.map(); }

  // Head h's keys transposed in blocks of kKeyBlock positions: block b (positions 64 b .. 64 b +
  // 63) at transposed_key_blocks(h) + b * head_dim * kKeyBlock, [head_dim][kKeyBlock] row-major
  // (int8: the key rows' values, with their rows' scales). Null for a double cache (none).
  const Element* transposed_key_blocks(Index h) const {
    check_head(h);
    if constexpr (!kKeepsKeyBlocks)
      return nullptr;
    else
      return keys_t_.data() + h * key_blocks() * config_.head_dim() * kKeyBlock;
  }

  // Appends positions n_past .. n_past + n - 1:
  //   k, v [n, C]: every head's key (value) rows side by side, head h at columns h*head_dim, i.e.
  //   the k (v) block of a qkv matrix: qkv.middleCols(C, C) (qkv.middleCols(2 * C, C)).
  // Throws CapacityError (cache unchanged) when they do not fit. Allocates nothing.
  template <class DK, class DV>
  void append(const Eigen::MatrixBase<DK>& k_in, const Eigen::MatrixBase<DV>& v_in) {
    const ConstMatrixRef<Scalar> k = detail::as_view<Scalar>(k_in), v = detail::as_view<Scalar>(v_in);
    const Index n = k.rows(), C = config_.n_embd;
    detail::check_shape("k", {n, C}, {k.rows(), k.cols()});
    detail::check_shape("v", {n, C}, {v.rows(), v.cols()});
    check_room(n);
    for (Index h = 0; h < config_.n_head; ++h) write_head(h, n_past_, k, v);
    n_past_ += n;
  }

  // Appends n positions given head by head, as Hugging Face's past_key_values hold them:
  //   k, v [n_head * n, head_dim]: the row-major [n_head, n, head_dim] tensors of one sequence;
  //   rows h*n .. h*n + n - 1 are head h's.
  // Throws CapacityError (cache unchanged) when they do not fit. Allocates nothing.
  template <class DK, class DV>
  void append_past(const Eigen::MatrixBase<DK>& k_in, const Eigen::MatrixBase<DV>& v_in) {
    const ConstMatrixRef<Scalar> k = detail::as_view<Scalar>(k_in), v = detail::as_view<Scalar>(v_in);
    const Index H = config_.n_head, hd = config_.head_dim();
    if (k.rows() % H != 0 || k.cols() != hd)
      throw ShapeError("k: expected shape [n_head * n, " + std::to_string(hd) + "] with n_head " +
                       std::to_string(H) + ", got " + detail::shape_string({k.rows(), k.cols()}));
    const Index n = k.rows() / H;
    detail::check_shape("v", {H * n, hd}, {v.rows(), v.cols()});
    check_room(n);
    for (Index h = 0; h < H; ++h)
      for (Index i = 0; i < n; ++i)
        put_row(h, n_past_ + i, k.row(h * n + i).data(), v.row(h * n + i).data());
    n_past_ += n;
  }

  // ---- the cache concept (see the top of this file) ----
  void check_append(Index n) const { check_room(n); }
  Index begin_append(Index n) {
    check_room(n);
    const Index p = n_past_;
    n_past_ += n;
    return p;
  }
  void rollback(Index p) { truncate(p); }
  // k, v [n, C] (shapes checked by the caller); positions p .. p + n - 1 < capacity.
  void write_head(Index h, Index p, const ConstMatrixRef<Scalar>& k, const ConstMatrixRef<Scalar>& v) {
    const Index hd = config_.head_dim();
    for (Index i = 0; i < k.rows(); ++i)
      put_row(h, p + i, k.row(i).data() + h * hd, v.row(i).data() + h * hd);
  }
  HeadPages<Element> head_pages(Index h) const {
    HeadPages<Element> kv;
    kv.key_pages = &pages_[2 * static_cast<std::size_t>(h)];
    kv.value_pages = &pages_[2 * static_cast<std::size_t>(h) + 1];
    kv.page_rows = std::max<Index>(capacity_, 1);  // one page
    kv.row_stride = config_.head_dim();
    kv.n_keys = n_past_;
    kv.head_dim = config_.head_dim();
    kv.keys_t = transposed_key_blocks(h);
    if constexpr (kScaled) {
      kv.key_scale_pages = &scale_pages_[2 * static_cast<std::size_t>(h)];
      kv.value_scale_pages = &scale_pages_[2 * static_cast<std::size_t>(h) + 1];
    }
    return kv;
  }
  template <class V>
  void check_disjoint(const char* what, const V& view) const {
    if (detail::overlaps(view, keys_.map()) || detail::overlaps(view, values_.map()) ||
        detail::overlaps(view, keys_t_.map()) || detail::overlaps(view, key_scales_.map()) ||
        detail::overlaps(view, value_scales_.map()))
      throw ShapeError(std::string(what) + ": must not overlap the KV cache");
  }
  static const char* label() { return "cache"; }

 private:
  using Storage = detail::AlignedMatrix<Element>;  // 64-byte aligned

  Index check_head(Index h) const { return detail::check_head_index(h, config_.n_head); }
  auto block(Storage& storage, Index h) { return storage.middleRows(h * capacity_, capacity_); }
  auto block(const Storage& storage, Index h) const {
    return storage.middleRows(h * capacity_, capacity_);
  }
  Element* row_of(Storage& storage, Index h, Index p) {
    return storage.data() + (h * capacity_ + p) * config_.head_dim();
  }
  Index key_blocks() const { return (capacity_ + kKeyBlock - 1) / kKeyBlock; }
  Element* key_blocks_of(Index h) {
    return keys_t_.data() + h * key_blocks() * config_.head_dim() * kKeyBlock;
  }
  float* scales_of(detail::AlignedMatrix<float>& scales, Index h) {
    return scales.data() + h * scales.outerStride();
  }
  // Head h's position p: key and value rows stored (with their scales), and the key copied into
  // its transposed block.
  void put_row(Index h, Index p, const Scalar* k, const Scalar* v) {
    const Index hd = config_.head_dim();
    Element* key = row_of(keys_, h, p);
    float* key_scale = kScaled ? scales_of(key_scales_, h) + p : nullptr;
    float* value_scale = kScaled ? scales_of(value_scales_, h) + p : nullptr;
    detail::put_row<S>(k, hd, key, key_scale);
    detail::put_row<S>(v, hd, row_of(values_, h, p), value_scale);
    if constexpr (kKeepsKeyBlocks) {
      Element* col = key_blocks_of(h) + (p / kKeyBlock) * hd * kKeyBlock + p % kKeyBlock;
      for (Index d = 0; d < hd; ++d) col[d * kKeyBlock] = key[d];
    }
  }
  // e: keys(h) or values(h); page: 2 h for keys, 2 h + 1 for values (their scales).
  RowMatrix<Scalar> widened(const ConstMatrixRef<Element>& e, Index page) const {
    if constexpr (std::is_same<Element, Scalar>::value) {
      return (void)page, e;
    } else {
      RowMatrix<Scalar> out(e.rows(), e.cols());
      for (Index i = 0; i < e.rows(); ++i)
        for (Index d = 0; d < e.cols(); ++d) {
          if constexpr (kScaled)
            out(i, d) = static_cast<float>(e(i, d)) *
                        scale_pages_[static_cast<std::size_t>(page)][i];
          else
            out(i, d) = kernels::bf16_to_float(e(i, d));
        }
      return out;
    }
  }

  AttentionConfig config_;
  Index capacity_ = 0;
  Index n_past_ = 0;
  Storage keys_;    // [n_head * capacity, head_dim]
  Storage values_;  // [n_head * capacity, head_dim]
  Storage keys_t_;  // [n_head * key_blocks * head_dim, kKeyBlock] (empty for double)
  // [n_head, key_blocks * kKeyBlock] (int8; else empty)
  detail::AlignedMatrix<float> key_scales_, value_scales_;
  std::vector<const Element*> pages_;  // head h's key page at 2h, value page at 2h + 1
  std::vector<const float*> scale_pages_;  // int8: their scales, likewise (else null)
};

// A KV cache in bfloat16, for float forwards.
using KVCacheBF16 = KVCache<bfloat16>;
// A KV cache in int8 with a float32 scale per (position, head) row, for float forwards.
using KVCacheInt8 = KVCache<int8>;

}  // namespace gpt2

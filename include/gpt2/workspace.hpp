// Scratch, allocated once and reused so that repeated forwards allocate nothing:
//   AttentionScratch<T>  one thread's scratch for one head's attention (the fused core's tile,
//                        and the probabilities' score rows once they are asked for)
//   GemmScratch<T>       one thread's packing buffers of the products (kernels/gemm_scratch.hpp)
//   Workspace<T>         everything a forward needs: qkv, merged, and the above per thread
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "gpt2/config.hpp"
#include "gpt2/detail/aligned_matrix.hpp"
#include "gpt2/detail/parallel.hpp"
#include "gpt2/error.hpp"
#include "gpt2/kernels/attention_tile.hpp"
#include "gpt2/kernels/gemm_scratch.hpp"
#include "gpt2/threads.hpp"
#include "gpt2/types.hpp"

namespace gpt2 {

// The score rows of the probabilities start on 64-byte boundaries (their column count is rounded up
// to a multiple of kScoreRowAlign scalars), so every row has the alignment of the first: the
// generic level's vectorized exp and sum then split a row at the same places whatever its width.
template <class T>
constexpr Index kScoreRowAlign = 64 / static_cast<Index>(sizeof(T));

// One thread's scratch for the attention of one head: the fused core's tile buffer
// (kernels::tile_scratch_size: independent of the number of keys), only once probabilities are
// asked for their [kTileMaxRows, n_keys] score rows and a block of keys widened from bf16, and only
// for an int8 cache its keys and values dequantized to float32 (reserve_dequantized). Grows on
// demand; reserve() (and reserve_probabilities()) up front for allocation-free calls. Not
// thread-safe: one per thread.
template <class T>
class AttentionScratch {
 public:
  AttentionScratch() = default;
  AttentionScratch(Index max_keys, Index head_dim) { reserve(max_keys, head_dim); }

  // Room for attention over up to max_keys keys of width head_dim without probabilities (the tile
  // buffer's size does not depend on max_keys). If an allocation throws, the scratch stays usable.
  void reserve(Index max_keys, Index head_dim) {
    (void)max_keys;
    reserve_tile(head_dim);
  }

  // Room for the probabilities of up to max_keys keys too.
  void reserve_probabilities(Index max_keys, Index head_dim) {
    reserve_tile(head_dim);
    if (widened.rows() < kernels::kKeyBlock || widened.cols() < head_dim) {
      RowMatrix<T> grown(kernels::kKeyBlock, head_dim);
      widened.swap(grown);
    }
    if (scores.cols() < max_keys) {
      const Index cols = (max_keys + kScoreRowAlign<T> - 1) / kScoreRowAlign<T> * kScoreRowAlign<T>;
      RowMatrix<T> grown(kernels::kTileMaxRows, cols);  // allocate first: scores stays valid
      scores.swap(grown);
    }
  }

  // The fused core's buffer for head_dim (allocated when it is smaller; 64-byte aligned).
  void reserve_tile(Index head_dim) {
    const Index want = kernels::tile_scratch_size<T>(head_dim, bf16_products_);
    if (tile_size_ >= want) return;
    const std::size_t bytes = static_cast<std::size_t>(want) * sizeof(T);
    std::unique_ptr<T, AlignedDelete> grown(
        static_cast<T*>(::operator new(bytes, std::align_val_t(64))));
    tile_.swap(grown);
    tile_size_ = want;
  }
  T* tile() { return tile_.get(); }

  // Room for the keys and values of up to max_keys positions of width head_dim dequantized from an
  // int8 cache (the forwards through one call it: a multi-row tile dequantizes every key it sees,
  // a decode step a chunk of key blocks at a time): two buffers of max_keys rounded up to
  // kKeyBlock rows, padded_head_dim(head_dim) apart, and a page list of kKeyBlock rows for each.
  // If an allocation throws, the scratch stays usable. With bf16 products, the same room in bf16
  // too (reserve_dequantized_bf16).
  void reserve_dequantized(Index max_keys, Index head_dim) {
    grow_dequantized(max_keys, head_dim, dequantized_, dequantized_size_, dequantized_pages_);
    if (bf16_products_) reserve_dequantized_bf16(max_keys, head_dim);
  }
  // Room for the same keys and values dequantized and rounded to bf16 (bits), the blocks a level
  // with bf16 pair products reads in bf16 (Kernels::bf16_pair_decode): the same layout in bf16
  // elements.
  void reserve_dequantized_bf16(Index max_keys, Index head_dim) {
    grow_dequantized(max_keys, head_dim, dequantized_bf16_, dequantized_bf16_size_,
                     dequantized_bf16_pages_);
  }
  // The dequantized keys (first half) and values (second half), dequantized_size() scalars,
  // 64-byte aligned; the page lists: keys' at [0, n), values' at [n, 2 n), n =
  // dequantized_pages().size() / 2 blocks. The same for the bf16 copies.
  T* dequantized() { return dequantized_.get(); }
  Index dequantized_size() const { return dequantized_size_; }
  std::vector<const T*>& dequantized_pages() { return dequantized_pages_; }
  std::uint16_t* dequantized_bf16() { return dequantized_bf16_.get(); }
  Index dequantized_bf16_size() const { return dequantized_bf16_size_; }
  std::vector<const std::uint16_t*>& dequantized_bf16_pages() { return dequantized_bf16_pages_; }

  // Whether the fused core's products run in bf16 (the weights' precision, set by the forwards):
  // where a level has a bf16 core for them, its buffer may be larger (reserve_tile).
  bool bf16_products() const { return bf16_products_; }
  void set_bf16_products(bool on) { bf16_products_ = on; }

  Index bytes() const {
    return (tile_size_ + scores.size() + widened.size() + dequantized_size_) *
               static_cast<Index>(sizeof(T)) +
           dequantized_bf16_size_ * static_cast<Index>(sizeof(std::uint16_t));
  }

  RowMatrix<T> scores;    // [kTileMaxRows, max_keys rounded up to kScoreRowAlign<T>]
  RowMatrix<T> widened;   // [kKeyBlock, head_dim]: a block of bf16 keys widened (probabilities)

 private:
  struct AlignedDelete {
    template <class E>
    void operator()(E* p) const {
      ::operator delete(p, std::align_val_t(64));
    }
  };
  // buf grown to two halves of max_keys rounded up to kKeyBlock rows of padded_head_dim(head_dim)
  // elements, pages to a page list of kKeyBlock rows for each (allocated first: both stay valid
  // if an allocation throws).
  template <class E>
  static void grow_dequantized(Index max_keys, Index head_dim,
                               std::unique_ptr<E, AlignedDelete>& buf, Index& size,
                               std::vector<const E*>& pages) {
    const Index blocks = std::max<Index>(1, (max_keys + kernels::kKeyBlock - 1) / kernels::kKeyBlock);
    const Index want = 2 * blocks * kernels::kKeyBlock * kernels::padded_head_dim(head_dim);
    if (pages.size() < 2 * static_cast<std::size_t>(blocks)) {
      std::vector<const E*> grown(2 * static_cast<std::size_t>(blocks));
      pages.swap(grown);
    }
    if (size >= want) return;
    std::unique_ptr<E, AlignedDelete> grown(static_cast<E*>(
        ::operator new(static_cast<std::size_t>(want) * sizeof(E), std::align_val_t(64))));
    buf.swap(grown);
    size = want;
  }
  std::unique_ptr<T, AlignedDelete> tile_;
  Index tile_size_ = 0;
  bool bf16_products_ = false;
  std::unique_ptr<T, AlignedDelete> dequantized_;  // int8 caches' keys, then values
  Index dequantized_size_ = 0;
  std::vector<const T*> dequantized_pages_;
  std::unique_ptr<std::uint16_t, AlignedDelete> dequantized_bf16_;  // the same, bf16 bits
  Index dequantized_bf16_size_ = 0;
  std::vector<const std::uint16_t*> dequantized_bf16_pages_;
};

// The scratch one thread of a forward works in.
template <class T>
struct ThreadScratch {
  AttentionScratch<T> attention;
  GemmScratch<T> gemm;
  Index bytes() const { return attention.bytes() + gemm.bytes(); }
};

// Owns: qkv [capacity, 3C], merged [capacity, C] and one ThreadScratch per thread a forward may
// use (see threads.hpp). A Workspace is used by one forward at a time: give each calling thread
// its own (weights can be shared); the threads a forward starts itself work in their own slots.
// The buffers are public so that the steps can be run one by one (and inspected); their sizes are
// the Workspace's business: grow them with reserve(), never resize them directly.
template <class T>
class Workspace {
 public:
  // Room for forwards over up to max_tokens tokens that attend to up to max_keys positions (cached
  // ones included; default max_tokens, enough without a KV cache), on up to num_threads() threads.
  // For decoding through a cache: Workspace(config, 1, cache.capacity()).
  explicit Workspace(const AttentionConfig& config, Index max_tokens = 0, Index max_keys = -1)
      : config_(config) {
    config_.validate();
    reserve(max_tokens, max_keys);
  }

  // Moving leaves the source empty (capacity 0) and still usable: it grows again on demand.
  Workspace(Workspace&& other) noexcept : config_(other.config_) { swap(other); }
  Workspace& operator=(Workspace&& other) noexcept {
    if (&other != this) {
      Workspace moved(std::move(other));
      swap(moved);
    }
    return *this;
  }
  // Exchanges every buffer, the config and the capacities with `other` (no allocation, no copy).
  void swap(Workspace& other) noexcept {
    qkv.swap(other.qkv);
    merged.swap(other.merged);
    threads.swap(other.threads);
    std::swap(config_, other.config_);
    std::swap(capacity_, other.capacity_);
    std::swap(key_capacity_, other.key_capacity_);
    std::swap(probabilities_, other.probabilities_);
    partials_.swap(other.partials_);
    std::swap(partials_size_, other.partials_size_);
    qkv_pages_.swap(other.qkv_pages_);
  }

  // The n_embd and n_head the buffers are shaped for (the weights' heads).
  const AttentionConfig& config() const { return config_; }
  Index capacity() const { return capacity_; }          // tokens per forward
  Index key_capacity() const { return key_capacity_; }  // positions attended to
  Index thread_capacity() const { return static_cast<Index>(threads.size()); }

  // Bytes of all the buffers held (what a forward needs beyond its inputs, outputs and cache).
  Index bytes() const {
    Index total = (qkv.storage_size() + merged.storage_size() + partials_size_) *
                  static_cast<Index>(sizeof(T));
    for (const ThreadScratch<T>& t : threads) total += t.bytes();
    return total;
  }

  // Grows the buffers to hold max_tokens tokens attending to max_keys positions (default
  // max_tokens) on n_threads threads (default num_threads()). Allocates only when one of them is
  // above the current capacity. Strong guarantee: everything is allocated before anything is
  // replaced, so if an allocation throws the workspace is unchanged and still usable.
  void reserve(Index max_tokens, Index max_keys = -1, int n_threads = num_threads()) {
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
    if (n_threads < 1)
      throw ConfigError("threads: expected a count of at least 1, got " +
                        std::to_string(n_threads));
    // the calling thread's worker team, which the forwards run on (detail/parallel.hpp)
    detail::start_worker_team(n_threads);
    const Index want_threads = std::max<Index>(n_threads, thread_capacity());
    if (max_tokens <= capacity_ && max_keys <= key_capacity_ && want_threads == thread_capacity())
      return;
    max_tokens = std::max(max_tokens, capacity_);
    max_keys = std::max(max_keys, key_capacity_);
    const Index C = config_.n_embd, hd = config_.head_dim();
    detail::AlignedMatrix<T> grown_qkv(max_tokens, 3 * C, detail::RowStride::odd_lines),
        grown_merged(max_tokens, C, detail::RowStride::odd_lines);
    // a decode step split over threads: every head's per-block partials of its one row
    const Index want_partials = config_.n_head *
                                ((max_keys + kernels::kKeyBlock - 1) / kernels::kKeyBlock) *
                                kernels::partial_stride(hd);
    std::unique_ptr<T, AlignedDelete> grown_partials;
    if (want_partials > partials_size_)
      grown_partials.reset(static_cast<T*>(::operator new(
          static_cast<std::size_t>(want_partials) * sizeof(T), std::align_val_t(64))));
    std::vector<ThreadScratch<T>> grown_threads(static_cast<std::size_t>(want_threads));
    for (ThreadScratch<T>& t : grown_threads) {
      t.attention.reserve(max_keys, hd);
      if (probabilities_) t.attention.reserve_probabilities(max_keys, hd);
      t.gemm.reserve(max_tokens, 3 * C, C);  // the larger of the two projections
    }
    std::vector<const T*> grown_pages(2 * static_cast<std::size_t>(config_.n_head));
    qkv.swap(grown_qkv);
    merged.swap(grown_merged);
    threads.swap(grown_threads);
    qkv_pages_.swap(grown_pages);
    if (grown_partials) {
      partials_.swap(grown_partials);
      partials_size_ = want_partials;
    }
    capacity_ = max_tokens;
    key_capacity_ = max_keys;
  }

  // Room for forwards that also write the attention probabilities: their score rows on every
  // thread, kept from then on (reserve() grows them too). A forward with probabilities calls it, so
  // the first one allocates; call it up front for allocation-free forwards with probabilities.
  void reserve_probabilities() {
    for (ThreadScratch<T>& t : threads)
      t.attention.reserve_probabilities(key_capacity_, config_.head_dim());
    probabilities_ = true;
  }

  // The partials buffer of a decode step split over threads: n_head x ceil(key_capacity / 64)
  // blocks of kernels::partial_stride(head_dim) scalars, 64-byte aligned.
  T* partials() { return partials_.get(); }
  Index partials_size() const { return partials_size_; }

  // Page tables of the keys and values of the rows in qkv (a forward without a cache reads them
  // there): head h's key page at 2h, its value page at 2h + 1.
  std::vector<const T*>& qkv_pages() { return qkv_pages_; }

  // 64-byte aligned (detail/aligned_matrix.hpp), rows an odd number of cache lines apart
  // (RowStride::odd_lines: a head's rows then spread over every set of the caches); views as a
  // RowMatrix's with an outer stride: qkv.topRows(T), qkv.data(), qkv.rows(), qkv.outerStride()
  detail::AlignedMatrix<T> qkv;     // [capacity, 3C]
  detail::AlignedMatrix<T> merged;  // [capacity, C]
  std::vector<ThreadScratch<T>> threads;  // [thread_capacity]: thread t of a forward uses threads[t]

 private:
  struct AlignedDelete {
    void operator()(T* p) const { ::operator delete(p, std::align_val_t(64)); }
  };
  AttentionConfig config_;
  Index capacity_ = 0;
  Index key_capacity_ = 0;
  bool probabilities_ = false;  // reserve_probabilities() was called
  std::unique_ptr<T, AlignedDelete> partials_;
  Index partials_size_ = 0;
  std::vector<const T*> qkv_pages_;
};

}  // namespace gpt2

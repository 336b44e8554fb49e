// Workspace<T>: all the scratch of attention_forward, allocated once and reused, so repeated
// forwards over at most capacity() tokens allocate nothing.
#pragma once

#include <algorithm>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "gpt2/causal_attention.hpp"
#include "gpt2/config.hpp"
#include "gpt2/detail/aligned_matrix.hpp"
#include "gpt2/gemm.hpp"
#include "gpt2/parallel.hpp"
#include "gpt2/threads.hpp"
#include "gpt2/types.hpp"

namespace gpt2 {

// The scratch one thread of a forward works in: an attention score tile with its packing
// buffers, and the packing buffers of its share of the projections.
template <class T>
struct ThreadScratch {
  AttentionScratch<T> attention;
  GemmScratch<T> gemm;
  // Keys then values of a bf16 KV cache widened to T (incremental_bf16.hpp): [2 * rows, head_dim],
  // and the page tables that point the fused core at them. Empty until such a forward runs.
  RowMatrix<T> kv_widened;
  std::vector<const T*> key_pages, value_pages;

  // Room for `rows` widened keys and values of width head_dim, and page tables of n_pages entries.
  void reserve_kv_widened(Index rows, Index head_dim, Index n_pages) {
    if (kv_widened.rows() < 2 * rows || kv_widened.cols() != head_dim) {
      RowMatrix<T> grown(2 * rows, head_dim);
      kv_widened.swap(grown);
    }
    if (static_cast<Index>(key_pages.size()) < n_pages) {
      key_pages.resize(static_cast<std::size_t>(n_pages));
      value_pages.resize(static_cast<std::size_t>(n_pages));
    }
  }

  Index bytes() const {
    return attention.bytes() + gemm.bytes() +
           (kv_widened.size() * static_cast<Index>(sizeof(T))) +
           static_cast<Index>((key_pages.size() + value_pages.size()) * sizeof(const T*));
  }
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
  Workspace(Workspace&& other) noexcept
      : qkv(std::move(other.qkv)),
        merged(std::move(other.merged)),
        threads(std::move(other.threads)),
        config_(other.config_),
        capacity_(std::exchange(other.capacity_, 0)),
        key_capacity_(std::exchange(other.key_capacity_, 0)),
        probabilities_(std::exchange(other.probabilities_, false)),
        partials_(std::move(other.partials_)),
        partials_size_(std::exchange(other.partials_size_, 0)) {
    other.threads.clear();
  }
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
  }

  // The n_embd and n_head the buffers are shaped for (must match the weights of a forward).
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
  // above the current capacity.
  // Strong guarantee: everything is allocated before anything is replaced, so if an allocation
  // throws (std::bad_alloc) the workspace is unchanged and still usable.
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
    // the calling thread's worker team, which its multi-threaded decode steps run on (parallel.hpp)
    detail::start_worker_team(n_threads);
    const Index want_threads = std::max<Index>(n_threads, thread_capacity());
    if (max_tokens <= capacity_ && max_keys <= key_capacity_ && want_threads == thread_capacity())
      return;
    max_tokens = std::max(max_tokens, capacity_);
    max_keys = std::max(max_keys, key_capacity_);
    const Index C = config_.n_embd;
    detail::AlignedMatrix<T> grown_qkv(max_tokens, 3 * C, detail::RowStride::odd_lines),
        grown_merged(max_tokens, C, detail::RowStride::odd_lines);
    // a decode step split over threads: every head's per-block partials of its one row
    const Index want_partials = config_.n_head *
                                ((max_keys + kernels::kKeyBlock - 1) / kernels::kKeyBlock) *
                                kernels::partial_stride(config_.head_dim());
    std::unique_ptr<T, AlignedDelete> grown_partials;
    if (want_partials > partials_size_)
      grown_partials.reset(static_cast<T*>(::operator new(
          static_cast<std::size_t>(want_partials) * sizeof(T), std::align_val_t(64))));
    std::vector<ThreadScratch<T>> grown_threads(static_cast<std::size_t>(want_threads));
    for (ThreadScratch<T>& t : grown_threads) {
      t.attention.reserve(max_keys, config_.head_dim());
      if (probabilities_) t.attention.reserve_probabilities(max_keys, config_.head_dim());
      t.gemm.reserve(max_tokens, 3 * C, C);  // the larger of the two projections
    }
    qkv.swap(grown_qkv);
    merged.swap(grown_merged);
    threads.swap(grown_threads);
    if (grown_partials) {
      partials_.swap(grown_partials);
      partials_size_ = want_partials;
    }
    capacity_ = max_tokens;
    key_capacity_ = max_keys;
  }

  // Room for forwards that also write the attention probabilities: the probabilities' score tile
  // ([kAttentionRowBlock, key_capacity()] and packing buffers) on every thread, kept from then on
  // (reserve() grows it too). A forward with probabilities calls it, so the first one allocates;
  // call it up front for allocation-free forwards with probabilities. Without it the per-thread
  // scratch does not depend on the number of keys.
  void reserve_probabilities() {
    for (ThreadScratch<T>& t : threads)
      t.attention.reserve_probabilities(key_capacity_, config_.head_dim());
    probabilities_ = true;
  }

  // The partials buffer of a decode step split over threads: n_head x ceil(key_capacity / 64)
  // blocks of kernels::partial_stride(head_dim) scalars, 64-byte aligned.
  T* partials() { return partials_.get(); }
  Index partials_size() const { return partials_size_; }

  // 64-byte aligned (detail/aligned_matrix.hpp: rows of 3C or C floats start on a cache line when
  // C is a multiple of 16), rows an odd number of cache lines apart (RowStride::odd_lines: so that
  // a head's rows spread over every set of the caches); views as a RowMatrix's with an outer
  // stride: qkv.topRows(T), qkv.data(), qkv.rows(), qkv.outerStride()
  detail::AlignedMatrix<T> qkv;     // [capacity, 3C]
  detail::AlignedMatrix<T> merged;  // [capacity, C]
  std::vector<ThreadScratch<T>> threads;  // [thread_capacity]: thread t of a forward uses threads[t]

 private:
  AttentionConfig config_;
  Index capacity_ = 0;
  Index key_capacity_ = 0;
  bool probabilities_ = false;  // reserve_probabilities() was called
  struct AlignedDelete {
    void operator()(T* p) const { ::operator delete(p, std::align_val_t(64)); }
  };
  std::unique_ptr<T, AlignedDelete> partials_;
  Index partials_size_ = 0;
};

}  // namespace gpt2

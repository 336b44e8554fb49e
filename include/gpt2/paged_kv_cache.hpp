// Paged KV cache: the keys and values of many sequences in one pool of fixed-size blocks, so that
// sequences forked from a common prompt share its blocks instead of copying them (vLLM's paged
// attention, for a CPU).
//
// S, the storage type, is float, double, bfloat16 or int8 (kv_cache.hpp): a bf16 pool holds keys
// and values rounded to bf16, for float forwards, as KVCache<bfloat16> does; an int8 pool holds
// them quantized per (position, head) row, as KVCache<int8> does, with the rows' float32 scales
// paged like the rows (layer l's scale storage [n_blocks * n_head, block_rows]: row b * n_head +
// h holds head h's scales of block b's positions).
//
//   KVBlockPool<S> pool(config, n_blocks, n_layers)   n_blocks blocks of block_rows() positions,
//       allocated once. Block b holds, in every layer, every head's keys and values of its
//       positions: layer l's storage rows (b * n_head + h) * block_rows + r, r < block_rows, are
//       head h's keys (values) of the block's r-th position [block_rows, head_dim], contiguous.
//   PagedSequence<S> seq(pool)   a block table (block ids, one per block_rows positions) and a
//       length. The one table serves every layer: position p of layer l is block table[p /
//       block_rows], row p % block_rows, in layer l's storage (a 12-layer model keeps one table
//       per sequence, each layer's data at the same block ids).
//   seq.fork()      a sequence sharing every block of seq (reference counts; no data copied)
//   seq.grow(n)     room for positions length .. length + n - 1 in every layer: new blocks, and a
//                   shared, partly filled last block copied first (copy-on-write), so the blocks
//                   the new positions go to belong to seq alone. CapacityError (every sequence and
//                   the pool unchanged) when the pool has too few free blocks.
//   seq.write_last(l, k, v)   layer l's keys and values of the last k.rows() positions
//   seq.truncate(n), seq.release(), ~PagedSequence: blocks no sequence holds any more go back
//
// Both model the cache concept of kv_cache.hpp: a PagedSequence of a one-layer pool (a forward
// grows it by its new rows), and PagedLayer (one layer of a sequence already grown for the step).
//
// Block size: kKVBlockRows = 16 positions, the smallest page the fused core takes (HeadPages):
// a sequence leaves at most 15 positions of its last block unused, and a copy-on-write copies at
// most 15 positions (per layer, 2 * 15 * n_embd elements); a head's page is 16 * head_dim
// contiguous elements, long enough to stream (docs/paged-kv-cache.md).
//
// Threads (see docs/paged-kv-cache.md):
//   - The pool's bookkeeping (free list, reference counts) is behind one mutex: grow, fork,
//     truncate and release of different sequences may run on different threads at once.
//   - A sequence is used by one thread at a time (like a KVCache): its grow, write_last,
//     truncate, release and forwards must not overlap each other, nor a fork of it.
//   - Forking only reads the parent: several threads may fork one sequence at once (each its own
//     child) while nobody grows, writes or forwards that parent.
//   - Blocks are written only by a sequence that holds them alone (grow makes sure of it; a write
//     into a shared block is refused), and a shared block is never written: threads decoding
//     sequences that share a prompt read its blocks at once without a data race.
//   - Fork a sequence between steps, not between grow() and the layers' write_last/forwards of
//     that step (the child would share the block the parent then writes: refused, ShapeError).
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "gpt2/batch.hpp"
#include "gpt2/config.hpp"
#include "gpt2/detail/aligned_matrix.hpp"
#include "gpt2/detail/compiled_mode.hpp"
#include "gpt2/error.hpp"
#include "gpt2/kv_cache.hpp"
#include "gpt2/sublayer.hpp"
#include "gpt2/types.hpp"

namespace gpt2 {

// Positions per block (see above).
inline constexpr Index kKVBlockRows = 16;

template <class S>
class PagedSequence;

// A pool of n_blocks blocks of block_rows positions, for n_layers layers of one model (each layer
// its own storage, the same block ids). Allocates only in its constructor. Thread-safe
// bookkeeping (see the header comment); outlives every sequence made from it; neither copied nor
// moved (sequences point at it).
template <class S>
class KVBlockPool {
 public:
  using Scalar = typename detail::KVStorageTraits<S>::Scalar;
  using Element = typename detail::KVStorageTraits<S>::Element;
  // Whether each row has a float32 scale (int8).
  static constexpr bool kScaled = detail::KVStorageTraits<S>::kScaled;

  // n_blocks * n_layers * 2 * block_rows * n_embd elements (and for int8 as many scales per
  // block_rows * head_dim elements), zeroed. block_rows: a positive
  // multiple of 16 (the attention core's page granularity).
  KVBlockPool(const AttentionConfig& config, Index n_blocks, Index n_layers = 1,
              Index block_rows = kKVBlockRows)
      : config_(config), n_blocks_(n_blocks), n_layers_(n_layers), block_rows_(block_rows) {
    config_.validate();
    if (n_blocks < 0 || n_blocks > std::numeric_limits<std::int32_t>::max())
      throw ShapeError("n_blocks: expected a count in [0, " +
                       std::to_string(std::numeric_limits<std::int32_t>::max()) + "], got " +
                       std::to_string(n_blocks));
    if (n_layers < 1)
      throw ShapeError("n_layers: expected a count of at least 1, got " + std::to_string(n_layers));
    if (block_rows < 16 || block_rows % 16 != 0)
      throw ShapeError("block_rows: expected a positive multiple of 16, got " +
                       std::to_string(block_rows));
    if (n_blocks > std::numeric_limits<Index>::max() / (block_rows * config_.n_embd))
      throw CapacityError("KV block pool: " + std::to_string(n_blocks) + " blocks of " +
                          std::to_string(block_rows) + " positions of n_embd " +
                          std::to_string(config_.n_embd) + " overflow the index type");
    const Index rows = n_blocks * config_.n_head * block_rows, hd = config_.head_dim();
    keys_.reserve(static_cast<std::size_t>(n_layers));
    values_.reserve(static_cast<std::size_t>(n_layers));
    for (Index l = 0; l < n_layers; ++l) {
      keys_.emplace_back(rows, hd);
      keys_.back().setZero();
      values_.emplace_back(rows, hd);
      values_.back().setZero();
      if constexpr (kScaled) {
        key_scales_.emplace_back(n_blocks * config_.n_head, block_rows);
        key_scales_.back().setZero();
        value_scales_.emplace_back(n_blocks * config_.n_head, block_rows);
        value_scales_.back().setZero();
      }
    }
    refs_.reset(new std::atomic<std::int32_t>[static_cast<std::size_t>(n_blocks)]);
    cowed_.assign(static_cast<std::size_t>(n_blocks), 0);
    free_.reserve(static_cast<std::size_t>(n_blocks));
    for (Index b = n_blocks; b-- > 0;) {  // popped from the back: block 0 first
      refs_[static_cast<std::size_t>(b)].store(0, std::memory_order_relaxed);
      free_.push_back(static_cast<std::int32_t>(b));
    }
  }

  KVBlockPool(const KVBlockPool&) = delete;
  KVBlockPool& operator=(const KVBlockPool&) = delete;

  const AttentionConfig& config() const { return config_; }
  Index n_blocks() const { return n_blocks_; }    // capacity, in blocks
  Index n_layers() const { return n_layers_; }
  Index block_rows() const { return block_rows_; }  // positions per block
  // Bytes of one block in one layer (keys and values of every head): 2 * block_rows * n_embd
  // elements, and for int8 their 2 * block_rows * n_head float32 scales.
  Index block_bytes() const {
    return 2 * block_rows_ * config_.n_embd * static_cast<Index>(sizeof(Element)) +
           (kScaled ? 2 * block_rows_ * config_.n_head * static_cast<Index>(sizeof(float)) : 0);
  }
  // Bytes of the whole pool (every layer's storage, allocated in full by the constructor).
  Index bytes() const { return n_blocks_ * n_layers_ * block_bytes(); }

  // Blocks held by at least one sequence, and free ones (a snapshot: other threads may change it).
  Index used_blocks() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return n_blocks_ - static_cast<Index>(free_.size());
  }
  Index free_blocks() const { return n_blocks_ - used_blocks(); }
  // Bytes of the blocks in use, every layer: used_blocks() * n_layers * block_bytes().
  Index used_bytes() const { return used_blocks() * n_layers_ * block_bytes(); }
  // How many sequences hold block b (0: free). A snapshot, for inspection and tests.
  std::int32_t references(Index b) const {
    check_block(b);
    return refs_[static_cast<std::size_t>(b)].load(std::memory_order_relaxed);
  }

  // Head h's rows of block b in layer l: keys (values) [block_rows, head_dim], contiguous.
  const Element* key_page(Index layer, Index b, Index h) const {
    return keys_[static_cast<std::size_t>(layer)].data() + page_offset(b, h);
  }
  const Element* value_page(Index layer, Index b, Index h) const {
    return values_[static_cast<std::size_t>(layer)].data() + page_offset(b, h);
  }
  // An int8 pool's scales of those rows: [block_rows] each.
  const float* key_scale_page(Index layer, Index b, Index h) const {
    return scale_page(key_scales_, layer, b, h);
  }
  const float* value_scale_page(Index layer, Index b, Index h) const {
    return scale_page(value_scales_, layer, b, h);
  }
  // Layer l's whole key (value) storage [n_blocks * n_head * block_rows, head_dim]: for overlap
  // checks and inspection.
  ConstMatrixRef<Element> key_storage(Index layer) const { return keys_[check_layer(layer)].map(); }
  ConstMatrixRef<Element> value_storage(Index layer) const {
    return values_[check_layer(layer)].map();
  }
  // An int8 pool's scale storage of a layer [n_blocks * n_head, block_rows] (empty for the others).
  ConstMatrixRef<float> key_scale_storage(Index layer) const {
    return kScaled ? key_scales_[check_layer(layer)].map() : empty_scales_.map();
  }
  ConstMatrixRef<float> value_scale_storage(Index layer) const {
    return kScaled ? value_scales_[check_layer(layer)].map() : empty_scales_.map();
  }

  // Grows sequences seqs[0 .. n) by counts[i] positions each, all or nothing: CapacityError (no
  // sequence and no block changed) unless the free blocks cover every new block and every
  // copy-on-write. seq.grow(n) is this for one sequence; the batched forwards call it for the
  // batch. The sequences must be distinct and made from this pool.
  void grow(PagedSequence<S>* const* seqs, const Index* counts, Index n) {
    grow_each(n, [&](Index i) -> PagedSequence<S>& { return *seqs[i]; },
              [&](Index i) { return counts[i]; });
  }
  // Same, sequence i being seq_at(i) (a PagedSequence<S>&) and its count count_at(i).
  template <class SeqAt, class CountAt>
  void grow_each(Index n, const SeqAt& seq_at, const CountAt& count_at);

 private:
  friend class PagedSequence<S>;

  Index page_offset(Index b, Index h) const {
    return (b * config_.n_head + h) * block_rows_ * config_.head_dim();
  }
  // Where head h's scales of block b start in a layer's scale storage (int8).
  Index scale_offset(Index b, Index h) const {
    return (b * config_.n_head + h) * key_scales_.front().outerStride();
  }
  const float* scale_page(const std::vector<detail::AlignedMatrix<float>>& scales, Index layer,
                          Index b, Index h) const {
    return scales[static_cast<std::size_t>(layer)].data() + scale_offset(b, h);
  }
  float* scale_page(std::vector<detail::AlignedMatrix<float>>& scales, Index layer, Index b,
                    Index h) {
    return scales[static_cast<std::size_t>(layer)].data() + scale_offset(b, h);
  }
  std::size_t check_layer(Index layer) const {
    if (layer < 0 || layer >= n_layers_)
      throw ShapeError("layer: expected an index in [0, " + std::to_string(n_layers_) +
                       "), got " + std::to_string(layer));
    return static_cast<std::size_t>(layer);
  }
  void check_block(Index b) const {
    if (b < 0 || b >= n_blocks_)
      throw ShapeError("block: expected an id in [0, " + std::to_string(n_blocks_) + "), got " +
                       std::to_string(b));
  }
  std::atomic<std::int32_t>& ref(std::int32_t b) const { return refs_[static_cast<std::size_t>(b)]; }
  // With the mutex held: a free block, now held once.
  std::int32_t take_block() {
    const std::int32_t b = free_.back();
    free_.pop_back();
    ref(b).store(1, std::memory_order_relaxed);
    return b;
  }
  // With the mutex held: one reference to b fewer; free when none is left.
  void drop_block(std::int32_t b) {
    if (ref(b).fetch_sub(1, std::memory_order_relaxed) == 1) free_.push_back(b);
  }
  // With the mutex held: the first `rows` positions of block `from` copied to block `to`, every
  // layer and head.
  void copy_block(std::int32_t from, std::int32_t to, Index rows) {
    const Index hd = config_.head_dim();
    const std::size_t count = static_cast<std::size_t>(rows * hd) * sizeof(Element);
    for (Index l = 0; l < n_layers_; ++l)
      for (Index h = 0; h < config_.n_head; ++h) {
        const std::size_t li = static_cast<std::size_t>(l);
        std::memcpy(keys_[li].data() + page_offset(to, h), keys_[li].data() + page_offset(from, h),
                    count);
        std::memcpy(values_[li].data() + page_offset(to, h),
                    values_[li].data() + page_offset(from, h), count);
        if constexpr (kScaled) {
          const std::size_t scales = static_cast<std::size_t>(rows) * sizeof(float);
          std::memcpy(scale_page(key_scales_, l, to, h), scale_page(key_scales_, l, from, h), scales);
          std::memcpy(scale_page(value_scales_, l, to, h), scale_page(value_scales_, l, from, h),
                      scales);
        }
      }
  }

  AttentionConfig config_;
  Index n_blocks_, n_layers_, block_rows_;
  // per layer [n_blocks * n_head * block_rows, head_dim], 64-byte aligned
  std::vector<detail::AlignedMatrix<Element>> keys_, values_;
  // int8: per layer [n_blocks * n_head, block_rows] (empty vectors for the others)
  std::vector<detail::AlignedMatrix<float>> key_scales_, value_scales_;
  detail::AlignedMatrix<float> empty_scales_;
  // Reference counts: changed only with mutex_ held; atomic so that a sequence may read the count
  // of a block it holds alone (write_last's check) while other threads change other counts.
  std::unique_ptr<std::atomic<std::int32_t>[]> refs_;
  std::vector<std::int32_t> cowed_;  // grow's scratch (mutex_): copies planned per block
  std::vector<std::int32_t> free_;   // free block ids (a stack)
  mutable std::mutex mutex_;
};

// One sequence's block table into a KVBlockPool and its length (positions it holds, in every
// layer). Movable (the source is left empty), not copyable: fork() is the explicit share. Used by
// one thread at a time (see the header comment). Releases its blocks when destroyed.
template <class S>
class PagedSequence {
 public:
  using Storage = S;
  using Scalar = typename detail::KVStorageTraits<S>::Scalar;
  using Element = typename detail::KVStorageTraits<S>::Element;

  // An empty sequence of `pool` (which must outlive it). max_tokens: room reserved in the block
  // table for that many positions, so that growing up to it allocates nothing.
  explicit PagedSequence(KVBlockPool<S>& pool, Index max_tokens = 0) : pool_(&pool) {
    reserve(max_tokens);
  }
  ~PagedSequence() { release(); }

  PagedSequence(const PagedSequence&) = delete;
  PagedSequence& operator=(const PagedSequence&) = delete;
  PagedSequence(PagedSequence&& other) noexcept
      : pool_(other.pool_),
        table_(std::move(other.table_)),
        length_(std::exchange(other.length_, 0)),
        pages_(std::move(other.pages_)),
        scale_pages_(std::move(other.scale_pages_)) {
    other.table_.clear();
  }
  PagedSequence& operator=(PagedSequence&& other) noexcept {
    if (&other != this) {
      release();
      pool_ = other.pool_;
      table_ = std::move(other.table_);
      other.table_.clear();
      length_ = std::exchange(other.length_, 0);
      pages_ = std::move(other.pages_);
      scale_pages_ = std::move(other.scale_pages_);
    }
    return *this;
  }

  KVBlockPool<S>& pool() const { return *pool_; }
  const AttentionConfig& config() const { return pool_->config(); }
  Index length() const { return length_; }  // positions held (the n_past of the next forward)
  // Block ids, one per block_rows positions: position p is in block table()[p / block_rows].
  const std::vector<std::int32_t>& table() const { return table_; }
  Index blocks_for(Index positions) const {
    return (positions + pool_->block_rows() - 1) / pool_->block_rows();
  }

  // Room in the block table (and the page lists of the forwards) for max_tokens positions.
  void reserve(Index max_tokens) {
    if (max_tokens < 0)
      throw ShapeError("max_tokens: expected a non-negative count, got " +
                       std::to_string(max_tokens));
    const std::size_t blocks = static_cast<std::size_t>(blocks_for(max_tokens));
    table_.reserve(blocks);
    pages_.reserve(2 * static_cast<std::size_t>(config().n_head) * blocks);
    if constexpr (KVBlockPool<S>::kScaled)
      scale_pages_.reserve(2 * static_cast<std::size_t>(config().n_head) * blocks);
  }

  // A new sequence holding the same positions, sharing every block (their reference counts go up;
  // no data copied). Allocates the child's table only.
  PagedSequence fork() const {
    PagedSequence child(*pool_);
    child.table_.reserve(table_.capacity());
    child.pages_.reserve(pages_.capacity());
    child.scale_pages_.reserve(scale_pages_.capacity());
    child.table_ = table_;
    std::lock_guard<std::mutex> lock(pool_->mutex_);
    for (const std::int32_t b : table_) pool_->ref(b).fetch_add(1, std::memory_order_relaxed);
    child.length_ = length_;
    return child;
  }

  // Room for positions length() .. length() + n - 1 in every layer (their keys and values are
  // then written by write_last or a forward of each layer). CapacityError, nothing changed, when
  // the pool is short of blocks.
  void grow(Index n) {
    PagedSequence* self = this;
    pool_->grow(&self, &n, 1);
  }

  // Keeps the first n positions (0 <= n <= length()); blocks no longer needed are given back.
  void truncate(Index n) {
    if (n < 0 || n > length_)
      throw ShapeError("truncate: expected a length in [0, " + std::to_string(length_) +
                       "] (the positions held), got " + std::to_string(n));
    const std::size_t keep = static_cast<std::size_t>(blocks_for(n));
    if (keep < table_.size()) {
      std::lock_guard<std::mutex> lock(pool_->mutex_);
      for (std::size_t i = keep; i < table_.size(); ++i) pool_->drop_block(table_[i]);
    }
    table_.resize(keep);
    length_ = n;
  }

  // Gives every block back (the sequence is then empty, still usable).
  void release() {
    if (pool_ == nullptr || table_.empty()) {
      length_ = 0;
      return;
    }
    {
      std::lock_guard<std::mutex> lock(pool_->mutex_);
      for (const std::int32_t b : table_) pool_->drop_block(b);
    }
    table_.clear();
    length_ = 0;
  }

  // Writes layer `layer`'s keys and values of the last n positions, length() - n .. length() - 1:
  //   k, v [n, C]: every head's rows side by side, head h at columns h*head_dim (the k and v
  //   blocks of a qkv matrix: qkv.middleCols(C, C), qkv.middleCols(2 * C, C)).
  // ShapeError for a bad shape, n > length(), or a block of those positions shared with another
  // sequence (a fork between grow() and this write). Allocates nothing.
  template <class DK, class DV>
  void write_last(Index layer, const Eigen::MatrixBase<DK>& k_in, const Eigen::MatrixBase<DV>& v_in) {
    const ConstMatrixRef<Scalar> k = detail::as_view<Scalar>(k_in);
    const ConstMatrixRef<Scalar> v = detail::as_view<Scalar>(v_in);
    check_write(layer, k, v);
    for (Index h = 0; h < config().n_head; ++h) write_head_rows(layer, h, length_ - k.rows(), k, v);
  }

  // ShapeError unless the last n positions (n <= length()) lie in blocks this sequence holds
  // alone, i.e. may be written (they do after grow(), unless the sequence was forked since).
  void check_last_writable(Index n) const {
    if (n < 0 || n > length_)
      throw ShapeError("k: expected at most " + std::to_string(length_) +
                       " rows (the positions held; grow() first), got " + std::to_string(n));
    if (n == 0) return;
    for (Index i = (length_ - n) / pool_->block_rows(); i < blocks_for(length_); ++i) {
      const std::int32_t b = table_[static_cast<std::size_t>(i)];
      const std::int32_t refs = pool_->ref(b).load(std::memory_order_relaxed);
      if (refs != 1)
        throw ShapeError("paged sequence: positions " + std::to_string(length_ - n) + " .. " +
                         std::to_string(length_ - 1) + " lie in block " + std::to_string(b) +
                         ", shared by " + std::to_string(refs) +
                         " sequences (fork between grow() and the layers' writes?)");
    }
  }

  // For a one-layer pool, as KVCache::append: grow(n), then write_last(0, k, v). CapacityError
  // (nothing changed) when the blocks do not fit.
  template <class DK, class DV>
  void append(const Eigen::MatrixBase<DK>& k_in, const Eigen::MatrixBase<DV>& v_in) {
    const ConstMatrixRef<Scalar> k = detail::as_view<Scalar>(k_in);
    const ConstMatrixRef<Scalar> v = detail::as_view<Scalar>(v_in);
    if (pool_->n_layers() != 1)
      throw ConfigError("append: expected a one-layer pool, got " +
                        std::to_string(pool_->n_layers()) +
                        " layers (grow() once, then write_last() each layer)");
    const Index C = config().n_embd;
    detail::check_shape("k", {k.rows(), C}, {k.rows(), k.cols()});
    detail::check_shape("v", {k.rows(), C}, {v.rows(), v.cols()});
    grow(k.rows());
    for (Index h = 0; h < config().n_head; ++h) write_head_rows(0, h, length_ - k.rows(), k, v);
  }

  // Head h's key (value) row of a position in a layer: head_dim contiguous elements in the pool.
  const Element* key_row(Index layer, Index h, Index position) const {
    return pool_->key_page(check_layer(layer), page_of(position), check_head(h)) +
           position % pool_->block_rows() * config().head_dim();
  }
  const Element* value_row(Index layer, Index h, Index position) const {
    return pool_->value_page(check_layer(layer), page_of(position), check_head(h)) +
           position % pool_->block_rows() * config().head_dim();
  }
  // An int8 sequence's scale of that key (value) row: the row stands for float(q) * scale.
  float key_scale(Index layer, Index h, Index position) const {
    static_assert(KVBlockPool<S>::kScaled, "gpt2: only an int8 pool has scales");
    return pool_->key_scale_page(check_layer(layer), page_of(position), check_head(h))
        [position % pool_->block_rows()];
  }
  float value_scale(Index layer, Index h, Index position) const {
    static_assert(KVBlockPool<S>::kScaled, "gpt2: only an int8 pool has scales");
    return pool_->value_scale_page(check_layer(layer), page_of(position), check_head(h))
        [position % pool_->block_rows()];
  }

  // Copies of head h's keys (values) [length, head_dim] in a layer, gathered from the blocks: an
  // explicit, allocating copy for inspection and tests (the forwards read the blocks in place).
  RowMatrix<Element> copy_keys(Index layer, Index h) const { return gather(layer, h, true); }
  RowMatrix<Element> copy_values(Index layer, Index h) const { return gather(layer, h, false); }

  // The page lists of a layer, as the attention core reads them (HeadPages): for head h,
  // pages()[2 h * n] .. are the n = table().size() key pages, pages()[(2 h + 1) n] .. the value
  // pages. Filled by fill_pages(layer) (no allocation when reserve() covered the length).
  // An int8 sequence's scale pages are listed likewise in scale_pages().
  const std::vector<const Element*>& pages() const { return pages_; }
  const std::vector<const float*>& scale_pages() const { return scale_pages_; }
  void fill_pages(Index layer) {
    check_layer(layer);
    const std::size_t n = table_.size(), H = static_cast<std::size_t>(config().n_head);
    pages_.resize(2 * H * n);
    if constexpr (KVBlockPool<S>::kScaled) scale_pages_.resize(2 * H * n);
    for (std::size_t h = 0; h < H; ++h)
      for (std::size_t i = 0; i < n; ++i) {
        pages_[2 * h * n + i] = pool_->key_page(layer, table_[i], static_cast<Index>(h));
        pages_[(2 * h + 1) * n + i] = pool_->value_page(layer, table_[i], static_cast<Index>(h));
        if constexpr (KVBlockPool<S>::kScaled) {
          scale_pages_[2 * h * n + i] =
              pool_->key_scale_page(layer, table_[i], static_cast<Index>(h));
          scale_pages_[(2 * h + 1) * n + i] =
              pool_->value_scale_page(layer, table_[i], static_cast<Index>(h));
        }
      }
  }

  // Head h's keys and values as the last fill_pages() listed them (length() positions).
  HeadPages<Element> head_pages(Index h) const {
    const Index n = static_cast<Index>(table_.size()), hd = config().head_dim();
    HeadPages<Element> kv;
    kv.key_pages = pages_.data() + 2 * h * n;
    kv.value_pages = pages_.data() + (2 * h + 1) * n;
    kv.page_rows = pool_->block_rows();
    kv.row_stride = hd;
    kv.n_keys = length_;
    kv.head_dim = hd;
    if constexpr (KVBlockPool<S>::kScaled) {
      kv.key_scale_pages = scale_pages_.data() + 2 * h * n;
      kv.value_scale_pages = scale_pages_.data() + (2 * h + 1) * n;
    }
    return kv;
  }

  // Writes head h's rows of positions p .. p + n - 1 of a layer from k, v [n, C] (positions held
  // alone: checked by the caller, as write_last checks).
  void write_head_rows(Index layer, Index h, Index p, const ConstMatrixRef<Scalar>& k,
                       const ConstMatrixRef<Scalar>& v) {
    const Index hd = config().head_dim(), br = pool_->block_rows();
    const std::size_t li = static_cast<std::size_t>(layer);
    for (Index i = 0; i < k.rows(); ++i) {
      const Index b = table_[static_cast<std::size_t>((p + i) / br)], r = (p + i) % br;
      const Index offset = pool_->page_offset(b, h) + r * hd;
      float* key_scale = nullptr;
      float* value_scale = nullptr;
      if constexpr (KVBlockPool<S>::kScaled) {
        key_scale = pool_->scale_page(pool_->key_scales_, layer, b, h) + r;
        value_scale = pool_->scale_page(pool_->value_scales_, layer, b, h) + r;
      }
      detail::put_row<S>(k.row(i).data() + h * hd, hd, pool_->keys_[li].data() + offset,
                         key_scale);
      detail::put_row<S>(v.row(i).data() + h * hd, hd, pool_->values_[li].data() + offset,
                         value_scale);
    }
  }

  // ---- the cache concept (kv_cache.hpp), for a one-layer pool: a forward grows the sequence ----
  static const char* label() { return "sequence"; }
  Index n_past() const { return length_; }
  void check_append(Index n) const {
    if (pool_->n_layers() != 1)
      throw ConfigError("sequence: expected a one-layer pool, got " +
                        std::to_string(pool_->n_layers()) +
                        " layers (grow() the sequence once per step, then run each layer with "
                        "attention_forward(w, x, seq, layer, ws, out))");
    if (n < 0) throw ShapeError("grow: expected a non-negative count, got " + std::to_string(n));
  }
  Index begin_append(Index n) {
    const Index p = length_;
    grow(n);  // CapacityError: nothing changed
    fill_pages(0);
    return p;
  }
  void rollback(Index p) { truncate(p); }
  void write_head(Index h, Index p, const ConstMatrixRef<Scalar>& k, const ConstMatrixRef<Scalar>& v) {
    write_head_rows(0, h, p, k, v);
  }
  template <class V>
  void check_disjoint(const char* what, const V& view) const {
    if (detail::overlaps(view, pool_->key_storage(0)) ||
        detail::overlaps(view, pool_->value_storage(0)) ||
        detail::overlaps(view, pool_->key_scale_storage(0)) ||
        detail::overlaps(view, pool_->value_scale_storage(0)))
      throw ShapeError(std::string(what) + ": must not overlap the KV block pool");
  }
  // Batched forwards grow their sequences together, all or nothing (KVBlockPool::grow_each): one
  // pool per batch, checked first.
  template <class SeqAt>
  static void check_batch(Index n, const SeqAt& seq_at) {
    for (Index i = 1; i < n; ++i)
      if (&seq_at(i).pool() != &seq_at(0).pool())
        throw ConfigError("batch sequence " + std::to_string(i) +
                          ": sequence: expected the pool of sequence 0 (one pool per batch)");
  }
  template <class SeqAt, class CountAt>
  static void begin_append_all(Index n, const SeqAt& seq_at, const CountAt& count_at) {
    if (n == 0) return;
    seq_at(0).pool().grow_each(n, seq_at, count_at);  // CapacityError: no sequence changed
    for (Index i = 0; i < n; ++i) seq_at(i).fill_pages(0);
  }

 private:
  friend class KVBlockPool<S>;

  Index check_layer(Index layer) const { return static_cast<Index>(pool_->check_layer(layer)); }
  Index check_head(Index h) const {
    if (h < 0 || h >= config().n_head)
      throw ShapeError("head: expected an index in [0, " + std::to_string(config().n_head) +
                       "), got " + std::to_string(h));
    return h;
  }
  Index page_of(Index position) const {
    if (position < 0 || position >= length_)
      throw ShapeError("position: expected an index in [0, " + std::to_string(length_) +
                       ") (the positions held), got " + std::to_string(position));
    return table_[static_cast<std::size_t>(position / pool_->block_rows())];
  }

  void check_write(Index layer, const ConstMatrixRef<Scalar>& k,
                   const ConstMatrixRef<Scalar>& v) const {
    const Index n = k.rows(), C = config().n_embd;
    check_layer(layer);
    detail::check_shape("k", {n, C}, {k.rows(), k.cols()});
    detail::check_shape("v", {n, C}, {v.rows(), v.cols()});
    check_last_writable(n);
  }

  RowMatrix<Element> gather(Index layer, Index h, bool keys) const {
    check_layer(layer);
    check_head(h);
    const Index hd = config().head_dim();
    RowMatrix<Element> m(length_, hd);
    for (Index p = 0; p < length_; ++p)
      m.row(p) = Eigen::Map<const RowVector<Element>>(
          keys ? key_row(layer, h, p) : value_row(layer, h, p), hd);
    return m;
  }

  KVBlockPool<S>* pool_;
  std::vector<std::int32_t> table_;  // blocks_for(length_) block ids
  Index length_ = 0;
  std::vector<const Element*> pages_;  // fill_pages' page lists
  std::vector<const float*> scale_pages_;  // int8: their scales' pages
};

template <class S>
template <class SeqAt, class CountAt>
void KVBlockPool<S>::grow_each(Index n, const SeqAt& seq_at, const CountAt& count_at) {
  for (Index i = 0; i < n; ++i) {
    if (count_at(i) < 0)
      throw ShapeError("grow: expected a non-negative count, got " + std::to_string(count_at(i)));
    if (seq_at(i).pool_ != this)
      throw ConfigError("grow: sequence " + std::to_string(i) + " belongs to another pool");
    if (seq_at(i).length_ > std::numeric_limits<Index>::max() / 2 - count_at(i))
      throw CapacityError("grow: " + std::to_string(count_at(i)) + " more positions overflow");
    // before the lock (may allocate; harmless if the growth is then refused)
    seq_at(i).table_.reserve(static_cast<std::size_t>(seq_at(i).blocks_for(seq_at(i).length_ + count_at(i))));
  }
  std::lock_guard<std::mutex> lock(mutex_);
  // Plan: blocks each sequence needs, and the copies-on-write. A partly filled last block held by
  // others is copied; when several of the batch hold it, each copy leaves one holder fewer (the
  // last holder writes in place): cowed_ counts the copies planned so far.
  Index need = 0;
  const auto copies = [&](const PagedSequence<S>& s, Index count) {
    if (count == 0 || s.length_ % block_rows_ == 0) return false;
    const std::int32_t last = s.table_.back();
    return ref(last).load(std::memory_order_relaxed) - cowed_[static_cast<std::size_t>(last)] > 1;
  };
  for (Index i = 0; i < n; ++i) {
    const PagedSequence<S>& s = seq_at(i);
    need += s.blocks_for(s.length_ + count_at(i)) - static_cast<Index>(s.table_.size());
    if (copies(s, count_at(i))) {
      ++need;
      ++cowed_[static_cast<std::size_t>(s.table_.back())];
    }
  }
  for (Index i = 0; i < n; ++i)
    if (!seq_at(i).table_.empty()) cowed_[static_cast<std::size_t>(seq_at(i).table_.back())] = 0;
  const Index free_now = static_cast<Index>(free_.size());
  if (need > free_now) {
    const std::string what =
        n == 1 ? "growing a sequence of " + std::to_string(seq_at(0).length_) + " positions by " +
                     std::to_string(count_at(0))
               : "growing " + std::to_string(n) + " sequences";
    throw CapacityError("KV block pool: " + what + " needs " + std::to_string(need) +
                        " free blocks, " + std::to_string(free_now) + " of " +
                        std::to_string(n_blocks_) + " are free (blocks of " +
                        std::to_string(block_rows_) + " positions)");
  }
  for (Index i = 0; i < n; ++i) {
    PagedSequence<S>& s = seq_at(i);
    if (copies(s, count_at(i))) {  // copy-on-write of the shared, partly filled last block
      const std::int32_t from = s.table_.back(), to = take_block();
      copy_block(from, to, s.length_ % block_rows_);
      drop_block(from);
      s.table_.back() = to;
    }
    const Index want = s.blocks_for(s.length_ + count_at(i));
    while (static_cast<Index>(s.table_.size()) < want) s.table_.push_back(take_block());
    s.length_ += count_at(i);
  }
}

// One layer of a paged sequence already grown for this step (seq.grow(T_new) once, then a forward
// per layer): the cache concept over layer `layer`, whose new rows are the sequence's last
// `pending` positions. A view: the sequence must outlive it.
template <class S>
class PagedLayer {
 public:
  using Scalar = typename PagedSequence<S>::Scalar;
  using Element = typename PagedSequence<S>::Element;

  PagedLayer(PagedSequence<S>& seq, Index layer, Index pending)
      : seq_(&seq), layer_(layer), pending_(pending) {}

  static const char* label() { return "sequence"; }
  const AttentionConfig& config() const { return seq_->config(); }
  PagedSequence<S>& sequence() const { return *seq_; }
  Index layer() const { return layer_; }
  Index n_past() const { return seq_->length() - pending_; }
  void check_append(Index n) const {
    if (layer_ < 0 || layer_ >= seq_->pool().n_layers())
      throw ShapeError("layer: expected an index in [0, " +
                       std::to_string(seq_->pool().n_layers()) + ") (the pool's layers), got " +
                       std::to_string(layer_));
    if (n > seq_->length())
      throw ShapeError("x: expected at most " + std::to_string(seq_->length()) +
                       " rows (the sequence's positions: grow() it first), got " +
                       std::to_string(n));
    seq_->check_last_writable(n);
  }
  Index begin_append(Index n) {
    seq_->fill_pages(layer_);
    return seq_->length() - n;
  }
  void rollback(Index) {}  // the sequence keeps its length: its owner grew it
  void write_head(Index h, Index p, const ConstMatrixRef<Scalar>& k, const ConstMatrixRef<Scalar>& v) {
    seq_->write_head_rows(layer_, h, p, k, v);
  }
  HeadPages<Element> head_pages(Index h) const { return seq_->head_pages(h); }
  template <class V>
  void check_disjoint(const char* what, const V& view) const {
    const KVBlockPool<S>& pool = seq_->pool();
    if (detail::overlaps(view, pool.key_storage(layer_)) ||
        detail::overlaps(view, pool.value_storage(layer_)) ||
        detail::overlaps(view, pool.key_scale_storage(layer_)) ||
        detail::overlaps(view, pool.value_scale_storage(layer_)))
      throw ShapeError(std::string(what) + ": must not overlap the KV block pool");
  }

 private:
  PagedSequence<S>* seq_;
  Index layer_, pending_;
};

// The compiled mode's forwards and batch forwards over paged caches (detail/compiled_mode.hpp),
// as sublayer.hpp's and batch.hpp's.
#if GPT2_ATTENTION_EXTERN_FORWARDS
GPT2_ATTENTION_FORWARD(float, PagedSequence<float>)
GPT2_ATTENTION_FORWARD(float, PagedSequence<bfloat16>)
GPT2_ATTENTION_FORWARD(float, PagedSequence<int8>)
GPT2_ATTENTION_FORWARD(float, PagedLayer<float>)
GPT2_ATTENTION_FORWARD(float, PagedLayer<bfloat16>)
GPT2_ATTENTION_FORWARD(float, PagedLayer<int8>)
GPT2_ATTENTION_FORWARD(double, PagedSequence<double>)
GPT2_ATTENTION_FORWARD(double, PagedLayer<double>)
GPT2_ATTENTION_BATCH_FORWARD(float, detail::CacheList<PagedSequence<float>>)
GPT2_ATTENTION_BATCH_FORWARD(float, detail::CacheList<PagedSequence<bfloat16>>)
GPT2_ATTENTION_BATCH_FORWARD(float, detail::CacheList<PagedSequence<int8>>)
GPT2_ATTENTION_BATCH_FORWARD(float, detail::PagedLayers<float>)
GPT2_ATTENTION_BATCH_FORWARD(float, detail::PagedLayers<bfloat16>)
GPT2_ATTENTION_BATCH_FORWARD(float, detail::PagedLayers<int8>)
GPT2_ATTENTION_BATCH_FORWARD(double, detail::CacheList<PagedSequence<double>>)
GPT2_ATTENTION_BATCH_FORWARD(double, detail::PagedLayers<double>)
#endif

}  // namespace gpt2

// The sublayer over new tokens through a bf16 KV cache (KVCacheBF16): as incremental.hpp's
// forward, with the cache's keys and values widened to float32 block by block in the workspace
// before the fused core reads them.
//
//   x [T_new, C] are positions n_past .. n_past + T_new - 1; their keys and values are rounded to
//   bf16 and appended to the cache, and new row i attends to cached keys 0 .. n_past + i.
//
// Bits: the float core sees exactly the rounded keys and values, so the result is bitwise that of
// a KVCache<float> holding them, and the chunking of a sequence never changes it (as with a float
// cache: bitwise at the vector levels; with bf16 weights at the amx level, prefill tiles of 16 rows
// or more run the AMX core, see docs/bf16.md).
//
// Decode steps (one new row, no probabilities) read the cache once, each 64-key block giving a
// partial, and merge the partials in block order (the bits of the unsplit tile,
// kernels/attention_tile.hpp). At the vector levels the kernel reads the bf16 keys and values in
// place (row_partials_kv_bf16, widening in registers); at generic each head's blocks are widened
// kWidenBlocks at a time into the thread's scratch (L2-resident) and read there. Longer forwards
// widen each (head, row tile)'s visible keys whole.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "gpt2/causal_attention.hpp"
#include "gpt2/error.hpp"
#include "gpt2/forward.hpp"
#include "gpt2/incremental.hpp"
#include "gpt2/kernels/bf16.hpp"
#include "gpt2/kernels/dispatch.hpp"
#include "gpt2/kv_cache_bf16.hpp"
#include "gpt2/parallel.hpp"
#include "gpt2/projection.hpp"
#include "gpt2/qkv.hpp"
#include "gpt2/types.hpp"
#include "gpt2/weights.hpp"
#include "gpt2/workspace.hpp"

namespace gpt2 {

namespace detail {

// Key blocks a decode step widens at a time (4 x 64 keys: 64 KiB of keys and 64 KiB of values at
// head_dim 64, which stay in L2 while the block partials read them).
inline constexpr Index kWidenBlocks = 4;
inline constexpr Index kWidenRows = kWidenBlocks * kernels::kKeyBlock;

// dst[i] = the float32 value of bf16 bits src[i], i < n (exact); prefetches the bits `ahead`
// elements on as it goes, as long as they are before src + ahead_end (the end of what src's
// storage holds for the caller).
inline void widen_bf16(const std::uint16_t* src, Index n, float* dst, Index ahead = 0,
                       Index ahead_end = 0) {
  for (Index i0 = 0; i0 < n; i0 += 32) {
#if defined(__GNUC__) || defined(__clang__)
    if (i0 + ahead < ahead_end) __builtin_prefetch(src + i0 + ahead, 0, 1);
#endif
    const Index end = std::min<Index>(n, i0 + 32);
    for (Index i = i0; i < end; ++i) dst[i] = kernels::bf16_to_float(src[i]);
  }
}

// The level's kernel that reads a bf16 cache in place in a decode step (row_partials_kv_bf16), or
// null at generic, where the step widens it into the threads' kv_widened first.
inline const kernels::FloatKernels* bf16_cache_kernels() {
  const kernels::FloatKernels* kern = vector_kernels<float>();
  return kern != nullptr && kern->row_partials_kv_bf16 != nullptr ? kern : nullptr;
}

// The partials of q's one row (position n_keys - 1; q [T, head_dim], its last row) over key
// blocks [block_begin, block_end) of one head's bf16 keys and values [n_keys, head_dim], read in
// place by kern's row_partials_kv_bf16 (bitwise attention_row_partials on the widened values);
// keys_t: optionally the keys' transposed blocks (KVCacheBF16::transposed_key_blocks).
inline void row_partials_kv_bf16(const kernels::FloatKernels& kern, const ConstMatrixRef<float>& q,
                                 const KVCacheBF16::ConstBitsRef& keys,
                                 const KVCacheBF16::ConstBitsRef& values, Index block_begin,
                                 Index block_end, float* parts, AttentionScratch<float>& scratch,
                                 const std::uint16_t* keys_t = nullptr) {
  scratch.reserve_tile(q.cols());
  const std::uint16_t* key_page = keys.data();
  const std::uint16_t* value_page = values.data();
  kernels::AttentionTile<float> t;
  t.rows = 1;
  t.first_pos = keys.rows() - 1;
  t.head_dim = q.cols();
  t.q = q.data() + (q.rows() - 1) * q.outerStride();
  t.ldq = q.outerStride();
  t.scale = 1.0f / std::sqrt(static_cast<float>(q.cols()));
  t.scratch = scratch.tile();
  t.bf16 = scratch.bf16_products();
  t.key_pages_bf16 = &key_page;
  t.value_pages_bf16 = &value_page;
  t.page_rows = keys.rows();  // one page
  t.key_stride = keys.outerStride();
  t.value_stride = values.outerStride();
  t.keys_t_bf16 = keys_t;
  kern.row_partials_kv_bf16(t, block_begin, block_end, parts);
}

// A decode step's attention: merged [1, C] from q (in qkv [1, 3C]) over the cache's n_keys
// positions (the new one included), on n_threads threads. Each task is one head's run of key
// blocks, writing their partials (read in place, or at generic widened kWidenBlocks blocks at a
// time into its thread's kv_widened); then every head's partials are merged in block order.
inline void attend_decode_bf16(const AttentionConfig& config, const ConstMatrixRef<float>& qkv,
                               const KVCacheBF16& cache, Workspace<float>& ws,
                               MatrixRef<float>& merged, int n_threads) {
  const Index n_head = config.n_head, hd = config.head_dim(), n_keys = cache.n_past();
  const Index n_blocks = (n_keys + kernels::kKeyBlock - 1) / kernels::kKeyBlock;
  const Index chunks =
      std::max<Index>(1, std::min<Index>(n_blocks, (n_threads + n_head - 1) / n_head));
  const Index stride = kernels::partial_stride(hd);
  float* parts = ws.partials();
  const kernels::FloatKernels* in_place = bf16_cache_kernels();
  if (in_place == nullptr)
    for (Index t = 0; t < std::min<Index>(n_threads, ws.thread_capacity()); ++t)
      if (ws.threads[static_cast<std::size_t>(t)].kv_widened.rows() < 2 * kWidenRows)
        throw CapacityError("workspace: no room for a decode step's widened keys "
                            "(reserve_cache_scratch)");
  parallel_tasks(n_head * chunks, n_threads, [&](Index task, int thread) {
    const Index h = task / chunks, c = task % chunks;
    const Index b0 = c * n_blocks / chunks, b1 = (c + 1) * n_blocks / chunks;
    ThreadScratch<float>& scratch = ws.threads[static_cast<std::size_t>(thread)];
    const KVCacheBF16::ConstBitsRef key_bits = cache.key_bits(h), value_bits = cache.value_bits(h);
    if (in_place != nullptr) {
      row_partials_kv_bf16(*in_place, q_view(qkv, config, h), key_bits, value_bits, b0, b1,
                           parts + (h * n_blocks + b0) * stride, scratch.attention,
                           cache.transposed_key_blocks(h));
      return;
    }
    float* keys = scratch.kv_widened.data();
    float* values = keys + kWidenRows * hd;
    // Page s of the table is rows [s * kWidenRows, (s + 1) * kWidenRows): always the buffer,
    // filled with page s just before its blocks are read.
    std::fill(scratch.key_pages.begin(), scratch.key_pages.end(), keys);
    std::fill(scratch.value_pages.begin(), scratch.value_pages.end(), values);
    HeadPages<float> kv;
    kv.key_pages = scratch.key_pages.data();
    kv.value_pages = scratch.value_pages.data();
    kv.page_rows = kWidenRows;
    kv.row_stride = hd;
    kv.n_keys = n_keys;
    kv.head_dim = hd;
    for (Index lo = b0; lo < b1;) {
      const Index page = lo / kWidenBlocks;
      const Index hi = std::min(b1, (page + 1) * kWidenBlocks);
      const Index row0 = lo * kernels::kKeyBlock;
      const Index rows = std::min(hi * kernels::kKeyBlock, n_keys) - row0;
      const Index at = (row0 - page * kWidenRows) * hd;
      // the next run's bits, while these are read (within this task's blocks of the head)
      const Index ahead = kWidenRows * hd;
      const Index ahead_end = hi < b1 ? (std::min(b1 * kernels::kKeyBlock, n_keys) - row0) * hd : 0;
      widen_bf16(key_bits.data() + row0 * hd, rows * hd, keys + at, ahead, ahead_end);
      widen_bf16(value_bits.data() + row0 * hd, rows * hd, values + at, ahead, ahead_end);
      attention_row_partials<float>(q_view(qkv, config, h), kv, lo, hi,
                                    parts + (h * n_blocks + lo) * stride, scratch.attention);
      lo = hi;
    }
  });
  parallel_tasks(n_head, n_threads, [&](Index h, int thread) {
    merge_row_partials<float>(hd, n_keys, parts + h * n_blocks * stride,
                              head_slot(merged, config, h).data(),
                              ws.threads[static_cast<std::size_t>(thread)].attention);
  });
}

// The attention of T new rows (any T, probabilities or not): merged [T, C] (and probs) from q (in
// qkv [T, 3C]) over the cache's n_keys positions. Each (head, row tile) task widens the keys and
// values its last row sees (whole blocks) into its thread's kv_widened, then runs the row tile on
// them; each head's costliest tiles first, as attend_heads does.
inline void attend_rows_bf16(const AttentionConfig& config, const ConstMatrixRef<float>& qkv,
                             const KVCacheBF16& cache, Workspace<float>& ws,
                             MatrixRef<float>& merged, MatrixRef<float>* probs, int n_threads) {
  const Index T_ = qkv.rows(), n_head = config.n_head, hd = config.head_dim();
  const Index n_keys = cache.n_past(), n_past = n_keys - T_;
  const Index row_block = attention_row_block(ws.threads[0].attention, hd, probs != nullptr);
  const Index tiles = attention_row_tiles(T_, row_block);
  if (probs) ws.reserve_probabilities();
  parallel_tasks(n_head * tiles, n_threads, [&](Index task, int thread) {
    const Index h = task / tiles, tile = tiles - 1 - task % tiles;
    const Index r0 = tile * row_block, nb = std::min(row_block, T_ - r0);
    ThreadScratch<float>& scratch = ws.threads[static_cast<std::size_t>(thread)];
    const Index key_rows = scratch.kv_widened.rows() / 2;  // >= n_keys (reserve_cache_scratch)
    if (key_rows < n_keys)
      throw CapacityError("workspace: widening buffer of " + std::to_string(key_rows) +
                          " keys for " + std::to_string(n_keys) + " (reserve_cache_scratch)");
    float* keys = scratch.kv_widened.data();
    float* values = keys + key_rows * hd;
    const Index seen = n_past + r0 + nb;  // keys the tile's last row sees
    const Index rows =
        std::min(n_keys, (seen + kernels::kKeyBlock - 1) / kernels::kKeyBlock * kernels::kKeyBlock);
    widen_bf16(cache.key_bits(h).data(), rows * hd, keys);
    widen_bf16(cache.value_bits(h).data(), rows * hd, values);
    using Map = Eigen::Map<const RowMatrix<float>>;
    const ConstMatrixRef<float> k(Map(keys, n_keys, hd)), v(Map(values, n_keys, hd));
    MatrixRef<float> y = head_slot(merged, config, h);
    if (probs) {
      MatrixRef<float> p = probs->middleRows(h * T_, T_);
      attention_row_tile<float>(q_view(qkv, config, h), k, v, r0, nb, y, &p, scratch.attention);
    } else {
      attention_row_tile<float>(q_view(qkv, config, h), k, v, r0, nb, y, nullptr,
                                scratch.attention);
    }
  });
}

// Grows every thread's widening buffers for a forward of T_new rows through `cache` (decode steps
// at generic widen kWidenRows keys at a time, at the vector levels none; longer forwards a whole
// head's), before any thread starts.
inline void reserve_cache_scratch(Workspace<float>& ws, const KVCacheBF16& cache, Index T_new,
                                  bool probs) {
  const bool decode = T_new == 1 && !probs;
  if (decode && bf16_cache_kernels() != nullptr) return;  // the kernel reads the cache in place
  // at least kWidenRows either way, so that decode steps after a longer first forward never grow it
  const Index rows = decode ? kWidenRows : std::max<Index>(cache.capacity(), kWidenRows);
  const Index pages = (cache.capacity() + kWidenRows - 1) / kWidenRows + 1;
  for (ThreadScratch<float>& t : ws.threads)
    t.reserve_kv_widened(rows, cache.config().head_dim(), pages);
}

// Heads of T_new new rows (qkv [T_new, 3C]) after their keys and values joined the cache (which
// now holds n_keys positions, theirs the last T_new): merged [T_new, C] (and probs). Workspace
// grown (reserve, reserve_cache_scratch) before.
inline void attend_cached(const AttentionConfig& config, const ConstMatrixRef<float>& qkv,
                          const KVCacheBF16& cache, Workspace<float>& ws, MatrixRef<float>& merged,
                          MatrixRef<float>* probs, int n_threads) {
  if (qkv.rows() == 1 && probs == nullptr)
    attend_decode_bf16(config, qkv, cache, ws, merged, n_threads);
  else
    attend_rows_bf16(config, qkv, cache, ws, merged, probs, n_threads);
}

// A decode step (x [1, C] at position n_past; no probabilities) on n_threads >= 2 threads in one
// parallel region (decode_step_region), at a level that reads the bf16 cache in place, with at
// least as many heads as threads (each head's keys on one thread): the qkv product's column
// parts; then each head on one thread, its key and value rows rounded into the cache (grown by
// one position first), its partials over every key block and their merge into its slot of
// merged; then the output projection's column parts. The parts, kernels and merge order of the
// general path (attend_decode_bf16 with one chunk per head), so the same bits. Returns false,
// with nothing done, when the step is not one. Shapes checked and the workspace grown before; if
// anything throws, the cache is rolled back to n_past positions.
inline bool decode_step_in_one_region_bf16(const AttentionWeights<float>& w,
                                           const ConstMatrixRef<float>& x, KVCacheBF16& cache,
                                           Workspace<float>& ws, MatrixRef<float>& out,
                                           int n_threads) {
  const AttentionConfig& config = w.config();
  const Index C = config.n_embd, n_head = config.n_head, hd = config.head_dim();
  const Index p = cache.n_past();  // x's position
  const kernels::FloatKernels* in_place = bf16_cache_kernels();
  if (x.rows() != 1 || n_threads < 2 || n_head < n_threads || in_place == nullptr) return false;
  const ConstMatrixRef<float> qkv = ws.qkv.topRows(1);
  MatrixRef<float> merged = ws.merged.topRows(1);
  KVCacheAccess::grow(cache, 1);  // key_bits(h), value_bits(h): p + 1 rows, row p written below
  const Index n_keys = p + 1, n_blocks = (n_keys + kernels::kKeyBlock - 1) / kernels::kKeyBlock;
  const Index stride = kernels::partial_stride(hd);
  float* parts = ws.partials();  // [n_head][n_blocks][stride]
  try {
    decode_step_region<float>(w, x, ws, out, n_threads, [&](Index h, int thread) {
      // head h: its cache row p, its partials, then its slot of merged
      KVCacheAccess::put_head_rows<float>(cache, h, p, qkv.middleCols(C, C),
                                          qkv.middleCols(2 * C, C));
      AttentionScratch<float>& scratch = ws.threads[static_cast<std::size_t>(thread)].attention;
      float* head_parts = parts + h * n_blocks * stride;
      row_partials_kv_bf16(*in_place, q_view(qkv, config, h), cache.key_bits(h),
                           cache.value_bits(h), 0, n_blocks, head_parts, scratch,
                           cache.transposed_key_blocks(h));
      merge_row_partials<float>(hd, n_keys, head_parts, head_slot(merged, config, h).data(),
                                scratch);
    });
  } catch (...) {
    cache.truncate(p);
    throw;
  }
  return true;
}

// The forward, once checked, with a workspace grown for it. Appends T_new positions; if anything
// throws after that, the cache is rolled back to n_past positions.
inline void run_cached_forward_bf16(const AttentionWeights<float>& w,
                                    const ConstMatrixRef<float>& x, KVCacheBF16& cache,
                                    Workspace<float>& ws, MatrixRef<float>& out,
                                    MatrixRef<float>* probs) {
  const Index T_new = x.rows(), C = w.n_embd(), n_past = cache.n_past();
  if (T_new == 0) return;
  MatrixRef<float> qkv = ws.qkv.topRows(T_new);
  MatrixRef<float> merged = ws.merged.topRows(T_new);
  const int n_threads = forward_threads(ws);
  // x is fully read by the first step (here or in the one-region step): out may alias x
  if (!probs && decode_step_in_one_region_bf16(w, x, cache, ws, out, n_threads)) return;
  qkv_parallel<float>(w, x, qkv, ws, n_threads);  // x is fully read here: out may alias x
  cache.append(qkv.middleCols(C, C), qkv.middleCols(2 * C, C));
  try {
    const ConstMatrixRef<float> qkv_read = qkv;
    attend_cached(w.config(), qkv_read, cache, ws, merged, probs, n_threads);
    const ConstMatrixRef<float> merged_read = merged;
    proj_parallel<float>(w, merged_read, out, ws, n_threads);
  } catch (...) {
    cache.truncate(n_past);
    throw;
  }
}

inline void attention_forward_cached_bf16(const AttentionWeights<float>& w,
                                          const ConstMatrixRef<float>& x, KVCacheBF16& cache,
                                          Workspace<float>& ws, MatrixRef<float>& out,
                                          MatrixRef<float>* probs) {
  check_cached_forward<float>(w, x, cache, ws, out, probs);  // incremental.hpp's, for either cache
  if (x.rows() == 0) return;  // nothing to append or attend: nothing to reserve
  ws.reserve(x.rows(), cache.capacity());  // the first call sizes it for the whole cache
  reserve_cache_scratch(ws, cache, x.rows(), probs != nullptr);
  check_workspace_overlap<float>(ws, x.rows(), out, probs);
  run_cached_forward_bf16(w, x, cache, ws, out, probs);
}

}  // namespace detail

// out = GPT-2 attention sublayer over new tokens, through a bf16 KV cache.
//   x [T_new, C] (read; positions n_past .. n_past + T_new - 1 of the sequence in `cache`)
//   cache: holds n_past positions; gains T_new, their keys and values rounded to bf16
//          (CapacityError, cache unchanged, if they do not fit)
//   ws: scratch; grown on the first call to T_new tokens and cache.capacity() keys (and, for a
//       longer forward than one decode step, a float copy of one head's keys and values per
//       thread), so later decode steps allocate nothing
//   out [T_new, C] (written; may be the same storage as x, must not overlap the cache)
// PyTorch (HF): GPT2Attention(x, layer_past=past, use_cache=True) with past in torch.bfloat16
// (keys and values cast to bf16 as they are cached, and back to float32 for the products).
template <class T, class D, std::enable_if_t<std::is_same<T, float>::value, int> = 0>
void attention_forward(const AttentionWeights<T>& w, const Eigen::MatrixBase<D>& x,
                       KVCacheBF16& cache, Workspace<T>& ws, MatrixRef<T> out) {
  detail::attention_forward_cached_bf16(w, detail::as_view<float>(x), cache, ws, out, nullptr);
}

// Same, also writing the probabilities of every head over every position it can see.
//   probs [n_head * T_new, n_past + T_new] (written), as with a KVCache.
template <class T, class D, std::enable_if_t<std::is_same<T, float>::value, int> = 0>
void attention_forward(const AttentionWeights<T>& w, const Eigen::MatrixBase<D>& x,
                       KVCacheBF16& cache, Workspace<T>& ws, MatrixRef<T> out, MatrixRef<T> probs) {
  detail::attention_forward_cached_bf16(w, detail::as_view<float>(x), cache, ws, out, &probs);
}

}  // namespace gpt2

// Batches: B sequences of up to T tokens each, padded to a common length T, in one call.
//
//   x [B * T, C]: the row-major [B, T, C] tensor; sequence b owns rows b*T .. b*T + T - 1, and its
//   real tokens are rows start(b) .. start(b) + length(b) - 1 of them (right padding: start 0;
//   left padding: start T - length). The other rows are padding.
//
// Padding never reaches a real token, whatever it holds (NaN included): padded rows are never
// read. Padded output rows are exactly zero (a query with no visible key gives zeros, never NaN).
// Each sequence's real rows get exactly what a forward over those rows alone gives.
#pragma once

#include <algorithm>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "gpt2/error.hpp"
#include "gpt2/forward.hpp"
#include "gpt2/incremental.hpp"
#include "gpt2/incremental_bf16.hpp"
#include "gpt2/kv_cache.hpp"
#include "gpt2/kv_cache_bf16.hpp"
#include "gpt2/types.hpp"
#include "gpt2/weights.hpp"
#include "gpt2/workspace.hpp"

namespace gpt2 {

// Which rows of a padded [B, T, C] batch hold real tokens. Cheap to copy; set() changes one
// sequence without allocating (reuse one layout across decode steps).
class BatchLayout {
 public:
  // An empty batch (B = 0, T = 0).
  BatchLayout() = default;

  // Sequence b's real tokens are its rows starts[b] .. starts[b] + lengths[b] - 1.
  // ShapeError naming the sequence unless 0 <= starts[b], 0 <= lengths[b] and
  // starts[b] + lengths[b] <= tokens.
  BatchLayout(Index tokens, std::vector<Index> starts, std::vector<Index> lengths)
      : tokens_(tokens), starts_(std::move(starts)), lengths_(std::move(lengths)) {
    if (tokens_ < 0)
      throw ShapeError("batch: expected a non-negative token count, got " + std::to_string(tokens_));
    if (starts_.size() != lengths_.size())
      throw ShapeError("batch: expected one start per length (" + std::to_string(lengths_.size()) +
                       "), got " + std::to_string(starts_.size()));
    for (Index b = 0; b < batch(); ++b) set(b, starts_[b], lengths_[b]);
  }

  // Every row of every sequence is real.
  static BatchLayout full(Index batch, Index tokens) {
    if (batch < 0)
      throw ShapeError("batch: expected a non-negative batch size, got " + std::to_string(batch));
    return BatchLayout(tokens, std::vector<Index>(batch, 0), std::vector<Index>(batch, tokens));
  }
  // Sequence b's tokens are its first lengths[b] rows; padding after them.
  static BatchLayout right_padded(Index tokens, const std::vector<Index>& lengths) {
    return BatchLayout(tokens, std::vector<Index>(lengths.size(), 0), lengths);
  }
  // Sequence b's tokens are its last lengths[b] rows; padding before them.
  static BatchLayout left_padded(Index tokens, const std::vector<Index>& lengths) {
    std::vector<Index> starts(lengths.size());
    for (std::size_t b = 0; b < lengths.size(); ++b) {
      if (lengths[b] < 0 || lengths[b] > tokens)
        throw ShapeError("batch sequence " + std::to_string(b) + ": expected a length in [0, " +
                         std::to_string(tokens) + "] (the padded length), got " +
                         std::to_string(lengths[b]));
      starts[b] = tokens - lengths[b];
    }
    return BatchLayout(tokens, std::move(starts), lengths);
  }

  Index batch() const { return static_cast<Index>(lengths_.size()); }  // B
  Index tokens() const { return tokens_; }                               // T
  Index rows() const { return batch() * tokens_; }                       // B * T
  // Sequence b's real rows are rows start(b) .. start(b) + length(b) - 1 of its [T, C] block, i.e.
  // rows first_row(b) .. of x [B * T, C]. b outside [0, B) is a ShapeError naming b and B.
  Index start(Index b) const { return starts_[check(b)]; }
  Index length(Index b) const { return lengths_[check(b)]; }
  Index first_row(Index b) const { return b * tokens_ + start(b); }  // in x [B * T, C]
  // The longest sequence's length (0 for an empty batch): what a workspace needs room for.
  Index max_length() const {
    Index m = 0;
    for (Index n : lengths_) m = std::max(m, n);
    return m;
  }
  // The real rows of all sequences: the sum of the lengths.
  Index real_rows() const {
    Index sum = 0;
    for (Index n : lengths_) sum += n;
    return sum;
  }

  // Makes sequence b's real tokens rows start .. start + length - 1 (no allocation).
  void set(Index b, Index start, Index length) {
    check(b);
    if (start < 0 || length < 0 || start > tokens_ - length)
      throw ShapeError("batch sequence " + std::to_string(b) + ": expected 0 <= start, 0 <= length and start + length <= " +
                       std::to_string(tokens_) + " (the padded length), got start " +
                       std::to_string(start) + ", length " + std::to_string(length));
    starts_[static_cast<std::size_t>(b)] = start;
    lengths_[static_cast<std::size_t>(b)] = length;
  }

 private:
  std::size_t check(Index b) const {
    if (b < 0 || b >= batch())
      throw ShapeError("batch: expected a sequence index in [0, " + std::to_string(batch()) +
                       "), got " + std::to_string(b));
    return static_cast<std::size_t>(b);
  }

  Index tokens_ = 0;
  std::vector<Index> starts_, lengths_;
};

// Real rows of a cached batch that go through the projections together (a group) when the
// projections are row-exact (the AVX-512 float kernel): a decode step of up to 256 sequences
// reads the weights once, not once per sequence, while the workspace stays at 256 rows. When a
// sequence is longer, the workspace has room for it and groups take up to that many rows.
inline constexpr Index kBatchGroupRows = 256;

namespace detail {

// Shapes, and the one way out may share storage with x: being exactly x (each sequence's rows
// are read before they are written). A partial overlap would let sequence b's output overwrite a
// later sequence's input.
template <class T>
void check_batch_io(const BatchLayout& batch, Index C, const ConstMatrixRef<T>& x,
                    const MatrixRef<T>& out) {
  check_shape("x", {batch.rows(), C}, {x.rows(), x.cols()});
  check_shape("out", {batch.rows(), C}, {out.rows(), out.cols()});
  const bool same = out.data() == x.data() && out.outerStride() == x.outerStride();
  if (!same && overlaps(out, x))
    throw ShapeError("out: must be either the same storage as x or not overlap it");
}

// out's padded rows of sequence b = 0.
template <class T>
void zero_padding(const BatchLayout& batch, Index b, MatrixRef<T>& out) {
  const Index T_ = batch.tokens(), start = batch.start(b), end = start + batch.length(b);
  out.middleRows(b * T_, start).setZero();
  out.middleRows(b * T_ + end, T_ - end).setZero();
}

// A sequence's real rows of x [n, C] must not overlap the first `rows` rows of the workspace's
// buffers, which the forward writes before (or while) it reads x.
template <class T>
void check_input_outside_workspace(const Workspace<T>& ws, Index rows, const ConstMatrixRef<T>& x_b) {
  if (rows == 0 || x_b.rows() == 0) return;
  const ConstMatrixRef<T> qkv = ws.qkv.topRows(rows), merged = ws.merged.topRows(rows);
  if (overlaps(x_b, qkv) || overlaps(x_b, merged))
    throw ShapeError("x: must not overlap the workspace");
}

// Rethrows the current gpt2 error with "batch sequence b: " before its message, same type.
[[noreturn]] inline void rethrow_for_sequence(Index b) {
  const std::string prefix = "batch sequence " + std::to_string(b) + ": ";
  try {
    throw;
  } catch (const CapacityError& e) {
    throw CapacityError(prefix + e.what());
  } catch (const ShapeError& e) {
    throw ShapeError(prefix + e.what());
  } catch (const ConfigError& e) {
    throw ConfigError(prefix + e.what());
  }
}

// Whether one projection over the rows of several sequences gives every row the bits a projection
// of its sequence alone gives: true for float at the vector levels (one chain of multiply-adds per
// element, whatever the row count: kernels/dispatch.hpp). Eigen's GEMM and GEMV order their sums
// by shape, so the generic level and double project sequence by sequence.
template <class T>
bool row_exact_projections() {
  return vector_kernels<T>() != nullptr;
}

// Token rows the workspace needs for a cached batch: the longest sequence, and with row-exact
// projections a group's rows.
template <class T>
Index batch_workspace_rows(const BatchLayout& batch) {
  if (!row_exact_projections<T>()) return batch.max_length();
  return std::max(batch.max_length(), std::min(batch.real_rows(), kBatchGroupRows));
}

// Sequences [b0, b1) of a batch (one sequence, or with row-exact projections several), whose
// `rows` real rows fit the workspace, through the projections together: their x rows gathered into
// ws.merged, one qkv projection into ws.qkv, then for each sequence with rows
// step(b, qkv_b [n, 3C], merged_b [n, C], n_threads) (its keys and values stored, its heads
// attended into merged_b: ws.merged, the gathered rows being read by then), one output projection
// into ws.qkv's first C columns, and the rows scattered to out, padding zeroed. Every row gets the
// bits a forward of its sequence alone gives (row-exact projections; the attention is per
// sequence either way). The KVCache and the paged forwards differ only in their step.
template <class T, class Step>
void run_group(const AttentionWeights<T>& w, const ConstMatrixRef<T>& x, const BatchLayout& batch,
               Index b0, Index b1, Index rows, Workspace<T>& ws, MatrixRef<T>& out,
               const Step& step) {
  const Index C = w.n_embd();
  if (rows == 0) {  // every sequence sits the step out: nothing to project (and an empty workspace
    for (Index b = b0; b < b1; ++b) zero_padding<T>(batch, b, out);  // has no storage to view)
    return;
  }
  const int n_threads = forward_threads(ws);
  MatrixRef<T> gathered = ws.merged.topRows(rows);
  for (Index b = b0, r = 0; b < b1; r += batch.length(b), ++b)
    gathered.middleRows(r, batch.length(b)) = x.middleRows(batch.first_row(b), batch.length(b));
  MatrixRef<T> qkv = ws.qkv.topRows(rows);
  const ConstMatrixRef<T> gathered_read = gathered;
  qkv_parallel<T>(w, gathered_read, qkv, ws, n_threads);

  MatrixRef<T> merged = ws.merged.topRows(rows);
  const ConstMatrixRef<T> qkv_read = qkv;
  for (Index b = b0, r = 0; b < b1; r += batch.length(b), ++b) {
    const Index n = batch.length(b);
    if (n == 0) continue;
    MatrixRef<T> merged_b = merged.middleRows(r, n);
    step(b, ConstMatrixRef<T>(qkv_read.middleRows(r, n)), merged_b, n_threads);
  }

  MatrixRef<T> projected = ws.qkv.topLeftCorner(rows, C);  // qkv is read by then
  const ConstMatrixRef<T> merged_read = merged;
  proj_parallel<T>(w, merged_read, projected, ws, n_threads);
  for (Index b = b0, r = 0; b < b1; r += batch.length(b), ++b) {
    out.middleRows(batch.first_row(b), batch.length(b)) = projected.middleRows(r, batch.length(b));
    zero_padding<T>(batch, b, out);
  }
}

// run_group over KV caches (KVCache<T>, or KVCacheBF16 for float): each sequence's keys and values
// appended to its cache, then attended.
// appended: sequences whose caches have been appended to (all of 0 .. appended - 1).
template <class T, class CacheAt>
void run_cached_group(const AttentionWeights<T>& w, const ConstMatrixRef<T>& x,
                      const BatchLayout& batch, const CacheAt& caches, Index b0, Index b1,
                      Index rows, Workspace<T>& ws, MatrixRef<T>& out, Index& appended) {
  const Index C = w.n_embd();
  run_group<T>(w, x, batch, b0, b1, rows, ws, out,
               [&](Index b, const ConstMatrixRef<T>& qkv_b, MatrixRef<T>& merged_b, int n_threads) {
                 auto& cache = caches(b);  // a KVCache<T> or a KVCacheBF16
                 cache.append(qkv_b.middleCols(C, C), qkv_b.middleCols(2 * C, C));
                 appended = b + 1;
                 MatrixRef<T>* const no_probs = nullptr;
                 attend_cached(w.config(), qkv_b, cache, ws, merged_b, no_probs, n_threads);
               });
  appended = b1;
}

// The batched cached forward; caches(b) is sequence b's KVCache<T>& (B of them).
// Every check, for every sequence, runs before any cache changes.
// distinct: the caches are known to be distinct objects (elements of one vector), so the O(B^2)
// check for a cache given twice is skipped.
template <class T, class CacheAt>
void batch_forward_cached(const AttentionWeights<T>& w, const ConstMatrixRef<T>& x,
                          const BatchLayout& batch, const CacheAt& caches, bool distinct,
                          Workspace<T>& ws, MatrixRef<T>& out) {
  const Index B = batch.batch();
  check_batch_io<T>(batch, w.n_embd(), x, out);
  check_workspace(w, ws);
  Index max_keys = 0;
  for (Index b = 0; b < B; ++b) {
    auto& cache = caches(b);
    for (Index a = 0; a < b && !distinct; ++a)
      if (&caches(a) == &cache)
        throw ShapeError("caches: sequences " + std::to_string(a) + " and " + std::to_string(b) +
                         " share one KV cache");
    const ConstMatrixRef<T> x_b = x.middleRows(batch.first_row(b), batch.length(b));
    MatrixRef<T> out_b = out.middleRows(batch.first_row(b), batch.length(b));
    try {
      const MatrixRef<T>* const no_probs = nullptr;
      check_cached_forward(w, x_b, cache, ws, out_b, no_probs);
    } catch (...) {
      rethrow_for_sequence(b);
    }
    max_keys = std::max(max_keys, cache.capacity());
  }
  const Index group_rows = batch_workspace_rows<T>(batch);
  ws.reserve(group_rows, std::max(max_keys, group_rows));
  for (Index b = 0; b < B; ++b)
    if (batch.length(b) > 0) reserve_cache_scratch(ws, caches(b), batch.length(b), false);
  for (Index b = 0; b < B; ++b) {
    // Sequence by sequence, its real rows of out and the workspace rows its forward uses. With
    // row-exact projections the groups use up to group_rows rows of it, read x's real rows after
    // earlier groups have written out's rows (padding included): all of x and out must stay out.
    const bool grouped = row_exact_projections<T>();
    MatrixRef<T> out_b = grouped ? out.middleRows(b * batch.tokens(), batch.tokens())
                                 : out.middleRows(batch.first_row(b), batch.length(b));
    const Index used_rows = grouped ? group_rows : batch.length(b);
    try {
      check_workspace_overlap<T>(ws, used_rows, out_b, nullptr);
      check_input_outside_workspace<T>(ws, used_rows,
                                       x.middleRows(batch.first_row(b), batch.length(b)));
    } catch (...) {
      rethrow_for_sequence(b);
    }
  }

  Index done = 0;  // caches 0 .. done - 1 have been appended to
  try {
    // Groups of consecutive sequences with at most group_rows real rows; one sequence per group
    // unless the projections are row-exact (the copies in and out of the workspace then cost
    // 2 [n, C] copies per sequence, next to its [n, C] x [C, 4C] of projections).
    while (done < B) {
      const Index b0 = done;
      Index b1 = b0, rows = 0;
      while (b1 < B && (b1 == b0 || (row_exact_projections<T>() &&
                                     rows + batch.length(b1) <= group_rows)))
        rows += batch.length(b1++);
      run_cached_group<T>(w, x, batch, caches, b0, b1, rows, ws, out, done);
    }
  } catch (...) {  // not expected after the checks; run_cached_group counts a sequence in `done`
    // as soon as its cache is appended to
    for (Index b = 0; b < done; ++b) caches(b).truncate(caches(b).n_past() - batch.length(b));
    throw;
  }
}

}  // namespace detail

// out = GPT-2 attention sublayer of each sequence of a padded batch, independently.
//   x [B * T, C] (read; row-major [B, T, C]; padded rows may hold anything, NaN included)
//   batch: B, T and each sequence's real rows
//   ws: scratch (grown to the longest sequence if smaller)
//   out [B * T, C] (written; padded rows exactly 0; may be the same storage as x)
// PyTorch (HF): GPT2Attention(x, attention_mask=mask) on the real rows; 0 on the padded ones.
template <class T, class D>
void attention_forward(const AttentionWeights<T>& w, const Eigen::MatrixBase<D>& x_in,
                       const BatchLayout& batch, Workspace<T>& ws, MatrixRef<T> out) {
  const ConstMatrixRef<T> x = detail::as_view<T>(x_in);
  detail::check_batch_io<T>(batch, w.n_embd(), x, out);
  detail::check_workspace(w, ws);
  ws.reserve(batch.max_length());
  for (Index b = 0; b < batch.batch(); ++b) {
    MatrixRef<T> out_b = out.middleRows(batch.first_row(b), batch.length(b));
    try {
      detail::check_workspace_overlap<T>(ws, batch.length(b), out_b, nullptr);
    } catch (...) {
      detail::rethrow_for_sequence(b);
    }
  }
  for (Index b = 0; b < batch.batch(); ++b) {
    MatrixRef<T> out_b = out.middleRows(batch.first_row(b), batch.length(b));
    detail::attention_forward<T>(w, x.middleRows(batch.first_row(b), batch.length(b)), ws, out_b,
                                 nullptr);
    detail::zero_padding<T>(batch, b, out);
  }
}

namespace detail {

// The three ways of passing a batch's caches, for either cache type (the public overloads below).
template <class T, class Cache>
void batch_forward_vector(const AttentionWeights<T>& w, const ConstMatrixRef<T>& x,
                          const BatchLayout& batch, std::vector<Cache>& caches, Workspace<T>& ws,
                          MatrixRef<T>& out) {
  if (static_cast<Index>(caches.size()) != batch.batch())
    throw ShapeError("caches: expected one KV cache per sequence (" +
                     std::to_string(batch.batch()) + "), got " + std::to_string(caches.size()));
  batch_forward_cached<T>(
      w, x, batch, [&](Index b) -> Cache& { return caches[static_cast<std::size_t>(b)]; }, true,
      ws, out);
}
template <class T, class Cache>
void batch_forward_pointers(const AttentionWeights<T>& w, const ConstMatrixRef<T>& x,
                            const BatchLayout& batch, Cache* const* caches, Workspace<T>& ws,
                            MatrixRef<T>& out) {
  for (Index b = 0; b < batch.batch(); ++b)
    if (caches[b] == nullptr) throw ShapeError("caches: entry " + std::to_string(b) + " is null");
  batch_forward_cached<T>(w, x, batch, [&](Index b) -> Cache& { return *caches[b]; }, false, ws,
                          out);
}
template <class T, class Cache>
void batch_forward_pointer_vector(const AttentionWeights<T>& w, const ConstMatrixRef<T>& x,
                                  const BatchLayout& batch, const std::vector<Cache*>& caches,
                                  Workspace<T>& ws, MatrixRef<T>& out) {
  if (static_cast<Index>(caches.size()) != batch.batch())
    throw ShapeError("caches: expected one KV cache per sequence (" +
                     std::to_string(batch.batch()) + "), got " + std::to_string(caches.size()));
  batch_forward_pointers<T, Cache>(w, x, batch, caches.data(), ws, out);
}

}  // namespace detail

// Batched incremental forward: sequence b's real rows are its next positions, appended to
// caches[b] and attending to everything cached there (each sequence has its own n_past).
//   x [B * T, C], out [B * T, C] as above; caches: B distinct caches, one per sequence
// A sequence of length 0 (finished, or waiting) leaves its cache alone. If any sequence's tokens
// do not fit its cache (CapacityError) or anything else is wrong, no cache changes.
// Batched decode: T = 1, every length 1 (or 0). With the AVX-512 float kernel the real rows of up
// to 256 sequences (kBatchGroupRows rows, or the longest sequence's if more) go through each
// projection together, so a decode step reads the weights once for up to 256 sequences; each row
// still gets the bits its sequence alone would. ws needs room for R = max(longest sequence,
// min(real rows, 256)) tokens and max(R, largest cache capacity) keys; it grows on the first call
// if smaller (e.g. Workspace(config, std::min<Index>(B, 256), std::max<Index>(..., capacity)) for
// B decoding sequences), then allocates nothing. x and out (padding included) must not overlap it.
template <class T, class D>
void attention_forward(const AttentionWeights<T>& w, const Eigen::MatrixBase<D>& x,
                       const BatchLayout& batch, std::vector<KVCache<T>>& caches,
                       Workspace<T>& ws, MatrixRef<T> out) {
  detail::batch_forward_vector<T, KVCache<T>>(w, detail::as_view<T>(x), batch, caches, ws, out);
}

// Same, with the caches held elsewhere: caches[b] points at sequence b's cache, for the
// batch.batch() entries of a plain array (e.g. one layer's column of a [B][n_layer] table).
template <class T, class D>
void attention_forward(const AttentionWeights<T>& w, const Eigen::MatrixBase<D>& x,
                       const BatchLayout& batch, KVCache<T>* const* caches, Workspace<T>& ws,
                       MatrixRef<T> out) {
  detail::batch_forward_pointers<T, KVCache<T>>(w, detail::as_view<T>(x), batch, caches, ws, out);
}

// Same, with a vector of B pointers.
template <class T, class D>
void attention_forward(const AttentionWeights<T>& w, const Eigen::MatrixBase<D>& x,
                       const BatchLayout& batch, const std::vector<KVCache<T>*>& caches,
                       Workspace<T>& ws, MatrixRef<T> out) {
  detail::batch_forward_pointer_vector<T, KVCache<T>>(w, detail::as_view<T>(x), batch, caches, ws,
                                                      out);
}

// The same three through bf16 KV caches (KVCacheBF16, float only): each sequence's rows get the
// bits its forward through its own cache alone gives.
template <class T, class D, std::enable_if_t<std::is_same<T, float>::value, int> = 0>
void attention_forward(const AttentionWeights<T>& w, const Eigen::MatrixBase<D>& x,
                       const BatchLayout& batch, std::vector<KVCacheBF16>& caches,
                       Workspace<T>& ws, MatrixRef<T> out) {
  detail::batch_forward_vector<T, KVCacheBF16>(w, detail::as_view<T>(x), batch, caches, ws, out);
}
template <class T, class D, std::enable_if_t<std::is_same<T, float>::value, int> = 0>
void attention_forward(const AttentionWeights<T>& w, const Eigen::MatrixBase<D>& x,
                       const BatchLayout& batch, KVCacheBF16* const* caches, Workspace<T>& ws,
                       MatrixRef<T> out) {
  detail::batch_forward_pointers<T, KVCacheBF16>(w, detail::as_view<T>(x), batch, caches, ws, out);
}
template <class T, class D, std::enable_if_t<std::is_same<T, float>::value, int> = 0>
void attention_forward(const AttentionWeights<T>& w, const Eigen::MatrixBase<D>& x,
                       const BatchLayout& batch, const std::vector<KVCacheBF16*>& caches,
                       Workspace<T>& ws, MatrixRef<T> out) {
  detail::batch_forward_pointer_vector<T, KVCacheBF16>(w, detail::as_view<T>(x), batch, caches,
                                                       ws, out);
}

}  // namespace gpt2

// Step 3 of the sublayer: causal attention of one head.
//
//   att = softmax(q k^T / sqrt(head_dim), causal) ; y = att v
//
// q [T, head_dim] are the queries of the last T positions of a sequence whose first n_past
// positions come before them; k, v [n_past + T, head_dim] hold all its keys and values. Query row i
// (position n_past + i) sees keys 0 .. n_past + i (bottom-right-aligned causal mask, as Hugging Face
// applies it with past_key_values). With n_past = 0 this is the plain causal mask.
//
// The rows are processed in tiles of kAttentionRowBlock: a tile's scores cover only the keys it
// can see (the triangle is exploited; no T x T matrix unless the probabilities are requested).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "gpt2/error.hpp"
#include "gpt2/gemm.hpp"
#include "gpt2/kernels/dispatch.hpp"
#include "gpt2/kernels/generic.hpp"
#include "gpt2/types.hpp"

namespace gpt2 {

inline constexpr Index kAttentionRowBlock = 64;

// The score tile's rows start on 64-byte boundaries (its column count is rounded up to a multiple
// of kScoreRowAlign scalars), so every row has the alignment of the first: the vectorized exp and
// sum of the softmax then split a row at the same places whatever the tile's width, and a result
// does not depend on how much room the scratch happens to have.
template <class T>
constexpr Index kScoreRowAlign = 64 / static_cast<Index>(sizeof(T));

// Scratch of one causal_attention_head call: a [kAttentionRowBlock, n_keys] score tile and the
// packing buffers of its two products. Grows on demand; reserve() up front for allocation-free
// calls. Not thread-safe: one per thread.
template <class T>
class AttentionScratch {
 public:
  // Empty: grows on the first call. The second form allocates room for max_keys keys of width
  // head_dim up front (owns a [kAttentionRowBlock, max_keys rounded up] tile and packing buffers).
  AttentionScratch() = default;
  AttentionScratch(Index max_keys, Index head_dim) { reserve(max_keys, head_dim); }

  // Room for up to max_keys keys of width head_dim. If an allocation throws, the scratch stays
  // usable (it grows again on demand).
  void reserve(Index max_keys, Index head_dim) {
    if (scores.cols() < max_keys) {
      const Index cols = (max_keys + kScoreRowAlign<T> - 1) / kScoreRowAlign<T> * kScoreRowAlign<T>;
      RowMatrix<T> grown(kAttentionRowBlock, cols);  // allocate first: scores stays valid
      scores.swap(grown);
    }
    scores_gemm.reserve(kAttentionRowBlock, max_keys, head_dim);
    // att v sums over the keys in panels of Eigen's depth block kc, which Eigen derives from the
    // largest depth the blocking is built for. Built for kDeterministicDepth, kc is the cache-sized
    // maximum whatever max_keys is: the sum's order, and so the result, does not depend on the
    // scratch's capacity. (The packing buffers depend on kc, not on this depth.)
    values_gemm.reserve(kAttentionRowBlock, head_dim, kDeterministicDepth);
    if (kernel_scores() && (keys_t.rows() != head_dim || keys_t.cols() < max_keys)) {  // float
      const Index cols = (max_keys + kScoreRowAlign<T> - 1) / kScoreRowAlign<T> * kScoreRowAlign<T>;
      RowMatrix<T> grown(head_dim, cols);
      keys_t.swap(grown);
    }
    forget_packed_keys();
  }

  // Whether the scratch holds keys_t, the transposed keys that q k^T reads at the vector levels
  // (float; allocated whatever the level, so that a forced level never needs to grow it).
  static constexpr bool kernel_scores() { return std::is_same<T, float>::value; }

  // keys_t holds no head's keys: the next tile packs its own. Every call that attends starts so.
  void forget_packed_keys() {
    packed_keys = nullptr;
    packed_rows = 0;
  }

  static constexpr Index kDeterministicDepth = Index(1) << 24;

  // Bytes of the buffers held.
  Index bytes() const {
    return (scores.size() + keys_t.size()) * static_cast<Index>(sizeof(T)) + scores_gemm.bytes() +
           values_gemm.bytes();
  }

  RowMatrix<T> scores;  // [kAttentionRowBlock, max_keys rounded up to kScoreRowAlign<T>]
  GemmScratch<T> scores_gemm;
  GemmScratch<T> values_gemm;
  // With the kernel: k^T [head_dim, max_keys rounded up] of the head being attended, packed by the
  // first tile that needs it (packed_rows keys from packed_keys) and reused by the head's later,
  // smaller tiles on this thread.
  RowMatrix<T> keys_t;
  const T* packed_keys = nullptr;
  Index packed_rows = 0;
};

// max(-inf, row[0], ..., row[n-1]); NaN if any entry is NaN.
using kernels::generic::running_max;

// In place: row[0 .. n) = softmax(row[0 .. n)), row[n .. row.size()) = 0.
//   row [n_keys], 1 <= n <= n_keys
// The running max starts at minus infinity (never a finite sentinel), so logits of any size work.
// (Eigen's exp: the generic level's softmax, and double's.)
template <class T>
void causal_softmax_row(T* row, Index n, Index n_keys) {
  kernels::generic::softmax_row<T>(row, n, n_keys);
}

namespace detail {

inline void check_attention_shapes(Index n_query, Index n_keys, Index head_dim, Index k_rows,
                                   Index k_cols, Index v_rows, Index v_cols, Index out_rows,
                                   Index out_cols) {
  check_shape("k", {n_keys, head_dim}, {k_rows, k_cols});
  check_shape("v", {n_keys, head_dim}, {v_rows, v_cols});
  check_shape("out", {n_query, head_dim}, {out_rows, out_cols});
  if (n_keys < n_query)
    throw ShapeError("k: expected at least as many rows as q (" + std::to_string(n_query) +
                     "), got " + std::to_string(n_keys));
}

// At the vector levels, row tiles with at least this many query rows run q k^T through the gemm
// kernel (on k^T packed once per head and thread); smaller ones (a decode step) one row at a time
// through row_times_transposed, which reads k in place. The generic level uses Eigen's GEMM.
inline constexpr Index kKernelScoreRows = 16;

// m = 0, row by row with memset (the C library's, tuned for the CPU it runs on whatever this code
// is compiled for; Eigen's setZero would use the vector width of the consumer's flags).
template <class T>
void zero_rows(MatrixRef<T>& m) {
  for (Index i = 0; i < m.rows(); ++i)
    std::memset(m.row(i).data(), 0, static_cast<std::size_t>(m.cols()) * sizeof(T));
}

// Rows [r0, r0 + nb) of one head (nb <= kAttentionRowBlock): the row tile's scores cover only
// the keys its last row can see. Shapes as in causal_attention_head, already checked; scratch has
// room for k.rows() keys. Writes out's rows r0 .. r0 + nb - 1 (and probs' when not null).
template <class T>
void attention_row_tile(const ConstMatrixRef<T>& q, const ConstMatrixRef<T>& k,
                        const ConstMatrixRef<T>& v, Index r0, Index nb, MatrixRef<T>& out,
                        MatrixRef<T>* probs, AttentionScratch<T>& scratch) {
  const Index T_ = q.rows(), head_dim = q.cols(), n_keys = k.rows(), n_past = n_keys - T_;
  const Index n_visible = n_past + r0 + nb;  // keys seen by the tile's last row
  const T scale = T(1) / std::sqrt(T(head_dim));
  MatrixRef<T> att = scratch.scores.topLeftCorner(nb, n_visible);

  // att = softmax(q_tile k_visible^T / sqrt(head_dim)), row i seeing keys 0 .. n_past + r0 + i
  if (const kernels::FloatKernels* kern = vector_kernels<T>()) {
    if constexpr (std::is_same<T, float>::value) {
      if (nb >= kKernelScoreRows) {  // the GEMM accumulates into att: zeroed first
        zero_rows<T>(att);
        if (scratch.packed_keys != k.data() || scratch.packed_rows < n_visible) {
          scratch.keys_t.topLeftCorner(head_dim, n_visible) = k.topRows(n_visible).transpose();
          scratch.packed_keys = k.data();
          scratch.packed_rows = n_visible;
        }
        kern->gemm(nb, n_visible, head_dim, q.data() + r0 * q.outerStride(), q.outerStride(),
                   scratch.keys_t.data(), scratch.keys_t.outerStride(), att.data(),
                   att.outerStride(), scratch.scores_gemm.packed_b());
      } else {  // a few rows (a decode step): one row at a time, each key row read in place
        for (Index i = 0; i < nb; ++i)
          kern->row_times_transposed(n_visible, head_dim, q.data() + (r0 + i) * q.outerStride(),
                                     k.data(), k.outerStride(), &att(i, 0));
      }
      for (Index i = 0; i < nb; ++i)
        kern->softmax_row(&att(i, 0), n_past + r0 + i + 1, n_visible, scale);
    }
  } else {
    att.setZero();
    gemm_accumulate<T>(scale, q.middleRows(r0, nb), k.topRows(n_visible), Op::Transpose, att,
                       scratch.scores_gemm);
    for (Index i = 0; i < nb; ++i) causal_softmax_row<T>(&att(i, 0), n_past + r0 + i + 1, n_visible);
  }
  // y_tile = att v_visible. The tile's rows see different numbers of its own keys; where they do
  // not see one, att holds an exact 0, and 0 times a finite value changes no sum, so one product
  // over all n_visible keys is exact. But 0 times a NaN or Inf value is NaN: if the tile's own
  // values hold one, the keys before the tile (seen by every row) go in one product, and each row
  // then takes only its visible own keys base .. base + i.
  const Index base = n_past + r0;
  MatrixRef<T> y = out.middleRows(r0, nb);
  zero_rows<T>(y);
  if (v.middleRows(base, nb).allFinite()) {
    gemm_accumulate<T>(T(1), att, v.topRows(n_visible), Op::None, y, scratch.values_gemm);
  } else {
    gemm_accumulate<T>(T(1), att.leftCols(base), v.topRows(base), Op::None, y,
                       scratch.values_gemm);
    for (Index i = 0; i < nb; ++i)
      gemm_accumulate<T>(T(1), att.block(i, base, 1, i + 1), v.middleRows(base, i + 1), Op::None,
                         y.row(i), scratch.values_gemm);
  }

  if (probs) {
    probs->middleRows(r0, nb).leftCols(n_visible) = att;
    probs->middleRows(r0, nb).rightCols(n_keys - n_visible).setZero();
  }
}

// Row tiles of a head with n_query query rows.
inline Index attention_row_tiles(Index n_query) {
  return (n_query + kAttentionRowBlock - 1) / kAttentionRowBlock;
}

// Every check of one head's call: shapes and overlaps. probs is null when not requested.
template <class T>
void check_attention_head(const ConstMatrixRef<T>& q, const ConstMatrixRef<T>& k,
                          const ConstMatrixRef<T>& v, const MatrixRef<T>& out,
                          const MatrixRef<T>* probs) {
  const Index T_ = q.rows(), head_dim = q.cols(), n_keys = k.rows();
  check_attention_shapes(T_, n_keys, head_dim, k.rows(), k.cols(), v.rows(), v.cols(),
                         out.rows(), out.cols());
  if (probs) check_shape("probs", {T_, n_keys}, {probs->rows(), probs->cols()});
  if (overlaps(out, q) || overlaps(out, k) || overlaps(out, v))
    throw ShapeError("out: must not overlap q, k or v");
  if (probs && (overlaps(*probs, q) || overlaps(*probs, k) || overlaps(*probs, v) ||
                overlaps(*probs, out)))
    throw ShapeError("probs: must not overlap q, k, v or out");
}

// Shared body of the two public overloads; `probs` is null when not requested.
template <class T>
void causal_attention_head(const ConstMatrixRef<T>& q, const ConstMatrixRef<T>& k,
                           const ConstMatrixRef<T>& v, MatrixRef<T>& out, MatrixRef<T>* probs,
                           AttentionScratch<T>& scratch) {
  check_attention_head<T>(q, k, v, out, probs);
  const Index T_ = q.rows();
  if (T_ == 0) return;
  scratch.reserve(k.rows(), q.cols());
  scratch.forget_packed_keys();
  for (Index r0 = 0; r0 < T_; r0 += kAttentionRowBlock)
    attention_row_tile<T>(q, k, v, r0, std::min(kAttentionRowBlock, T_ - r0), out, probs, scratch);
}

}  // namespace detail

// One head of causal self-attention.
//   q [T, head_dim], k [n_past + T, head_dim], v [n_past + T, head_dim] (read; row-major views,
//   e.g. q_view/k_view/v_view of a qkv matrix)
//   out [T, head_dim] (written; e.g. head h's slot in the merged matrix, see head_slot)
// PyTorch: F.softmax((q @ k.T / sqrt(head_dim)).masked_fill(~causal, -inf), -1) @ v
template <class T, class DQ, class DK, class DV>
void causal_attention_head(const Eigen::MatrixBase<DQ>& q, const Eigen::MatrixBase<DK>& k,
                           const Eigen::MatrixBase<DV>& v, MatrixRef<T> out,
                           AttentionScratch<T>& scratch) {
  detail::causal_attention_head<T>(detail::as_view<T>(q), detail::as_view<T>(k),
                                   detail::as_view<T>(v), out, nullptr, scratch);
}

// Same, also writing the attention probabilities.
//   probs [T, n_past + T] (written): row i holds softmax weights over keys 0 .. n_past + i and
//   exact zeros after them.
template <class T, class DQ, class DK, class DV>
void causal_attention_head(const Eigen::MatrixBase<DQ>& q, const Eigen::MatrixBase<DK>& k,
                           const Eigen::MatrixBase<DV>& v, MatrixRef<T> out, MatrixRef<T> probs,
                           AttentionScratch<T>& scratch) {
  detail::causal_attention_head<T>(detail::as_view<T>(q), detail::as_view<T>(k),
                                   detail::as_view<T>(v), out, &probs, scratch);
}

}  // namespace gpt2

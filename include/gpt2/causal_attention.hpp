// Step 3 of the sublayer: causal attention of one head, as a function of its own.
//
//   att = softmax(q k^T / sqrt(head_dim), causal) ; y = att v
//
// q [T, head_dim] are the queries of the last T positions of a sequence whose first n_past
// positions come before them; k, v [n_past + T, head_dim] hold all its keys and values. Query row i
// (position n_past + i) sees keys 0 .. n_past + i (bottom-right-aligned causal mask, as Hugging Face
// applies it with past_key_values). With n_past = 0 this is the plain causal mask.
//
// The output comes from the fused core (kernels/attention_tile.hpp: an online softmax over 64-key
// blocks, O(tile x head_dim) scratch whatever the number of keys; a row gives the same bits in any
// tile, chunk, batch or thread count). The probabilities, when asked for, come from score rows key
// by key (asking for them never changes the output).
#pragma once

#include <algorithm>
#include <string>

#include "gpt2/detail/pipeline.hpp"
#include "gpt2/error.hpp"
#include "gpt2/kernels/generic.hpp"
#include "gpt2/kernels/levels.hpp"
#include "gpt2/types.hpp"
#include "gpt2/workspace.hpp"

namespace gpt2 {

// Query rows per tile of the fused core (the amx level's bf16 core takes more: kernels/table.hpp).
inline constexpr Index kAttentionRowBlock = kernels::kTileMaxRows;

// max(-inf, row[0], ..., row[n-1]); NaN if any entry is NaN.
using kernels::generic::running_max;

// In place: row[0 .. n) = softmax(row[0 .. n)), row[n .. n_keys) = 0, 1 <= n <= n_keys.
// The running max starts at minus infinity (never a finite sentinel), so logits of any size work.
template <class T>
void causal_softmax_row(T* row, Index n, Index n_keys) {
  kernels::generic::softmax_row<T>(row, n, n_keys);
}

namespace detail {

// Every check of one head's call: shapes and overlaps. probs is null when not requested.
template <class T>
void check_attention_head(const ConstMatrixRef<T>& q, const ConstMatrixRef<T>& k,
                          const ConstMatrixRef<T>& v, const MatrixRef<T>& out,
                          const MatrixRef<T>* probs) {
  const Index T_ = q.rows(), head_dim = q.cols(), n_keys = k.rows();
  check_shape("k", {n_keys, head_dim}, {k.rows(), k.cols()});
  check_shape("v", {n_keys, head_dim}, {v.rows(), v.cols()});
  check_shape("out", {T_, head_dim}, {out.rows(), out.cols()});
  if (n_keys < T_)
    throw ShapeError("k: expected at least as many rows as q (" + std::to_string(T_) + "), got " +
                     std::to_string(n_keys));
  if (probs) check_shape("probs", {T_, n_keys}, {probs->rows(), probs->cols()});
  if (overlaps(out, q) || overlaps(out, k) || overlaps(out, v))
    throw ShapeError("out: must not overlap q, k or v");
  if (probs && (overlaps(*probs, q) || overlaps(*probs, k) || overlaps(*probs, v) ||
                overlaps(*probs, out)))
    throw ShapeError("probs: must not overlap q, k, v or out");
}

// One head over pages, checked: tiles of kTileMaxRows rows, and the probabilities when probs is
// not null.
template <class T, class E>
void attend_head(const ConstMatrixRef<T>& q, const HeadPages<E>& kv, MatrixRef<T>& out,
                 MatrixRef<T>* probs, AttentionScratch<T>& scratch) {
  const kernels::Kernels<T>& k = kernels::table<T>();
  const Index T_ = q.rows();
  if (T_ == 0) return;
  if (probs) scratch.reserve_probabilities(kv.n_keys, q.cols());
  for (Index r0 = 0; r0 < T_; r0 += kernels::kTileMaxRows) {
    const Index nb = std::min(kernels::kTileMaxRows, T_ - r0);
    attend_rows<T, E>(k, q, kv, r0, nb, out, scratch);
    if (probs) probability_rows<T, E>(k, q, kv, r0, nb, *probs, scratch);
  }
}

// k, v [n_keys, head_dim] as one page each (their strides may differ); `pages` holds the two
// page pointers, and must outlive the result.
template <class T>
HeadPages<T> one_page(const ConstMatrixRef<T>& k, const ConstMatrixRef<T>& v,
                      const T* (&pages)[2]) {
  pages[0] = k.data();
  pages[1] = v.data();
  HeadPages<T> kv;
  kv.key_pages = &pages[0];
  kv.value_pages = &pages[1];
  kv.page_rows = std::max<Index>(k.rows(), 1);
  kv.row_stride = k.outerStride();
  kv.value_stride = v.outerStride();
  kv.n_keys = k.rows();
  kv.head_dim = k.cols();
  return kv;
}

template <class T>
void causal_attention_head(const ConstMatrixRef<T>& q, const ConstMatrixRef<T>& k,
                           const ConstMatrixRef<T>& v, MatrixRef<T>& out, MatrixRef<T>* probs,
                           AttentionScratch<T>& scratch) {
  check_attention_head<T>(q, k, v, out, probs);
  const T* pages[2];
  attend_head<T, T>(q, one_page<T>(k, v, pages), out, probs, scratch);
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

// One head over keys and values held in pages (HeadPages<E>: float or double pages of T, or bf16
// bits for a float q), with or without probabilities (probs null: none).
//   q [T, head_dim] (read; positions kv.n_keys - T .. kv.n_keys - 1), out [T, head_dim] (written),
//   probs [T, kv.n_keys]. Bitwise what the contiguous overload gives for the same keys and values
//   at the same kernel level.
template <class T, class E>
void causal_attention_head(const ConstMatrixRef<T>& q, const HeadPages<E>& kv, MatrixRef<T> out,
                           AttentionScratch<T>& scratch, MatrixRef<T>* probs = nullptr) {
  const Index T_ = q.rows(), head_dim = q.cols();
  detail::check_shape("out", {T_, head_dim}, {out.rows(), out.cols()});
  if (probs) detail::check_shape("probs", {T_, kv.n_keys}, {probs->rows(), probs->cols()});
  if (kv.head_dim != head_dim)
    throw ShapeError("kv: expected head_dim " + std::to_string(head_dim) + " (q's), got " +
                     std::to_string(kv.head_dim));
  if (kv.n_keys < T_)
    throw ShapeError("kv: expected at least as many keys as q has rows (" + std::to_string(T_) +
                     "), got " + std::to_string(kv.n_keys));
  if (T_ == 0) return;
  if (kv.key_pages == nullptr || kv.value_pages == nullptr)
    throw ShapeError("kv: the page tables must not be null");
  if (kv.page_rows <= 0 ||
      (kv.page_rows < kv.n_keys && kv.page_rows % kernels::kPageRowsAlign != 0))
    throw ShapeError("kv: expected page_rows a multiple of " +
                     std::to_string(kernels::kPageRowsAlign) + " or at least n_keys (" +
                     std::to_string(kv.n_keys) + "), got " + std::to_string(kv.page_rows));
  if (kv.row_stride < head_dim || (kv.value_stride != 0 && kv.value_stride < head_dim))
    throw ShapeError("kv: expected row_stride at least head_dim (" + std::to_string(head_dim) +
                     "), got " + std::to_string(kv.row_stride));
  detail::attend_head<T, E>(q, kv, out, probs, scratch);
}

}  // namespace gpt2

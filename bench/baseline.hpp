// The straightforward Eigen implementation of the sublayer, kept as the speed baseline: plain
// Eigen products, a materialized T x T score matrix per head, a per-head loop. Correct (checked by
// test_bench_baseline), allocates freely, no tiling, no reuse of scratch.
#pragma once

#include <cmath>
#include <limits>

#include "gpt2/weights.hpp"

namespace gpt2::bench {

// out = attention(x) for x [T, C]; returns out [T, C].
template <class T>
RowMatrix<T> baseline_attention(const AttentionWeights<T>& w, const RowMatrix<T>& x) {
  const Index T_ = x.rows(), C = w.n_embd(), hd = w.head_dim();
  RowMatrix<T> qkv = x * w.c_attn_weight();
  qkv.rowwise() += w.c_attn_bias();
  RowMatrix<T> merged(T_, C);
  for (Index h = 0; h < w.n_head(); ++h) {
    RowMatrix<T> att = qkv.middleCols(h * hd, hd) * qkv.middleCols(C + h * hd, hd).transpose();
    att *= T(1) / std::sqrt(T(hd));
    for (Index t = 0; t < T_; ++t) {
      att.row(t).tail(T_ - t - 1).setConstant(-std::numeric_limits<T>::infinity());
      att.row(t) = (att.row(t).array() - att.row(t).maxCoeff()).exp();
      att.row(t) /= att.row(t).sum();
    }
    merged.middleCols(h * hd, hd) = att * qkv.middleCols(2 * C + h * hd, hd);
  }
  RowMatrix<T> out = merged * w.c_proj_weight();
  out.rowwise() += w.c_proj_bias();
  return out;
}

// One decode step the straightforward way: the new token's keys and values are written to row
// n_past of K, V [capacity, C] (all heads side by side, as in qkv), then each head attends to rows
// 0 .. n_past. x [1, C]; returns out [1, C]. Allocates freely.
template <class T>
RowMatrix<T> baseline_decode_step(const AttentionWeights<T>& w, const RowMatrix<T>& x,
                                  RowMatrix<T>& K, RowMatrix<T>& V, Index n_past) {
  const Index C = w.n_embd(), hd = w.head_dim(), n_keys = n_past + 1;
  RowMatrix<T> qkv = x * w.c_attn_weight();
  qkv += w.c_attn_bias();
  K.row(n_past) = qkv.middleCols(C, C);
  V.row(n_past) = qkv.middleCols(2 * C, C);
  RowMatrix<T> merged(1, C);
  for (Index h = 0; h < w.n_head(); ++h) {
    RowMatrix<T> att = qkv.middleCols(h * hd, hd) * K.topRows(n_keys).middleCols(h * hd, hd).transpose();
    att *= T(1) / std::sqrt(T(hd));
    att = (att.array() - att.maxCoeff()).exp();
    att /= att.sum();
    merged.middleCols(h * hd, hd) = att * V.topRows(n_keys).middleCols(h * hd, hd);
  }
  RowMatrix<T> out = merged * w.c_proj_weight();
  out += w.c_proj_bias();
  return out;
}

}  // namespace gpt2::bench

// Step 1 and 2 of the sublayer: the fused QKV projection and the per-head views into its output.
//
//   qkv = x @ c_attn.weight + c_attn.bias          x [T, C], c_attn.weight [C, 3C] -> qkv [T, 3C]
//
//   columns of qkv:  [ q: all heads (C) | k: all heads (C) | v: all heads (C) ]
//                    0                  C                  2C                 3C
//   head h:          q at h*head_dim,  k at C + h*head_dim,  v at 2C + h*head_dim
//
// Three contiguous C-blocks, NOT n_head interleaved [q k v] chunks of 3*head_dim.
#pragma once

#include <string>

#include "gpt2/config.hpp"
#include "gpt2/detail/pipeline.hpp"
#include "gpt2/error.hpp"
#include "gpt2/kernels/levels.hpp"
#include "gpt2/types.hpp"
#include "gpt2/weights.hpp"

namespace gpt2 {

// qkv = x @ c_attn.weight + c_attn.bias
//   x [T, C] (read; a row-major matrix or view), qkv [T, 3C] (written; caller-owned storage that
//   must not overlap x)
// PyTorch: torch.addmm(c_attn.bias, x, c_attn.weight)
// `gemm` holds the packing buffers; pass the workspace's to make the call allocation-free. Reads
// the packed copy of c_attn.weight where the level reads it (pack_weights, gemm.hpp).
template <class T, class D>
void qkv_projection(const AttentionWeights<T>& w, const Eigen::MatrixBase<D>& x_in,
                    MatrixRef<T> qkv, GemmScratch<T>& gemm) {
  const ConstMatrixRef<T> x = detail::as_view<T>(x_in);
  const Index C = w.n_embd(), T_ = x.rows();
  detail::check_shape("x", {T_, C}, {x.rows(), x.cols()});
  detail::check_shape("qkv", {T_, 3 * C}, {qkv.rows(), qkv.cols()});
  if (detail::overlaps(qkv, x)) throw ShapeError("qkv: must not overlap x");
  detail::checked_projection<T>(x, w.c_attn_weight(), w.packed_c_attn_weight(), w.c_attn_bias(), 0,
                                3 * C, qkv, gemm);
}

// Same, with a one-off GemmScratch (allocates).
template <class T, class D>
void qkv_projection(const AttentionWeights<T>& w, const Eigen::MatrixBase<D>& x, MatrixRef<T> qkv) {
  GemmScratch<T> gemm;
  qkv_projection<T>(w, x, qkv, gemm);
}

// Which of the three blocks of qkv a head view reads.
enum class QkvPart { q = 0, k = 1, v = 2 };

// head_view(qkv, config, part, h): zero-copy view of head h's q, k or v.
//   qkv [T, 3C] (a row-major matrix or view) -> [T, head_dim], the columns
//   part*C + h*head_dim ... + head_dim. The view points into qkv (no copy) and is valid while
//   qkv's storage is; temporaries are rejected at compile time.
// PyTorch (HF): qkv.split(C, dim=-1)[part].view(T, n_head, head_dim)[:, h, :]
template <class D>
ConstMatrixRef<typename D::Scalar> head_view(const Eigen::MatrixBase<D>& qkv,
                                             const AttentionConfig& config, QkvPart part, Index h) {
  detail::check_head(config, h);
  const Index C = config.n_embd, hd = config.head_dim();
  detail::check_shape("qkv", {qkv.rows(), 3 * C}, {qkv.rows(), qkv.cols()});
  return detail::as_view<typename D::Scalar>(
      qkv.derived().middleCols(static_cast<Index>(part) * C + h * hd, hd));
}
template <class T>
ConstMatrixRef<T> head_view(RowMatrix<T>&&, const AttentionConfig&, QkvPart, Index) = delete;

// q of head h: qkv[:, h*head_dim : (h+1)*head_dim]                  [T, head_dim], a view
template <class D>
ConstMatrixRef<typename D::Scalar> q_view(const Eigen::MatrixBase<D>& qkv,
                                          const AttentionConfig& config, Index h) {
  return head_view(qkv, config, QkvPart::q, h);
}

// k of head h: qkv[:, C + h*head_dim : C + (h+1)*head_dim]          [T, head_dim], a view
template <class D>
ConstMatrixRef<typename D::Scalar> k_view(const Eigen::MatrixBase<D>& qkv,
                                          const AttentionConfig& config, Index h) {
  return head_view(qkv, config, QkvPart::k, h);
}

// v of head h: qkv[:, 2C + h*head_dim : 2C + (h+1)*head_dim]        [T, head_dim], a view
template <class D>
ConstMatrixRef<typename D::Scalar> v_view(const Eigen::MatrixBase<D>& qkv,
                                          const AttentionConfig& config, Index h) {
  return head_view(qkv, config, QkvPart::v, h);
}

// Views of temporaries would dangle.
template <class T>
ConstMatrixRef<T> q_view(RowMatrix<T>&&, const AttentionConfig&, Index) = delete;
template <class T>
ConstMatrixRef<T> k_view(RowMatrix<T>&&, const AttentionConfig&, Index) = delete;
template <class T>
ConstMatrixRef<T> v_view(RowMatrix<T>&&, const AttentionConfig&, Index) = delete;

}  // namespace gpt2

// Steps 4 and 5 of the sublayer: merge the heads, then the output projection.
//
//   merged[:, h*head_dim : (h+1)*head_dim] = y_h         (head h's output)   merged [T, C]
//   out = merged @ c_proj.weight + c_proj.bias            c_proj.weight [C, C] -> out [T, C]
#pragma once

#include <string>
#include <vector>

#include "gpt2/config.hpp"
#include "gpt2/detail/pipeline.hpp"
#include "gpt2/error.hpp"
#include "gpt2/kernels/levels.hpp"
#include "gpt2/types.hpp"
#include "gpt2/weights.hpp"

namespace gpt2 {

// head_slot(merged, config, h): writable zero-copy view of head h's columns of the merged matrix.
//   merged [T, C] (a writable row-major matrix or view) -> [T, head_dim], the columns
//   h*head_dim ... + head_dim. causal_attention_head writes straight into it, so the merge costs
//   no copy. Const matrices and temporaries are rejected at compile time.
// PyTorch (HF _merge_heads): merged.view(T, n_head, head_dim)[:, h, :]
template <class D>
MatrixRef<typename D::Scalar> head_slot(Eigen::MatrixBase<D>& merged, const AttentionConfig& config,
                                        Index h) {
  detail::check_head(config, h);
  detail::check_shape("merged", {merged.rows(), config.n_embd}, {merged.rows(), merged.cols()});
  return merged.derived().middleCols(h * config.head_dim(), config.head_dim());
}

// Same, for a view passed as a temporary (e.g. `ws.merged.topRows(T)`): it still points at
// lasting storage.
template <class D>
MatrixRef<typename D::Scalar> head_slot(Eigen::MatrixBase<D>&& merged, const AttentionConfig& config,
                                        Index h) {
  return head_slot(merged, config, h);
}

// A slot of a temporary matrix would dangle.
template <class T>
MatrixRef<T> head_slot(RowMatrix<T>&&, const AttentionConfig&, Index) = delete;

// merged = concat(heads, dim=1): copies n_head separate head outputs into their slots.
//   heads: n_head matrices [T, head_dim] (read), merged [T, C] (written)
// PyTorch: torch.cat(heads, dim=-1)
// Only needed when the heads were computed into separate buffers; attention_forward writes each
// head into its slot directly.
template <class T>
void merge_heads(const std::vector<RowMatrix<T>>& heads, const AttentionConfig& config,
                 MatrixRef<T> merged) {
  config.validate();
  const Index C = config.n_embd, hd = config.head_dim(), T_ = merged.rows();
  detail::check_shape("merged", {T_, C}, {merged.rows(), merged.cols()});
  if (static_cast<Index>(heads.size()) != config.n_head)
    throw ShapeError("heads: expected " + std::to_string(config.n_head) + " head outputs, got " +
                     std::to_string(heads.size()));
  for (Index h = 0; h < config.n_head; ++h) {
    const RowMatrix<T>& y = heads[static_cast<std::size_t>(h)];
    detail::check_shape("heads[" + std::to_string(h) + "]", {T_, hd}, {y.rows(), y.cols()});
    merged.middleCols(h * hd, hd) = y;
  }
}

// out = merged @ c_proj.weight + c_proj.bias
//   merged [T, C] (read; a row-major matrix or view), out [T, C] (written; must not overlap merged)
// PyTorch: torch.addmm(c_proj.bias, merged, c_proj.weight)
template <class T, class D>
void output_projection(const AttentionWeights<T>& w, const Eigen::MatrixBase<D>& merged_in,
                       MatrixRef<T> out, GemmScratch<T>& gemm) {
  const ConstMatrixRef<T> merged = detail::as_view<T>(merged_in);
  const Index C = w.n_embd(), T_ = merged.rows();
  detail::check_shape("merged", {T_, C}, {merged.rows(), merged.cols()});
  detail::check_shape("out", {T_, C}, {out.rows(), out.cols()});
  if (detail::overlaps(out, merged)) throw ShapeError("out: must not overlap merged");
  detail::checked_projection<T>(merged, w.c_proj_weight(), w.packed_c_proj_weight(),
                                w.c_proj_bias(), 0, C, out, gemm);
}

// Same, with a one-off GemmScratch (allocates).
template <class T, class D>
void output_projection(const AttentionWeights<T>& w, const Eigen::MatrixBase<D>& merged,
                       MatrixRef<T> out) {
  GemmScratch<T> gemm;
  output_projection<T>(w, merged, out, gemm);
}

}  // namespace gpt2

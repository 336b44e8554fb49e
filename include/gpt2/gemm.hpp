// Products into preallocated storage, all row-major, run by the active kernel level
// (kernels/table.hpp), with their packing buffers in a GemmScratch so that repeated calls allocate
// nothing (a plain `C.noalias() += A * B` allocates Eigen's packing buffers on every call):
//   gemm_accumulate          C[M, N] += alpha A[M, K] op(B)
//   gemm_accumulate_columns  C[M, n] += A B[:, j0 : j0 + n], B a weight with an optional packed copy
//   projection_columns       C[M, n] = bias[j0 : j0 + n] + A B[:, j0 : j0 + n]
#pragma once

#include <Eigen/Core>
#include <string>

#include "gpt2/detail/pipeline.hpp"
#include "gpt2/error.hpp"
#include "gpt2/kernels/levels.hpp"
#include "gpt2/kernels/pack.hpp"
#include "gpt2/types.hpp"

namespace gpt2 {


// C[M, N] += alpha * A[M, K] * op(B)
//   op = None:      B is [K, N]
//   op = Transpose: B is [N, K] and op(B) = B^T (e.g. scores = q k^T without a transposed copy)
//   A, B: row-major views (see detail::as_view); C must not overlap A or B.
// Float with op = None and alpha = 1 runs the level's own product (at the vector levels one chain
// of multiply-adds per element, k in order: the same bits for any M and any split); the rest runs
// Eigen's GEMM (GEMV for one row).
// PyTorch: C.add_(alpha * A @ (B or B.T)). Grows `scratch` if the product does not fit (the only
// allocation); reserve it beforehand for allocation-free calls.
template <class T, class DA, class DB>
void gemm_accumulate(T alpha, const Eigen::MatrixBase<DA>& a, const Eigen::MatrixBase<DB>& b,
                     Op op_b, MatrixRef<T> C, GemmScratch<T>& scratch) {
  const ConstMatrixRef<T> A = detail::as_view<T>(a);
  const ConstMatrixRef<T> B = detail::as_view<T>(b);
  const Index M = A.rows(), K = A.cols();
  const Index N = op_b == Op::None ? B.cols() : B.rows();
  const Index KB = op_b == Op::None ? B.rows() : B.cols();
  detail::check_gemm_shapes(M, K, KB, N, C.rows(), C.cols());
  if (detail::overlaps(C, A) || detail::overlaps(C, B))
    throw ShapeError("gemm: the output C overlaps an input");
  kernels::product<T>(op_b, alpha, M, N, K, A.data(), A.outerStride(), B.data(), B.outerStride(),
                      C.data(), C.outerStride(), scratch);
}

// C[M, n] += A[M, K] * B[:, j0 : j0 + n], B [K, N] given as a row-major view and, optionally, as
// a PackedMatrix copy of it (null: none; j0 then a multiple of 32). Which copy is read is the
// level's choice: a bf16 copy at every level; a float32 copy at the vector levels (bitwise what the
// view gives there); the view otherwise.
// PyTorch: C.add_(A @ B[:, j0:j0+n])
template <class T>
void gemm_accumulate_columns(const ConstMatrixRef<T>& A, const ConstMatrixRef<T>& B,
                             const PackedMatrix* packed, Index j0, Index n, MatrixRef<T> C,
                             GemmScratch<T>& scratch) {
  detail::check_columns<T>(A, B, packed, j0, n, C);
  detail::project_columns<T>(kernels::table<T>(), A, {B.data(), B.outerStride(), packed, nullptr},
                             j0, n, C, scratch);
}

// C[M, n] = bias[j0 : j0 + n] + A[M, K] * B[:, j0 : j0 + n]: a projection's columns (bias [N]),
// with the checks of gemm_accumulate_columns and the bits of writing the bias into C and
// accumulating (a bf16 copy's product writes C once, the bias in its kernels).
// PyTorch: torch.addmm(bias[j0:j0+n], A, B[:, j0:j0+n])
template <class T>
void projection_columns(const ConstMatrixRef<T>& A, const ConstMatrixRef<T>& B,
                        const PackedMatrix* packed, const ConstVectorMap<T>& bias, Index j0,
                        Index n, MatrixRef<T> C, GemmScratch<T>& scratch) {
  detail::checked_projection<T>(A, B, packed, bias, j0, n, C, scratch);
}

}  // namespace gpt2

// Products into preallocated storage, all row-major: C[M, N] += alpha * A[M, K] * op(B), and the
// projections' product on a weight packed once. The math layer calls these; they run the active
// kernel level's float kernels (kernels/dispatch.hpp) and Eigen's GEMM otherwise (the generic
// level, and double), with their packing buffers kept in a GemmScratch so that repeated calls
// allocate nothing. (A plain `C.noalias() += A * B` allocates Eigen's packing buffers on every
// call.)
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "gpt2/error.hpp"
#include "gpt2/kernels/dispatch.hpp"
#include "gpt2/kernels/generic.hpp"
#include "gpt2/kernels/pack.hpp"
#include "gpt2/types.hpp"

namespace gpt2 {

namespace detail {

inline void check_gemm_shapes(Index a_rows, Index a_cols, Index kb, Index n, Index c_rows,
                              Index c_cols) {
  if (kb != a_cols || c_rows != a_rows || c_cols != n)
    throw ShapeError("gemm: expected [M, K] x [K, N] -> [M, N], got A " +
                     shape_string({a_rows, a_cols}) + ", op(B) " + shape_string({kb, n}) + ", C " +
                     shape_string({c_rows, c_cols}));
}

// The vector level's float kernels when T is float and the level has them; null otherwise.
template <class T>
const kernels::FloatKernels* vector_kernels() {
  if constexpr (std::is_same<T, float>::value)
    return kernels::float_kernels();
  else
    return nullptr;
}

}  // namespace detail

// C[M, N] += alpha * A[M, K] * op(B)
// Float with op = None and alpha = 1 (the projections, att v) runs the active level's gemm (at
// avx2 and avx512: one chain of multiply-adds per element, k in order: the same bits for any M and
// any split); the rest runs Eigen's GEMM (GEMV for one row).
//   op = None:      B is [K, N]
//   op = Transpose: B is [N, K] and op(B) = B^T (e.g. scores = q k^T without a transposed copy)
//   A, B: row-major views (see detail::as_view); C must not overlap A or B.
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
  if (M == 0 || N == 0 || K == 0) return;
  if (const kernels::FloatKernels* k = detail::vector_kernels<T>()) {
    if constexpr (std::is_same<T, float>::value) {
      if (op_b == Op::None && alpha == T(1)) {
        k->gemm(M, N, K, A.data(), A.outerStride(), B.data(), B.outerStride(), C.data(),
                C.outerStride(), scratch.packed_b());
        return;
      }
    }
  }
  kernels::generic::gemm<T>(alpha, A, B, op_b, C, scratch);
}

// C[M, n] += A[M, K] * B[:, j0 : j0 + n], B a bf16 weight [K, N] (PackedMatrix with dtype bf16;
// j0 a multiple of 32), at the active level: widened to float32 at generic (through Eigen), avx2
// and avx512; A rounded to bf16 for VDPBF16PS at avx512_bf16 and for AMX tiles at amx. Float32
// accumulation everywhere. Shapes already checked. With bias (the n values for these columns,
// not null): C = bias + A B[:, j0 : j0 + n], the bits of C = bias then C += ..., C not read.
// PyTorch: C.add_(A @ B[:, j0:j0+n].float())   (avx512_bf16, amx: A.bfloat16().float() for A)
inline void gemm_bf16_columns(const ConstMatrixRef<float>& A, const PackedMatrix& B, Index j0,
                              Index n, MatrixRef<float>& C, GemmScratch<float>& scratch,
                              const float* bias = nullptr) {
  const Index M = A.rows(), K = A.cols();
  const std::uint16_t* panels = B.bf16_panels_from(j0);
  if (const kernels::Bf16Gemm gemm = kernels::bf16_gemm(active_isa())) {
    gemm(M, n, K, A.data(), A.outerStride(), panels, B.depth(), C.data(), C.outerStride(),
         scratch.packed_b(), bias);
    return;
  }
  if (bias != nullptr) C.rowwise() = Eigen::Map<const RowVector<float>>(bias, n);
  const Index depth_block = std::min<Index>(kernels::bf16_depth(K), kernels::kPackFloats / kernels::kBf16PanelCols);
  scratch.reserve(M, kernels::kBf16PanelCols, depth_block);
  kernels::generic::gemm_bf16(
      M, n, K, A.data(), A.outerStride(), panels, B.depth(), C.data(), C.outerStride(),
      scratch.packed_b(), kernels::kPackFloats,
      [&scratch](const ConstMatrixRef<float>& a, const ConstMatrixRef<float>& b, MatrixRef<float>& c) {
        kernels::generic::gemm<float>(1.0f, a, b, Op::None, c, scratch);
      });
}

// C[M, n] += A[M, K] * B[:, j0 : j0 + n], B [K, N] given as a row-major view and, optionally, as
// a PackedMatrix copy of it (null: none). A float32 packed copy is read when the active level has
// vector kernels (bitwise what the view gives: the same chains of multiply-adds); the generic
// level, and double, read the view. A bf16 packed copy (float only) is read at every level
// (gemm_bf16_columns): the view is not. j0 is a multiple of kernels::kPanelCols when `packed` is given.
// PyTorch: C.add_(A @ B[:, j0:j0+n])
template <class T>
void gemm_accumulate_columns(const ConstMatrixRef<T>& A, const ConstMatrixRef<T>& B,
                             const PackedMatrix* packed, Index j0, Index n, MatrixRef<T> C,
                             GemmScratch<T>& scratch) {
  // Every check on every path (whatever the level, and whether packed is used there).
  if (j0 < 0 || n < 0 || j0 + n > B.cols())
    throw ShapeError("gemm: columns [" + std::to_string(j0) + ", " + std::to_string(j0 + n) +
                     ") outside B's " + std::to_string(B.cols()));
  detail::check_gemm_shapes(A.rows(), A.cols(), B.rows(), n, C.rows(), C.cols());
  if (packed != nullptr) {
    if (packed->rows() != B.rows() || packed->cols() != B.cols())
      throw ShapeError("packed weight: expected shape " +
                       detail::shape_string({B.rows(), B.cols()}) + ", got " +
                       detail::shape_string({packed->rows(), packed->cols()}));
    if (j0 % kernels::kPanelCols != 0)
      throw ShapeError("packed weight: expected a first column that is a multiple of 32, got " +
                       std::to_string(j0));
  }
  if constexpr (std::is_same<T, float>::value) {
    if (packed != nullptr && packed->dtype() == WeightDtype::bf16) {
      if (detail::overlaps(C, A)) throw ShapeError("gemm: the output C overlaps an input");
      if (A.rows() == 0 || n == 0 || A.cols() == 0) return;
      gemm_bf16_columns(A, *packed, j0, n, C, scratch);
      return;
    }
    const kernels::FloatKernels* k = detail::vector_kernels<T>();
    if (packed != nullptr && k != nullptr) {
      if (detail::overlaps(C, A)) throw ShapeError("gemm: the output C overlaps an input");
      if (A.rows() == 0 || n == 0 || A.cols() == 0) return;
      k->gemm_packed(A.rows(), n, A.cols(), A.data(), A.outerStride(), packed->panels_from(j0),
                     C.data(), C.outerStride());
      return;
    }
  }
  (void)packed;
  gemm_accumulate<T>(T(1), A, B.middleCols(j0, n), Op::None, C, scratch);
}

// C[M, n] = bias[j0 : j0 + n] + A[M, K] * B[:, j0 : j0 + n]: a projection's columns (bias [N]),
// with the same checks as gemm_accumulate_columns and the same bits as writing the bias into C
// and accumulating; a bf16 weight's product writes C once (the bias in its kernels).
// PyTorch: torch.addmm(bias[j0:j0+n], A, B[:, j0:j0+n])
template <class T>
void projection_columns(const ConstMatrixRef<T>& A, const ConstMatrixRef<T>& B,
                        const PackedMatrix* packed, const ConstVectorMap<T>& bias, Index j0,
                        Index n, MatrixRef<T> C, GemmScratch<T>& scratch) {
  if (j0 < 0 || n < 0 || j0 + n > bias.size())
    throw ShapeError("projection: columns [" + std::to_string(j0) + ", " + std::to_string(j0 + n) +
                     ") outside the bias's " + std::to_string(bias.size()));
  if constexpr (std::is_same<T, float>::value) {
    if (packed != nullptr && packed->dtype() == WeightDtype::bf16 && B.rows() == packed->rows() &&
        B.cols() == packed->cols() && j0 % kernels::kBf16PanelCols == 0 && j0 + n <= B.cols()) {
      detail::check_gemm_shapes(A.rows(), A.cols(), B.rows(), n, C.rows(), C.cols());
      if (detail::overlaps(C, A)) throw ShapeError("gemm: the output C overlaps an input");
      if (A.rows() == 0 || n == 0) return;
      if (A.cols() == 0) {
        C.rowwise() = bias.segment(j0, n);
        return;
      }
      gemm_bf16_columns(A, *packed, j0, n, C, scratch, bias.data() + j0);
      return;
    }
  }
  C.rowwise() = bias.segment(j0, n);
  gemm_accumulate_columns<T>(A, B, packed, j0, n, C, scratch);
}

}  // namespace gpt2

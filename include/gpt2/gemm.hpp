// GEMM into preallocated storage: C[M, N] (+)= alpha * A[M, K] * op(B), all row-major, with the
// packing buffers of Eigen's GEMM kept in a GemmScratch so that repeated calls allocate nothing.
// (A plain `C.noalias() += A * B` allocates Eigen's packing buffers on every call.)
#pragma once

#include <Eigen/Core>
#include <memory>

#include "gpt2/error.hpp"
#include "gpt2/types.hpp"

namespace gpt2 {

// Packing buffers for products with at most max_m rows, max_n columns and depth max_k.
// Not thread-safe: one GemmScratch per thread.
template <class T>
class GemmScratch {
 public:
  using Blocking = Eigen::internal::gemm_blocking_space<Eigen::RowMajor, T, T, Eigen::Dynamic,
                                                        Eigen::Dynamic, Eigen::Dynamic, 1, false>;

  GemmScratch() = default;
  GemmScratch(Index max_m, Index max_n, Index max_k) { reserve(max_m, max_n, max_k); }

  // Grows the buffers to fit an [max_m, max_k] x [max_k, max_n] product (allocates only when
  // they grow; a smaller request keeps the current buffers).
  void reserve(Index max_m, Index max_n, Index max_k) {
    if (fits(max_m, max_n, max_k)) return;
    max_m_ = std::max(max_m, max_m_);
    max_n_ = std::max(max_n, max_n_);
    max_k_ = std::max(max_k, max_k_);
    blocking_ = std::make_unique<Blocking>(max_m_, max_n_, max_k_, 1, true);
    blocking_->allocateAll();
  }

  bool fits(Index m, Index n, Index k) const {
    return blocking_ != nullptr && m <= max_m_ && n <= max_n_ && k <= max_k_;
  }

  Blocking& blocking() { return *blocking_; }

 private:
  std::unique_ptr<Blocking> blocking_;
  Index max_m_ = 0, max_n_ = 0, max_k_ = 0;
};

enum class Op { None, Transpose };

// C[M, N] += alpha * A[M, K] * op(B)
//   op = None:      B is [K, N]
//   op = Transpose: B is [N, K] and op(B) = B^T (e.g. scores = q k^T without a transposed copy)
// PyTorch: C.add_(alpha * A @ (B or B.T)). Grows `scratch` if the product does not fit (the only
// allocation); reserve it beforehand for allocation-free calls.
template <class T>
void gemm_accumulate(T alpha, const ConstMatrixRef<T>& A, const ConstMatrixRef<T>& B, Op op_b,
                     MatrixRef<T> C, GemmScratch<T>& scratch) {
  using Eigen::ColMajor;
  using Eigen::RowMajor;
  const Index M = A.rows(), K = A.cols();
  const Index N = op_b == Op::None ? B.cols() : B.rows();
  const Index KB = op_b == Op::None ? B.rows() : B.cols();
  if (KB != K || C.rows() != M || C.cols() != N)
    throw ShapeError("gemm: expected [M, K] x [K, N] -> [M, N], got A " +
                     detail::shape_string({A.rows(), A.cols()}) + ", op(B) " +
                     detail::shape_string({KB, N}) + ", C " +
                     detail::shape_string({C.rows(), C.cols()}));
  if (M == 0 || N == 0 || K == 0) return;
  scratch.reserve(M, N, K);
  if (op_b == Op::None) {
    Eigen::internal::general_matrix_matrix_product<Index, T, RowMajor, false, T, RowMajor, false,
                                                   RowMajor, 1>::run(M, N, K, A.data(),
                                                                     A.outerStride(), B.data(),
                                                                     B.outerStride(), C.data(), 1,
                                                                     C.outerStride(), alpha,
                                                                     scratch.blocking(), nullptr);
  } else {
    Eigen::internal::general_matrix_matrix_product<Index, T, RowMajor, false, T, ColMajor, false,
                                                   RowMajor, 1>::run(M, N, K, A.data(),
                                                                     A.outerStride(), B.data(),
                                                                     B.outerStride(), C.data(), 1,
                                                                     C.outerStride(), alpha,
                                                                     scratch.blocking(), nullptr);
  }
}

}  // namespace gpt2

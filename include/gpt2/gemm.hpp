// GEMM into preallocated storage: C[M, N] += alpha * A[M, K] * op(B), all row-major, with the
// packing buffers of Eigen's GEMM kept in a GemmScratch so that repeated calls allocate nothing.
// (A plain `C.noalias() += A * B` allocates Eigen's packing buffers on every call.)
//
// This calls Eigen's internal GEMM driver (general_matrix_matrix_product and gemm_blocking_space),
// whose interface is stable across the 3.4 series but not public: hence the version check.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <memory>
#include <type_traits>

#include "gpt2/error.hpp"
#include "gpt2/gemm_kernel.hpp"
#include "gpt2/types.hpp"

static_assert(EIGEN_VERSION_AT_LEAST(3, 4, 0) && !EIGEN_VERSION_AT_LEAST(3, 4, 90),
              "gpt2/gemm.hpp uses Eigen 3.4's internal GEMM driver: check it before using another "
              "Eigen version");

namespace gpt2 {

// Packing buffers for products with at most max_m rows, max_n columns and depth max_k.
// Not thread-safe: one GemmScratch per thread.
template <class T>
class GemmScratch {
 public:
  using Blocking = Eigen::internal::gemm_blocking_space<Eigen::RowMajor, T, T, Eigen::Dynamic,
                                                        Eigen::Dynamic, Eigen::Dynamic, 1, false>;

  // Empty: grows on the first product. The second form allocates (and owns) packing buffers for
  // products up to [max_m, max_k] x [max_k, max_n] up front.
  GemmScratch() = default;
  GemmScratch(Index max_m, Index max_n, Index max_k) { reserve(max_m, max_n, max_k); }

  // Grows the buffers to fit an [max_m, max_k] x [max_k, max_n] product (allocates only when
  // they grow; a smaller request keeps the current buffers). Strong guarantee: if the allocation
  // throws, the scratch is unchanged.
  void reserve(Index max_m, Index max_n, Index max_k) {
    reserve_packed_b();
    if (fits(max_m, max_n, max_k)) return;
    const Index m = std::max(max_m, max_m_), n = std::max(max_n, max_n_), k = std::max(max_k, max_k_);
    auto blocking = std::make_unique<Blocking>(m, n, k, 1, true);
    blocking->allocateAll();
    blocking_ = std::move(blocking);
    max_m_ = m;
    max_n_ = n;
    max_k_ = k;
  }

  // Whether an [m, k] x [k, n] product runs without growing the buffers.
  bool fits(Index m, Index n, Index k) const {
    return blocking_ != nullptr && m <= max_m_ && n <= max_n_ && k <= max_k_;
  }

  // Eigen's blocking object over the buffers (owned by this scratch; valid until it grows).
  // Precondition: the scratch has been reserved (fits() for some size).
  Blocking& blocking() { return *blocking_; }

  // Bytes of the packing buffers held.
  Index bytes() const {
    const Index packed = packed_b_.size() * static_cast<Index>(sizeof(T));
    if (!blocking_) return packed;
    Blocking& b = *blocking_;
    return packed + (b.mc() * b.kc() + b.kc() * b.nc()) * static_cast<Index>(sizeof(T));
  }

  // The AVX-512 float kernel's buffer for B's blocks (gemm_kernel.hpp: kPackedSize floats, 64-byte
  // aligned), allocated by reserve() or here on first use. Empty for other types and builds.
  T* packed_b() {
    reserve_packed_b();
    return packed_b_.data();
  }

 private:
  void reserve_packed_b() {
#if GPT2_ATTENTION_AVX512_GEMM
    if (std::is_same<T, float>::value && packed_b_.size() == 0) packed_b_.resize(detail::avx512::kPackedSize);
#endif
  }

  std::unique_ptr<Blocking> blocking_;
  Eigen::Matrix<T, Eigen::Dynamic, 1> packed_b_;  // Eigen allocates it aligned for the widest packet
  Index max_m_ = 0, max_n_ = 0, max_k_ = 0;
};

enum class Op { None, Transpose };

namespace detail {

// Eigen's GEMM driver on raw row-major A, B (stored in BOrder), C: C += alpha * A * B.
template <class T, int BOrder>
void run_gemm(Index M, Index N, Index K, T alpha, const ConstMatrixRef<T>& A,
              const ConstMatrixRef<T>& B, MatrixRef<T>& C, GemmScratch<T>& scratch) {
  Eigen::internal::general_matrix_matrix_product<Index, T, Eigen::RowMajor, false, T, BOrder, false,
                                                 Eigen::RowMajor, 1>::run(M, N, K, A.data(),
                                                                          A.outerStride(), B.data(),
                                                                          B.outerStride(), C.data(),
                                                                          1, C.outerStride(), alpha,
                                                                          scratch.blocking(),
                                                                          nullptr);
}

// C[1, N] += alpha * A[1, K] * op(B) with Eigen's matrix-vector kernels (no packing, no
// allocation: every operand is contiguous in its inner dimension).
template <class T>
void run_gemv(T alpha, const ConstMatrixRef<T>& A, const ConstMatrixRef<T>& B, Op op_b,
              MatrixRef<T>& C) {
  using RowVectorMap = Eigen::Map<RowVector<T>>;
  using ConstRowVectorMap = Eigen::Map<const RowVector<T>>;
  RowVectorMap c(C.data(), C.cols());
  const ConstRowVectorMap a(A.data(), A.cols());
  if (op_b == Op::None)
    c.noalias() += alpha * a * B;              // B [K, N]: column-major GEMV on B^T
  else
    c.noalias() += alpha * a * B.transpose();  // B [N, K]: one dot product per row of B
}

}  // namespace detail

// C[M, N] += alpha * A[M, K] * op(B)
// With AVX-512, float, op = None and alpha = 1 run gemm_kernel.hpp's kernel (one chain of
// multiply-adds per element, k in order: the same bits for any M and any split); the rest runs
// Eigen's GEMM (GEMV for one row).
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
  if (KB != K || C.rows() != M || C.cols() != N)
    throw ShapeError("gemm: expected [M, K] x [K, N] -> [M, N], got A " +
                     detail::shape_string({A.rows(), A.cols()}) + ", op(B) " +
                     detail::shape_string({KB, N}) + ", C " +
                     detail::shape_string({C.rows(), C.cols()}));
  if (detail::overlaps(C, A) || detail::overlaps(C, B))
    throw ShapeError("gemm: the output C overlaps an input");
  if (M == 0 || N == 0 || K == 0) return;
#if GPT2_ATTENTION_AVX512_GEMM
  if constexpr (std::is_same<T, float>::value) {
    if (op_b == Op::None && alpha == T(1)) {  // the projections and att v
      detail::avx512::gemm(M, N, K, A.data(), A.outerStride(), B.data(), B.outerStride(), C.data(),
                           C.outerStride(), scratch.packed_b());
      return;
    }
  }
#endif
  if (M == 1) {  // one row (a decode step): Eigen's GEMV streams B once and needs no packing
    detail::run_gemv<T>(alpha, A, B, op_b, C);
    return;
  }
  scratch.reserve(M, N, K);
  if (op_b == Op::None)
    detail::run_gemm<T, Eigen::RowMajor>(M, N, K, alpha, A, B, C, scratch);
  else  // B^T of a row-major [N, K] is a column-major [K, N] with the same stride
    detail::run_gemm<T, Eigen::ColMajor>(M, N, K, alpha, A, B, C, scratch);
}

}  // namespace gpt2
